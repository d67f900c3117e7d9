//! Health-gated workers (`health_check = "/path"`): before a new worker takes requests, and
//! before a reload switches to its pool, corral sends it a GET of that path over the pool's
//! own protocol (FastCGI, SCGI or LSAPI, with the backend client of `src/backend/`) and
//! waits for a 2xx answer, trying again until the worker's `start_timeout` runs out.
//! ARCHITECTURE.md, "Generations and reload".

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::backend::{
    self, BackendConnection, BackendRequest, ExchangeOptions, Protocol, RequestBody, Timeouts,
};
use crate::config::{BackendAddress, HealthCheck};

/// Pause between two checks of a worker that did not pass yet.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// Most body bytes read from one answer (the rest is left: the connection is closed).
const MAX_BODY: usize = 64 * 1024;
/// The `User-Agent` of a check, so an application (or its log) can tell checks apart.
pub const USER_AGENT: &str = "corral-health-check";

/// How one pool checks its new workers.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The pool's name (log fields).
    pub pool: Arc<str>,
    /// What the workers speak.
    pub protocol: Protocol,
    /// As configured.
    pub check: HealthCheck,
    /// The document root of the first context served by the pool, for `SCRIPT_FILENAME`
    /// (php-cgi runs the file the path names there); none for app pools.
    pub root: Option<PathBuf>,
    /// The latest failed check of the pool, for the reload's refusal and the status page.
    pub last_failure: Arc<Mutex<Option<String>>>,
    /// The check is the embedded launcher's own (an app pool without `health_check`): the
    /// request carries `CORRAL_READY_PROBE=1`, which the launcher answers with a 204
    /// without calling the app, once the app is loaded.
    pub launcher: bool,
}

impl Probe {
    /// The implicit check of an `app = ...` pool without `health_check`: its worker is ready
    /// once its launcher answers, that is once the app is imported (a worker whose socket
    /// corral bound accepts connections before it runs at all). One check waits up to
    /// `start_timeout`, since the launcher answers only once its import is done.
    pub fn launcher(pool: Arc<str>, protocol: Protocol, start_timeout: Duration) -> Probe {
        Probe {
            pool,
            protocol,
            check: HealthCheck {
                path: "/".to_owned(),
                timeout: start_timeout,
            },
            root: None,
            last_failure: Arc::default(),
            launcher: true,
        }
    }
}

impl Probe {
    /// The CGI variables of one check: a GET of the path, from and to the loopback.
    fn params(&self) -> Vec<(Bytes, Bytes)> {
        let (path, query) = self
            .check
            .path
            .split_once('?')
            .unwrap_or((&self.check.path, ""));
        let mut params = vec![
            ("GATEWAY_INTERFACE", "CGI/1.1".to_owned()),
            ("SERVER_PROTOCOL", "HTTP/1.1".to_owned()),
            ("SERVER_SOFTWARE", "corral".to_owned()),
            ("REQUEST_METHOD", "GET".to_owned()),
            ("REQUEST_URI", self.check.path.clone()),
            ("QUERY_STRING", query.to_owned()),
            ("SERVER_NAME", "localhost".to_owned()),
            ("SERVER_ADDR", "127.0.0.1".to_owned()),
            ("SERVER_PORT", "0".to_owned()),
            ("REMOTE_ADDR", "127.0.0.1".to_owned()),
            ("REMOTE_PORT", "0".to_owned()),
            ("CONTENT_LENGTH", "0".to_owned()),
            ("HTTP_HOST", "localhost".to_owned()),
            ("HTTP_USER_AGENT", USER_AGENT.to_owned()),
        ];
        if self.launcher {
            params.push(("CORRAL_READY_PROBE", "1".to_owned()));
        }
        // With a document root the path names a script there (php-cgi); without one it is
        // the app's own path (PATH_INFO under an empty SCRIPT_NAME, as at a root mount).
        match &self.root {
            Some(_) => {
                params.push(("SCRIPT_NAME", path.to_owned()));
                params.push(("PATH_INFO", String::new()));
            }
            None => {
                params.push(("SCRIPT_NAME", String::new()));
                params.push(("PATH_INFO", path.to_owned()));
            }
        }
        if let Some(root) = &self.root {
            let root = root.to_string_lossy();
            params.push(("DOCUMENT_ROOT", root.to_string()));
            params.push((
                "SCRIPT_FILENAME",
                format!("{}{path}", root.trim_end_matches('/')),
            ));
        }
        params
            .into_iter()
            .map(|(k, v)| (Bytes::from_static(k.as_bytes()), Bytes::from(v)))
            .collect()
    }

    /// One check of the worker at `address`: `Ok` on a 2xx answer, else why not.
    pub async fn check_once(&self, address: &BackendAddress) -> Result<(), String> {
        let timeout = self.check.timeout;
        let checked = tokio::time::timeout(timeout, async {
            let conn = BackendConnection::connect(address, timeout)
                .await
                .map_err(|e| e.to_string())?;
            let mut options = ExchangeOptions::new(&self.pool, 0);
            options.timeouts = Timeouts {
                connect: timeout,
                first_byte: timeout,
                request: timeout,
            };
            let request = BackendRequest {
                params: self.params(),
                body: RequestBody::empty(),
            };
            let mut response = backend::send(self.protocol, conn, request, &options)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.head.status_code();
            // The answer is read to its end (bounded), so a worker that streams it is not
            // cut off mid-write; what it said is not needed.
            let mut read = 0;
            while read < MAX_BODY {
                match response.body.next_chunk().await {
                    Some(Ok(chunk)) => read += chunk.len(),
                    Some(Err(e)) => return Err(e.to_string()),
                    None => break,
                }
            }
            if (200..300).contains(&status) {
                Ok(())
            } else {
                Err(format!("answered {status}"))
            }
        })
        .await;
        match checked {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within health_timeout ({timeout:?})")),
        }
    }

    /// Checks the worker at `address` until it passes (`Ok`) or `deadline` passes (`Err`
    /// with the last failure, also kept in `last_failure`). `gone` is asked before each
    /// check whether the worker has exited (then the wait ends at once).
    pub async fn until_healthy(
        &self,
        address: &BackendAddress,
        deadline: Instant,
        mut gone: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let mut checks = 0u32;
        loop {
            if gone() {
                return Err("the worker exited during its health check".to_owned());
            }
            checks += 1;
            let why = match self.check_once(address).await {
                Ok(()) => {
                    if self.launcher {
                        tracing::debug!(pool = %self.pool, %address, checks, "worker's launcher answered: its app is loaded");
                    } else {
                        tracing::info!(pool = %self.pool, %address, checks, path = %self.check.path, "worker passed its health check");
                    }
                    return Ok(());
                }
                Err(why) => why,
            };
            tracing::debug!(pool = %self.pool, %address, reason = %why, "health check failed; trying again");
            let failure = if self.launcher {
                format!("its launcher did not answer: {why}")
            } else {
                format!("health check GET {} {why}", self.check.path)
            };
            if let Ok(mut last) = self.last_failure.lock() {
                *last = Some(failure.clone());
            }
            let now = Instant::now();
            if now + RETRY_EVERY >= deadline {
                tracing::warn!(pool = %self.pool, %address, checks, reason = %failure, "worker never passed its check within start_timeout");
                return Err(failure);
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }
}

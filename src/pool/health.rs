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
    ///
    /// A failure is kept in `last_failure` once the worker is known to have outlived it
    /// (after the pause before the next check), or at the deadline if it is the first: the
    /// pool kills a worker not ready by its `start_timeout` about when this deadline comes,
    /// and the check that kill cuts short ("closed the connection") says nothing of the
    /// application, where the answer before it ("answered 503") does.
    pub async fn until_healthy(
        &self,
        address: &BackendAddress,
        deadline: Instant,
        mut gone: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let mut checks = 0u32;
        let mut kept = false;
        let keep = |failure: &str| {
            if let Ok(mut last) = self.last_failure.lock() {
                *last = Some(failure.to_owned());
            }
        };
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
            let now = Instant::now();
            if now + RETRY_EVERY >= deadline {
                if !kept {
                    keep(&failure);
                }
                tracing::warn!(pool = %self.pool, %address, checks, reason = %failure, "worker never passed its check within start_timeout");
                return Err(failure);
            }
            tokio::time::sleep(RETRY_EVERY).await;
            if gone() {
                return Err("the worker exited during its health check".to_owned());
            }
            keep(&failure);
            kept = true;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::protocols::fastcgi::{
        encode_end_request, encode_stdout, encode_stdout_end, ProtocolStatus,
    };
    use bytes::BytesMut;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn probe() -> Probe {
        Probe {
            pool: Arc::from("site"),
            protocol: Protocol::FastCgi,
            check: HealthCheck {
                path: "/healthz".to_owned(),
                timeout: Duration::from_secs(2),
            },
            root: None,
            last_failure: Arc::default(),
            launcher: false,
        }
    }

    /// A worker (fault injection) that answers its first check 503 and closes the connection
    /// of its second unanswered, as one killed for its `start_timeout` does: the reason kept
    /// for the reload's refusal and the status page is the 503, not the close the kill made.
    #[tokio::test]
    async fn a_check_cut_short_at_the_deadline_keeps_the_answer_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let worker = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = first.read(&mut request).await.unwrap();
            let mut out = BytesMut::new();
            encode_stdout(
                1,
                b"Status: 503 Service Unavailable\r\n\r\nwarming up",
                &mut out,
            );
            encode_stdout_end(1, &mut out);
            encode_end_request(1, 0, ProtocolStatus::RequestComplete, &mut out);
            first.write_all(&out).await.unwrap();
            let (second, _) = listener.accept().await.unwrap();
            drop(second);
        });
        let probe = probe();
        // The second check starts after RETRY_EVERY and fails within the last pause's room.
        let deadline = Instant::now() + RETRY_EVERY + RETRY_EVERY / 2;
        let address = BackendAddress::Unix(path);
        let failed = probe.until_healthy(&address, deadline, || false).await;
        worker.await.unwrap();
        let last = probe.last_failure.lock().unwrap().clone().unwrap();
        assert!(failed.is_err());
        assert_eq!(last, "health check GET /healthz answered 503");
    }

    /// The first check failing at the deadline is kept: there is no other to show.
    #[tokio::test]
    async fn a_lone_failed_check_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let address = BackendAddress::Unix(dir.path().join("nobody.sock"));
        let probe = probe();
        let failed = probe
            .until_healthy(&address, Instant::now(), || false)
            .await;
        let last = probe.last_failure.lock().unwrap().clone().unwrap();
        assert_eq!(Err(last), failed);
    }
}

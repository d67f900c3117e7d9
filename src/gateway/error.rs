//! Why a request got no backend response, the status and log line each reason gets, the same
//! on every front.

use std::sync::Arc;

use crate::backend::BackendError;
use crate::pool::slots::SlotError;
use crate::protocols::cgi::CgiError;

use super::script;

/// Why a request got no backend response.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No context matches the request.
    #[error("no context matches host {host:?} and path {path:?}")]
    NoContext {
        /// The host asked for.
        host: String,
        /// The path asked for.
        path: String,
    },
    /// The CGI variables could not be built from the request.
    #[error("{0}")]
    Cgi(#[from] CgiError),
    /// The script file the request names is not one corral lets a backend run.
    #[error("{0}")]
    Script(#[from] script::ScriptFileError),
    /// No slot could be had (queue full, queue timeout, pool stopping).
    #[error("pool {pool}: {source}")]
    Slot {
        /// The pool.
        pool: Arc<str>,
        /// What happened.
        source: SlotError,
    },
    /// The request body is larger than the context's `max_body`.
    #[error("the request body of {} bytes exceeds max_body of {limit} bytes", .length.map_or_else(|| "more than that".to_owned(), |l| l.to_string()))]
    BodyTooLarge {
        /// Its length, when it was declared.
        length: Option<u64>,
        /// The context's limit.
        limit: u64,
    },
    /// The request body could not be read (or spooled) before the exchange.
    #[error("reading the request body: {0}")]
    Body(BackendError),
    /// The front connection closed while the request waited for a slot: the request was
    /// never sent to a worker, and no answer can be delivered.
    #[error("pool {pool}: the front closed while the request waited {waited:?} for a slot")]
    FrontGone {
        /// The pool.
        pool: Arc<str>,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// The backend exchange failed.
    #[error("pool {pool}: {source}")]
    Backend {
        /// The pool.
        pool: Arc<str>,
        /// What happened.
        source: BackendError,
    },
}

impl GatewayError {
    /// The HTTP status for the client.
    pub fn status(&self) -> u16 {
        match self {
            GatewayError::NoContext { .. } => 404,
            GatewayError::Cgi(e) => cgi_status(e),
            GatewayError::Script(e) => e.status(),
            GatewayError::BodyTooLarge { .. } => 413,
            GatewayError::Slot { .. } => 503,
            // nginx's code for a client that closed its request before the answer.
            GatewayError::FrontGone { .. } => 499,
            GatewayError::Body(source) | GatewayError::Backend { source, .. } => source.status(),
        }
    }

    /// Logs a request that got no backend response, the same on every front: server-side
    /// failures at warn, refusals at info.
    pub fn log(&self, request_id: u64) {
        if let GatewayError::FrontGone { .. } = self {
            // Logged once already, by the pool that dropped it (`Gateway::dispatch`).
            return;
        }
        let status = self.status();
        if status >= 500 {
            tracing::warn!(request_id, status, error = %crate::logs::clean(self), "request failed");
        } else {
            tracing::info!(request_id, status, error = %crate::logs::clean(self), "request refused");
        }
    }

    /// Seconds the client should wait before retrying, for a 503.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            GatewayError::Slot { .. } => Some(1),
            GatewayError::Backend { source, .. } | GatewayError::Body(source)
                if source.status() == 503 =>
            {
                Some(1)
            }
            _ => None,
        }
    }
}

/// The status for a request whose CGI variables cannot be built: a path that names no
/// allowed script is 404 (php-fpm answers "File not found." the same way); a path that
/// tries to leave the root is 403; anything else the client sent is 400.
fn cgi_status(e: &CgiError) -> u16 {
    match e {
        CgiError::EscapesRoot { .. } | CgiError::OutsideRoot { .. } => 403,
        CgiError::NotAScript { .. }
        | CgiError::NoIndex { .. }
        | CgiError::OutsideMount { .. }
        | CgiError::Hidden { .. } => 404,
        CgiError::InvalidContext(_) => 500,
        CgiError::TooManyVars { .. }
        | CgiError::NameTooLong { .. }
        | CgiError::ValueTooLong { .. } => 431,
        _ => 400,
    }
}

//! A request routed to a context and its pool, and the admission checks that need nothing
//! but the route.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::access::LogSettings;
use crate::backend::BackendError;
use crate::protocols::cgi::CgiParams;
use crate::router::Context;

use super::{script, GatewayError, Generation, Pool};

/// A request routed: its context and the pool that serves it, both of one generation. While
/// it lives the pool counts it as routed (a pool retired by a reload waits for it).
#[derive(Debug)]
pub struct Routed {
    /// The context.
    pub context: Arc<Context>,
    /// Its pool.
    pub pool: Arc<Pool>,
    /// The generation that routed it.
    pub generation: u64,
    /// The generation's request-log settings, when a request log is on.
    pub(super) logs: Option<Arc<LogSettings>>,
}

impl Routed {
    pub(super) fn new(context: Arc<Context>, pool: Arc<Pool>, generation: &Generation) -> Routed {
        pool.routed.fetch_add(1, Ordering::AcqRel);
        Routed {
            context,
            pool,
            generation: generation.number,
            logs: generation.logs.clone(),
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        self.pool.routed.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Routed {
    /// Checks, before a body is read, what [`Gateway::dispatch`] would refuse anyway: the
    /// script file and a declared length over the context's `max_body`. An upload to a
    /// missing script is then answered 404 without spooling a byte of it.
    pub fn precheck(&self, params: &CgiParams, body_len: Option<u64>) -> Result<(), GatewayError> {
        script::check(&self.context.cgi, params)?;
        match body_len {
            Some(length) if length > self.context.config.max_body => {
                Err(GatewayError::BodyTooLarge {
                    length: Some(length),
                    limit: self.context.config.max_body,
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether the context reads whole request bodies before asking a worker.
    pub fn buffers_requests(&self) -> bool {
        self.context.config.request_buffering
    }

    /// A backend failure of this request's pool.
    pub fn backend_error(&self, source: BackendError) -> GatewayError {
        GatewayError::Backend {
            pool: Arc::clone(&self.pool.name),
            source,
        }
    }
}

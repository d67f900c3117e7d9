//! Why a backend exchange failed: one variant per failed step, with the status the front
//! answers and who is to blame.

use std::io;
use std::time::Duration;

use super::body::{BodyDeadline, BodyError, BodyOverLimit, BodyTimeout};
use super::Protocol;

/// Who caused a failed exchange (ARCHITECTURE.md decision 22): the front maps it to a status and a
/// log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The client: its body broke off or was malformed, or its request was too large.
    Client,
    /// The backend: refused, broke the protocol, was too slow or went away.
    Backend,
    /// corral itself (a spool file could not be written).
    Internal,
}

/// A failed step of one backend exchange. After any of them the connection is dropped.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// Connecting to the backend failed or timed out.
    #[error("cannot connect to backend {address}: {source}")]
    Connect {
        /// The backend address.
        address: String,
        /// The socket error.
        source: io::Error,
    },
    /// Writing the request to the backend failed.
    #[error("writing the {protocol} request to the backend failed: {source}")]
    Write {
        /// The protocol spoken.
        protocol: Protocol,
        /// The socket error.
        source: io::Error,
    },
    /// Reading the response from the backend failed.
    #[error("reading the {protocol} response from the backend failed: {source}")]
    Read {
        /// The protocol spoken.
        protocol: Protocol,
        /// The socket error.
        source: io::Error,
    },
    /// The backend sent bytes that break a rule of the protocol; `rule` names it.
    #[error("the backend broke the {protocol} protocol: {rule}")]
    Protocol {
        /// The protocol spoken.
        protocol: Protocol,
        /// The rule, as a sentence.
        rule: String,
    },
    /// The application wrote a response head that breaks a rule of the CGI head (RFC 3875
    /// §6): a header name that is not a token, a control byte in a value (PHP's `header()`
    /// passes 0x01 to 0x1f through), a line without a colon. This is the application's
    /// output, not the worker's framing: the client gets a 502, the worker stays in rotation
    /// (ARCHITECTURE.md, "The backend exchange"). Over FastCGI and LSAPI every CGI head error
    /// is this one, since the records around it were sound; over SCGI only a bad field in a
    /// well-formed head is (`CgiResponseError::is_field_error`).
    #[error("the application sent an invalid response head over {protocol}: {rule}")]
    InvalidHead {
        /// The protocol spoken.
        protocol: Protocol,
        /// The rule, as a sentence.
        rule: String,
    },
    /// The backend refused the request (FastCGI END_REQUEST with a status other than
    /// REQUEST_COMPLETE).
    #[error("the backend refused the {protocol} request: {reason}")]
    Refused {
        /// The protocol spoken.
        protocol: Protocol,
        /// The backend's reason, e.g. `OVERLOADED`.
        reason: String,
        /// Whether the backend said it is overloaded (then the front answers 503).
        overloaded: bool,
    },
    /// No response byte arrived within the first-byte timeout after the request was sent.
    #[error("the backend sent nothing within {after:?} of receiving the request")]
    FirstByteTimeout {
        /// The timeout.
        after: Duration,
    },
    /// The whole exchange took longer than the request timeout.
    #[error("the backend did not finish the request within {after:?}")]
    RequestTimeout {
        /// The timeout.
        after: Duration,
    },
    /// The backend closed the connection before the response was complete.
    #[error("the backend closed the {protocol} connection {stage}{}", if *.stale { " (a kept connection, closed before it answered anything)" } else { "" })]
    ClosedEarly {
        /// The protocol spoken.
        protocol: Protocol,
        /// Where the exchange was, e.g. "before the response head".
        stage: &'static str,
        /// The connection had served earlier requests and not one byte of this response
        /// arrived: most likely the backend closed the idle connection as the request was
        /// sent (LSAPI's idle timeout, a restarted worker). See [`BackendError::retryable`].
        stale: bool,
    },
    /// A kept connection refused the first byte of the request (a broken pipe or a reset on
    /// the first write): the backend had closed its end before, as a worker exiting after its
    /// last request or closing an idle connection does, and has none of this request. See
    /// [`BackendError::retryable`]. (A reset or close after some bytes were written says
    /// nothing so sure: php-cgi, for one, runs a script before reading the end of STDIN.)
    #[error("the backend had closed the kept {protocol} connection before the request: {source}")]
    StaleReset {
        /// The protocol spoken.
        protocol: Protocol,
        /// The socket error (a reset or a broken pipe).
        source: io::Error,
    },
    /// A kept connection was reset before one byte of the response arrived (a worker that
    /// exited, or closed the connection, with this request unread in its socket). Like a
    /// stale [`BackendError::ClosedEarly`], the request may or may not have reached it.
    #[error(
        "the backend reset the kept {protocol} connection before answering anything: {source}"
    )]
    StaleRead {
        /// The protocol spoken.
        protocol: Protocol,
        /// The socket error (a reset or an abort).
        source: io::Error,
    },
    /// The request head cannot be encoded: a name or value is too long, too many
    /// parameters, bytes the protocol cannot carry.
    #[error("the request cannot be sent over {protocol}: {reason}")]
    RequestHead {
        /// The protocol spoken.
        protocol: Protocol,
        /// What the encoder refused.
        reason: String,
    },
    /// Reading the request body from the client failed.
    #[error("reading the request body from the client failed: {source}")]
    ClientBody {
        /// The front's error.
        source: BodyError,
    },
    /// The request body did not have the length announced for it.
    #[error("the request body has {actual} bytes but {declared} were announced")]
    BodyLength {
        /// The announced length.
        declared: u64,
        /// The bytes received (so far, when there were too many).
        actual: u64,
    },
    /// A body of unknown length exceeded what may be spooled to find its length.
    #[error("the request body exceeds the spool limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: u64,
    },
    /// Spooling this body would pass `spool_budget`, what all spool files may hold.
    #[error("the spool budget of {limit} bytes is used up by other request bodies")]
    SpoolBudget {
        /// The budget.
        limit: u64,
    },
    /// The spool file for a body of unknown length could not be written or read.
    #[error("cannot spool the request body in {dir}: {source}")]
    Spool {
        /// The spool directory.
        dir: String,
        /// The file error.
        source: io::Error,
    },
}

impl BackendError {
    /// The HTTP status the front answers with, if it has not started the response: 502 for a
    /// backend that failed, 503 when it said it is overloaded, 504 for timeouts, 4xx when the
    /// client is at fault, 500 for corral's own failures.
    pub fn status(&self) -> u16 {
        match self {
            BackendError::Connect { .. }
            | BackendError::Write { .. }
            | BackendError::Read { .. }
            | BackendError::Protocol { .. }
            | BackendError::InvalidHead { .. }
            | BackendError::ClosedEarly { .. }
            | BackendError::StaleReset { .. }
            | BackendError::StaleRead { .. } => 502,
            BackendError::Refused { overloaded, .. } => {
                if *overloaded {
                    503
                } else {
                    502
                }
            }
            BackendError::FirstByteTimeout { .. } | BackendError::RequestTimeout { .. } => 504,
            BackendError::RequestHead { .. } => 431,
            BackendError::ClientBody { source }
                if source.is::<BodyTimeout>() || source.is::<BodyDeadline>() =>
            {
                408
            }
            BackendError::ClientBody { source } if source.is::<BodyOverLimit>() => 413,
            BackendError::ClientBody { .. } | BackendError::BodyLength { .. } => 400,
            BackendError::BodyTooLarge { .. } => 413,
            BackendError::Spool { .. } => 500,
            BackendError::SpoolBudget { .. } => 503,
        }
    }

    /// Who caused the failure.
    pub fn origin(&self) -> Origin {
        match self {
            BackendError::RequestHead { .. }
            | BackendError::ClientBody { .. }
            | BackendError::BodyLength { .. }
            | BackendError::BodyTooLarge { .. } => Origin::Client,
            BackendError::Spool { .. } | BackendError::SpoolBudget { .. } => Origin::Internal,
            _ => Origin::Backend,
        }
    }

    /// Whether the connection may carry another request: never after an error, whatever the
    /// step (ARCHITECTURE.md invariant 5). Kept as a method so callers say what they rely on.
    pub fn connection_reusable(&self) -> bool {
        false
    }

    /// Whether the request may be sent again on a fresh connection, if the caller still has
    /// its body: when the connection could not be made, or when a kept connection failed
    /// before any response byte ([`BackendError::is_stale`]). In the second case a backend
    /// that read the whole request and then crashed looks like a clean close, so
    /// `Gateway::dispatch` resends only what [`BackendError::may_resend`] allows.
    pub fn retryable(&self) -> bool {
        matches!(self, BackendError::Connect { .. }) || self.is_stale()
    }

    /// A kept connection closed or reset before one byte of the response arrived: the
    /// backend dropped the connection, not necessarily the request. Whether the worker died
    /// is for the caller to find out (`Pool::fault` asks the process).
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            BackendError::ClosedEarly { stale: true, .. }
                | BackendError::StaleReset { .. }
                | BackendError::StaleRead { .. }
        )
    }

    /// Not one byte of the request reached the backend (its end of a kept connection was
    /// closed before the first write).
    pub fn request_left_unread(&self) -> bool {
        matches!(self, BackendError::StaleReset { .. })
    }

    /// Whether a request that failed this way on a kept connection may go out once more on
    /// a new one (ARCHITECTURE.md invariant 6, decision 8): any request none of which was
    /// written, and an `idempotent` one (GET, HEAD, OPTIONS) that met a close or a reset
    /// before one response byte, written or not, from a worker that is still alive (it
    /// closed an idle connection as the request went out). Never after a response byte,
    /// never after a timeout (a slow worker may be running it), never when the worker died
    /// (`worker_gone`: it may have died running this very request, which decision 8 answers
    /// with a 502; sent again, a request that kills its worker would kill the next one too),
    /// never on a connection that served nothing before (a fresh one failing says the
    /// worker, not the connection, is gone).
    pub fn may_resend(&self, idempotent: bool, worker_gone: bool) -> bool {
        self.request_left_unread() || (idempotent && !worker_gone && self.is_stale())
    }

    /// Whether the failure is a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            BackendError::FirstByteTimeout { .. } | BackendError::RequestTimeout { .. }
        )
    }
}

//! The CGI variables that do not change from one request to the next, checked and encoded
//! once: a context's (GATEWAY_INTERFACE, SERVER_SOFTWARE, DOCUMENT_ROOT, and the checks of
//! its root, script names and extra variables) when the configuration is loaded, and a
//! connection's address variables (REMOTE_ADDR, REMOTE_PORT, SERVER_ADDR, SERVER_PORT) when
//! it is accepted. [`super::encode_prepared`] appends these blocks as bytes. A few runs of
//! variables whose values are one of a handful (the protocol and scheme of an HTTP/1.x
//! request, a bodiless request's empty CONTENT_TYPE and CONTENT_LENGTH, REDIRECT_STATUS) are
//! encoded once per process the same way ([`fixed`]).
//!
//! The blocks are written by the same functions that write the variables of a request
//! without them ([`super::encode_cgi_vars`] prepares its context on the spot), so the two
//! forms cannot drift apart; a property test holds them equal.

use std::sync::OnceLock;

use super::encode::{
    check_extra_env, push_head, push_no_body, push_protocol, push_redirect_status, push_remote,
    push_root, push_server,
};
use super::params::CgiParams;
use super::{check_field, path, CgiContext, CgiError};

/// A [`CgiContext`] with its per-request constants checked and encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedContext {
    ctx: CgiContext,
    /// Whether the context can be used: an unusable one refuses every request with this
    /// error, as the context's checks on every request did.
    checked: Result<(), CgiError>,
    /// GATEWAY_INTERFACE and SERVER_SOFTWARE.
    head: CgiParams,
    /// DOCUMENT_ROOT.
    root: CgiParams,
    /// DOCUMENT_ROOT followed by each of [`Fixed`]'s protocol blocks (the variables after it
    /// in the request's order), in the same order: one append for the four variables.
    root_protocol: Option<[CgiParams; 4]>,
}

impl PreparedContext {
    /// Checks `ctx` and encodes its constant variables.
    pub fn new(ctx: CgiContext) -> PreparedContext {
        let mut head = CgiParams::with_capacity(32 + ctx.server_software.len());
        let mut root = CgiParams::with_capacity(16 + ctx.document_root.len());
        let checked = path::check_context(&ctx)
            .and_then(|()| check_extra_env(&ctx))
            .and_then(|()| push_head(&mut head, &ctx))
            .and_then(|()| push_root(&mut root, &ctx));
        let root_protocol = fixed().map(|fixed| {
            fixed.protocol.clone().map(|protocol| {
                let mut joined = root.clone();
                joined.append(&protocol);
                joined
            })
        });
        PreparedContext {
            ctx,
            checked,
            head,
            root,
            root_protocol,
        }
    }

    /// The context as configured.
    pub fn context(&self) -> &CgiContext {
        &self.ctx
    }

    /// `Ok` when the context is usable, else why not.
    pub(super) fn checked(&self) -> Result<(), CgiError> {
        self.checked.clone()
    }

    /// Whether the context passed every check made when it was prepared (its root, script
    /// names and mount among them), without cloning the verdict.
    pub(super) fn usable(&self) -> bool {
        self.checked.is_ok()
    }

    /// GATEWAY_INTERFACE and SERVER_SOFTWARE, encoded.
    pub(super) fn head(&self) -> &CgiParams {
        &self.head
    }

    /// DOCUMENT_ROOT, encoded.
    pub(super) fn root(&self) -> &CgiParams {
        &self.root
    }

    /// DOCUMENT_ROOT, SERVER_PROTOCOL `version`, REQUEST_SCHEME and HTTPS, encoded, when
    /// `version` is HTTP/1.1 or HTTP/1.0.
    pub(super) fn root_and_protocol(&self, version: &[u8], https: bool) -> Option<&CgiParams> {
        self.root_protocol
            .as_ref()?
            .get(protocol_index(version, https)?)
    }
}

impl std::ops::Deref for PreparedContext {
    type Target = CgiContext;

    fn deref(&self) -> &CgiContext {
        &self.ctx
    }
}

/// Writes one side's address variables (`push_remote`, `push_server`).
type PushAddr = fn(&mut CgiParams, &[u8], Option<u16>) -> Result<(), CgiError>;

/// One side's address variables, encoded, or why its address cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AddrBlock(Result<CgiParams, CgiError>);

impl AddrBlock {
    fn new(field: &str, addr: &[u8], port: Option<u16>, push: PushAddr) -> AddrBlock {
        let mut out = CgiParams::with_capacity(32 + addr.len());
        AddrBlock(
            check_field(field, addr)
                .and_then(|()| push(&mut out, addr, port))
                .map(|()| out),
        )
    }
}

/// REMOTE_ADDR and REMOTE_PORT of a connection, encoded when it is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteVars(AddrBlock);

impl RemoteVars {
    /// The client's address as text (empty when unknown: REMOTE_ADDR is then left out) and
    /// port (`None` on a Unix socket).
    pub fn new(addr: &[u8], port: Option<u16>) -> RemoteVars {
        RemoteVars(AddrBlock::new("remote address", addr, port, push_remote))
    }

    /// The encoded variables, or the error a request with this address meets.
    pub(super) fn encoded(&self) -> Result<&CgiParams, CgiError> {
        self.0 .0.as_ref().map_err(Clone::clone)
    }
}

/// SERVER_ADDR and SERVER_PORT of a connection, encoded when it is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVars(AddrBlock);

impl ServerVars {
    /// The local address as text and port (`None` on a Unix socket).
    pub fn new(addr: &[u8], port: Option<u16>) -> ServerVars {
        ServerVars(AddrBlock::new("server address", addr, port, push_server))
    }

    /// The encoded variables, or the error a request with this address meets.
    pub(super) fn encoded(&self) -> Result<&CgiParams, CgiError> {
        self.0 .0.as_ref().map_err(Clone::clone)
    }
}

/// Runs of variables that take one of a few values, each encoded once per process by the
/// function that writes it for any other value.
pub(super) struct Fixed {
    /// SERVER_PROTOCOL and REQUEST_SCHEME (and HTTPS): HTTP/1.1, then HTTP/1.0; each plain,
    /// then over TLS.
    protocol: [CgiParams; 4],
    /// CONTENT_TYPE and CONTENT_LENGTH of a request without a body, both empty.
    no_body: CgiParams,
    /// REDIRECT_STATUS.
    redirect_status: CgiParams,
}

/// The process's [`Fixed`] blocks; `None` if one could not be written (it cannot: the values
/// are constants that pass every check), and the caller then writes the variables itself.
pub(super) fn fixed() -> Option<&'static Fixed> {
    static FIXED: OnceLock<Option<Fixed>> = OnceLock::new();
    FIXED
        .get_or_init(|| {
            let block = |push: &dyn Fn(&mut CgiParams) -> Result<(), CgiError>| {
                let mut out = CgiParams::with_capacity(64);
                push(&mut out).ok().map(|()| out)
            };
            let protocol = |version: &'static [u8], https| {
                block(&move |out| push_protocol(out, version, https))
            };
            Some(Fixed {
                protocol: [
                    protocol(b"HTTP/1.1", false)?,
                    protocol(b"HTTP/1.1", true)?,
                    protocol(b"HTTP/1.0", false)?,
                    protocol(b"HTTP/1.0", true)?,
                ],
                no_body: block(&push_no_body)?,
                redirect_status: block(&push_redirect_status)?,
            })
        })
        .as_ref()
}

/// Where the protocol block of `version` and `https` is in [`Fixed`]'s array.
fn protocol_index(version: &[u8], https: bool) -> Option<usize> {
    let at = match version {
        b"HTTP/1.1" => 0,
        b"HTTP/1.0" => 2,
        _ => return None,
    };
    Some(at + usize::from(https))
}

impl Fixed {
    /// CONTENT_TYPE and CONTENT_LENGTH, both empty.
    pub(super) fn no_body(&self) -> &CgiParams {
        &self.no_body
    }

    /// REDIRECT_STATUS.
    pub(super) fn redirect_status(&self) -> &CgiParams {
        &self.redirect_status
    }
}

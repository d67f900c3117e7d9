//! The in-place form of a decoded BEGIN_REQUEST: one buffer and offsets into it, refilled
//! by [`RequestDecoder::decode_into`] for every request of a connection.

use std::ops::Range;

use bytes::Bytes;

use super::headers::KNOWN_HEADERS;
use super::packet::ByteOrder;
#[cfg(doc)]
use super::request_decode::RequestDecoder;
use super::request_decode::{BeginRequest, HeaderName, Layout};

/// One thing [`RequestDecoder::decode_into`] read; a new request is in the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewEvent {
    /// A new request, now in the view passed to `decode_into`.
    Begin,
    /// Raw body bytes of the current request.
    Body(Bytes),
    /// ABORT_REQUEST: the client went away.
    Abort,
}

/// A BEGIN_REQUEST held as one buffer and offsets into it, for a backend that reads the
/// request in place: [`RequestDecoder::decode_into`] refills it, reusing its buffers. The
/// accessors give the same values as the fields of [`BeginRequest`].
#[derive(Debug, Clone)]
pub struct RequestView {
    pub(super) packet: Vec<u8>,
    pub(super) order: ByteOrder,
    pub(super) layout: Layout,
}

impl Default for RequestView {
    fn default() -> RequestView {
        RequestView {
            packet: Vec::new(),
            order: ByteOrder::NATIVE,
            layout: Layout::default(),
        }
    }
}

impl RequestView {
    /// An empty view (no request yet).
    pub fn new() -> RequestView {
        RequestView::default()
    }

    #[inline]
    fn at(&self, r: &Range<usize>) -> &[u8] {
        self.packet.get(r.clone()).unwrap_or_default()
    }

    /// Byte order the server wrote the packet in.
    #[inline]
    pub fn order(&self) -> ByteOrder {
        self.order
    }

    /// Body length (see [`BeginRequest::body_len`]).
    #[inline]
    pub fn body_len(&self) -> u64 {
        self.layout.body_len
    }

    /// CGI env pairs, NULs stripped, in packet order.
    #[inline]
    pub fn env(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.layout
            .env
            .iter()
            .map(|(k, v)| (self.at(k), self.at(v)))
    }

    /// Special env pairs, NULs stripped.
    #[inline]
    pub fn special_env(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        let l = &self.layout.special_env;
        l.iter().map(|(k, v)| (self.at(k), self.at(v)))
    }

    /// Request headers in their original order (see [`BeginRequest::headers`]).
    #[inline]
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.layout
            .headers
            .iter()
            .map(|(n, v)| (self.header_name(n), self.at(v)))
    }

    #[inline]
    fn header_name(&self, n: &HeaderName) -> &[u8] {
        match n {
            HeaderName::Known(i) => KNOWN_HEADERS.get(*i).map_or(&[][..], |s| s.as_bytes()),
            HeaderName::Raw(r) => self.at(r),
        }
    }

    #[inline]
    fn pointed(&self, i: usize) -> Option<&[u8]> {
        let r = self.layout.pointed.get(i)?.as_ref()?;
        Some(self.at(r))
    }

    /// The string `m_scriptFileOff` points at (`None` for offset 0).
    #[inline]
    pub fn script_filename(&self) -> Option<&[u8]> {
        self.pointed(0)
    }

    /// The string `m_scriptNameOff` points at (`None` for offset 0).
    #[inline]
    pub fn script_name(&self) -> Option<&[u8]> {
        self.pointed(1)
    }

    /// The string `m_queryStringOff` points at (`None` for offset 0).
    #[inline]
    pub fn query_string(&self) -> Option<&[u8]> {
        self.pointed(2)
    }

    /// The string `m_requestMethodOff` points at (`None` for offset 0).
    #[inline]
    pub fn request_method(&self) -> Option<&[u8]> {
        self.pointed(3)
    }

    /// The raw HTTP request head.
    #[inline]
    pub fn head(&self) -> &[u8] {
        self.at(&self.layout.head)
    }

    /// The same request as an owned [`BeginRequest`] (copies everything).
    pub fn to_request(&self) -> BeginRequest {
        let packet = Bytes::copy_from_slice(&self.packet);
        self.layout.clone().into_request(&packet, self.order)
    }
}

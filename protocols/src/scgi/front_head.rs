//! An SCGI header block decoded straight into [`FrontParams`], the form corral's CGI fronts
//! route and normalise: one buffer sized for the whole block at once, instead of a list of
//! pairs grown pair by pair and then copied pair by pair.
//!
//! It refuses exactly what [`ScgiRequestHead::decode`](super::ScgiRequestHead::decode)
//! refuses (both run the same walk). SCGI moves CONTENT_LENGTH to the front of its block and
//! lets it have leading zeros; the parameters hold it first, in plain decimal, as a CGI
//! backend reads it.

use bytes::Bytes;

use super::header::{walk, ScgiHead};
use super::ScgiError;
use crate::cgi::{CgiError, FrontParams};
use crate::Limits;

/// A decoded SCGI header block, as the CGI front logic takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScgiFrontHead {
    /// The body length (CONTENT_LENGTH).
    pub content_length: u64,
    /// CONTENT_LENGTH, then every other pair in order but SCGI; or the first pair no
    /// parameter block can hold (past the CGI field limits), for the front to refuse as it
    /// refuses such a parameter from any front server.
    pub params: Result<FrontParams, CgiError>,
}

/// Bytes a block's pairs may take beyond the block itself in [`FrontParams`]' encoding: its
/// CONTENT_LENGTH pair and a few four-byte length prefixes.
const SLACK: usize = 64;

impl ScgiHead for ScgiFrontHead {
    fn decode(payload: Bytes, limits: &Limits) -> Result<Self, ScgiError> {
        let mut params = FrontParams::new();
        params.reserve_for(payload.len() + SLACK);
        let mut failed = None;
        let mut digits = [0u8; 20];
        let content_length = walk(&payload, limits, |name, value| {
            if failed.is_some() {
                return;
            }
            let name = payload.get(name).unwrap_or_default();
            let mut value = payload.get(value).unwrap_or_default();
            if params.is_empty() {
                // CONTENT_LENGTH, digits only (the walk checked them), maybe zero-padded.
                value = decimal(value, &mut digits);
            }
            if let Err(e) = params.push(name, value) {
                failed = Some(e);
            }
        })?;
        Ok(ScgiFrontHead {
            content_length,
            params: failed.map_or(Ok(params), Err),
        })
    }

    fn content_length(&self) -> u64 {
        self.content_length
    }
}

/// The decimal digits `digits` without their leading zeros (one zero for zero), in `buf`.
fn decimal<'a>(digits: &[u8], buf: &'a mut [u8; 20]) -> &'a [u8] {
    let start = digits
        .iter()
        .position(|&d| d != b'0')
        .unwrap_or(digits.len().saturating_sub(1));
    let kept = digits.get(start..).unwrap_or_default();
    // More than 20 digits cannot be a u64: the walk refused them, and no more are kept.
    let kept = kept.get(..buf.len()).unwrap_or(kept);
    let (out, _) = buf.split_at_mut(kept.len());
    out.copy_from_slice(kept);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(block: &[u8]) -> Result<ScgiFrontHead, ScgiError> {
        <ScgiFrontHead as ScgiHead>::decode(Bytes::copy_from_slice(block), &Limits::default())
    }

    #[test]
    fn the_length_comes_first_in_plain_decimal_and_scgi_is_left_out() {
        let h = head(b"CONTENT_LENGTH\x000012\x00SCGI\x001\x00REQUEST_METHOD\x00POST\x00X\x00\x00")
            .unwrap();
        assert_eq!(h.content_length, 12);
        let params = h.params.unwrap();
        let pairs: Vec<(&[u8], &[u8])> = params.iter().collect();
        assert_eq!(
            pairs,
            vec![
                (&b"CONTENT_LENGTH"[..], &b"12"[..]),
                (b"REQUEST_METHOD", b"POST"),
                (b"X", b""),
            ]
        );
        let zero = head(b"CONTENT_LENGTH\x00000\x00SCGI\x001\x00").unwrap();
        assert_eq!(
            zero.params.unwrap().first(crate::cgi::Known::ContentLength),
            Some(&b"0"[..])
        );
    }

    #[test]
    fn it_refuses_what_the_plain_head_refuses() {
        let blocks: [&[u8]; 7] = [
            b"SCGI\x001\x00CONTENT_LENGTH\x000\x00",
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00A\x001\x00A\x002\x00",
            b"CONTENT_LENGTH\x000\x00A\x001\x00",
            b"CONTENT_LENGTH\x00-1\x00SCGI\x001\x00",
            b"CONTENT_LENGTH\x000\x00SCGI\x002\x00",
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00A\x001",
            b"CONTENT_LENGTH\x000\x00SCGI\x001\x00\x00x\x00",
        ];
        for block in blocks {
            let plain = super::super::ScgiRequestHead::decode(
                Bytes::copy_from_slice(block),
                &Limits::default(),
            );
            let front = head(block);
            assert!(plain.is_err(), "{}", block.escape_ascii());
            assert_eq!(front.err(), plain.err(), "{}", block.escape_ascii());
        }
    }
}

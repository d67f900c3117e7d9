//! The encoder's shortcut for decoded heads: a head straight from the decoder is written
//! without the encoder's checks, and must give the bytes the checks would have let through;
//! a head changed after decoding is checked again, whatever the change.

use bytes::{Bytes, BytesMut};
use corral_protocols::cgi_response::{
    encode_head, CgiResponseDecoder, CgiResponseError, CgiResponseHead, CgiStatus,
};
use corral_protocols::Limits;
use proptest::prelude::*;

fn decode(wire: &[u8]) -> Result<Option<CgiResponseHead>, CgiResponseError> {
    CgiResponseDecoder::new(&Limits::DEFAULT).decode(&mut BytesMut::from(wire))
}

/// `head` written by the encoder with every check, whatever its mark.
fn encode_checked(head: &CgiResponseHead) -> Result<BytesMut, CgiResponseError> {
    let built = CgiResponseHead::new(head.status().cloned(), head.headers().to_vec());
    assert!(!built.is_decoded());
    let mut out = BytesMut::new();
    encode_head(&built, &mut out).map(|()| out)
}

fn encode(head: &CgiResponseHead) -> Result<BytesMut, CgiResponseError> {
    let mut out = BytesMut::new();
    encode_head(head, &mut out).map(|()| out)
}

/// Bytes that make a head break a rule now and then: controls, whitespace, separators.
fn soup(max: usize) -> impl Strategy<Value = Bytes> {
    prop::collection::vec(
        prop::sample::select(b"aZ0-/: \t\r\n\x00\x7f\xff;\"".to_vec()),
        0..max,
    )
    .prop_map(Bytes::from)
}

/// A header name: mostly a token, sometimes not, sometimes Status or Location.
fn name() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => "[A-Za-z][A-Za-z0-9-]{0,8}".prop_map(Bytes::from),
        1 => prop::sample::select(vec!["Status", "status", "Location", "LOCATION"])
            .prop_map(|n: &str| Bytes::from(n)),
        1 => soup(6),
    ]
}

fn value() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => "[!-~]([ -~]{0,12}[!-~])?".prop_map(Bytes::from),
        1 => "(/|http://h/)[!-~]{0,6}".prop_map(Bytes::from),
        2 => soup(10),
    ]
}

fn status() -> impl Strategy<Value = Option<CgiStatus>> {
    prop::option::of(
        (
            prop_oneof![3 => 100u16..=999, 1 => any::<u16>()],
            prop_oneof![3 => "([!-~]([ -~]{0,8}[!-~])?)?".prop_map(Bytes::from), 1 => soup(8)],
        )
            .prop_map(|(code, reason)| CgiStatus { code, reason }),
    )
}

/// Any head, one the encoder refuses as well as one it writes.
fn any_head() -> impl Strategy<Value = CgiResponseHead> {
    (status(), prop::collection::vec((name(), value()), 0..6))
        .prop_map(|(status, headers)| CgiResponseHead::new(status, headers))
}

/// A change made to a head after it was decoded.
#[derive(Debug, Clone)]
enum Edit {
    SetStatus(Option<CgiStatus>),
    Push(Bytes, Bytes),
    Replace(usize, Bytes, Bytes),
    Remove(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        status().prop_map(Edit::SetStatus),
        (name(), value()).prop_map(|(n, v)| Edit::Push(n, v)),
        (any::<usize>(), name(), value()).prop_map(|(i, n, v)| Edit::Replace(i, n, v)),
        any::<usize>().prop_map(Edit::Remove),
    ]
}

fn apply(head: &mut CgiResponseHead, edit: Edit) {
    match edit {
        Edit::SetStatus(s) => head.set_status(s),
        Edit::Push(n, v) => head.headers_mut().push((n, v)),
        Edit::Replace(i, n, v) => {
            let len = head.headers().len();
            if let Some(field) = head.headers_mut().get_mut(i % len.max(1)) {
                *field = (n, v);
            }
        }
        Edit::Remove(i) => {
            let headers = head.headers_mut();
            if !headers.is_empty() {
                headers.remove(i % headers.len());
            }
        }
    }
}

proptest! {
    /// Whatever head: what the encoder writes with its checks, decoded and written again
    /// without them, gives the same bytes (and a head it refuses is never written).
    #[test]
    fn decoded_then_encoded_equals_encoded_with_checks(head in any_head()) {
        let Ok(wire) = encode(&head) else {
            return Ok(());
        };
        let decoded = decode(&wire).unwrap().expect("a whole head");
        prop_assert!(decoded.is_decoded());
        prop_assert_eq!(&decoded, &head);
        prop_assert_eq!(encode(&decoded).unwrap(), wire);
    }

    /// Whatever bytes the decoder takes for a head: written without the checks, the same
    /// bytes as with them, and the checks pass.
    #[test]
    fn decoded_head_writes_as_checked(input in prop::collection::vec(
            prop::sample::select(b"Status: 20Loc/\r\n :xX\0\t".to_vec()), 0..80)) {
        if let Ok(Some(head)) = decode(&input) {
            prop_assert!(head.is_decoded());
            prop_assert_eq!(encode(&head).unwrap(), encode_checked(&head).unwrap());
        }
    }

    /// A decoded head changed in any way is checked again: its outcome is that of the same
    /// head built anew, refusal and all.
    #[test]
    fn an_edited_head_is_checked_again(head in any_head(), edits in prop::collection::vec(edit(), 1..3)) {
        let Ok(wire) = encode(&head) else {
            return Ok(());
        };
        let mut decoded = decode(&wire).unwrap().expect("a whole head");
        for e in edits {
            apply(&mut decoded, e);
        }
        prop_assert!(!decoded.is_decoded());
        prop_assert_eq!(encode(&decoded), encode_checked(&decoded));
    }
}

#[test]
fn each_way_of_editing_clears_the_mark() {
    let wire = b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\n";
    let fresh = || decode(wire).unwrap().expect("a whole head");
    assert!(fresh().is_decoded());
    assert!(fresh().clone().is_decoded(), "a copy is the same head");

    // A control byte pushed into a value: refused, not passed on.
    let mut head = fresh();
    head.headers_mut().push((
        Bytes::from_static(b"X"),
        Bytes::from_static(b"a\r\nSet-Cookie: x=1"),
    ));
    assert_eq!(
        encode(&head).unwrap_err(),
        CgiResponseError::InvalidValue {
            name: b"X".to_vec()
        }
    );

    // A name changed in place to one that is not a token.
    let mut head = fresh();
    if let Some(field) = head.headers_mut().first_mut() {
        field.0 = Bytes::from_static(b"Content Type");
    }
    assert!(matches!(
        encode(&head),
        Err(CgiResponseError::InvalidName { .. })
    ));

    // A status out of range.
    let mut head = fresh();
    head.set_status(Some(CgiStatus {
        code: 1000,
        reason: Bytes::new(),
    }));
    assert!(matches!(
        encode(&head),
        Err(CgiResponseError::InvalidStatus { .. })
    ));

    // Even an edit that changes nothing leaves the head to be checked.
    let mut head = fresh();
    head.headers_mut();
    assert!(!head.is_decoded());
    assert_eq!(&encode(&head).unwrap()[..], &wire[..]);

    // Taken apart and built again: checked.
    let (status, headers) = fresh().into_parts();
    assert!(!CgiResponseHead::new(status, headers).is_decoded());
    assert!(!CgiResponseHead::default().is_decoded());
}

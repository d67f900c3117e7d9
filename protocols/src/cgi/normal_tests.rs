//! The in-place normalisation against the plain segment-list algorithm it replaced (RFC 3986
//! §5.2.4 with the root as a floor), on every path of up to eight bytes over the alphabet
//! that matters (`/`, `.`, `a`).

use super::{is_normal, normalize};

/// The reference: a list of kept segments, `..` pops one, the last segment says whether the
/// result names a directory.
fn reference(path: &[u8], allow_dotdot: bool) -> Option<Vec<u8>> {
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut dir = true;
    for segment in path.split(|&c| c == b'/') {
        dir = matches!(segment, b"" | b"." | b"..");
        match segment {
            b"" | b"." => {}
            b".." if allow_dotdot => {
                segments.pop()?;
            }
            b".." => return None,
            _ => segments.push(segment),
        }
    }
    let mut out = Vec::new();
    for segment in &segments {
        out.push(b'/');
        out.extend_from_slice(segment);
    }
    if dir || out.is_empty() {
        out.push(b'/');
    }
    Some(out)
}

fn every_path(max: usize) -> Vec<Vec<u8>> {
    let mut all = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for _ in 0..max {
        let next: Vec<Vec<u8>> = last
            .iter()
            .flat_map(|p: &Vec<u8>| {
                [b'/', b'.', b'a'].map(|c| {
                    let mut q = p.clone();
                    q.push(c);
                    q
                })
            })
            .collect();
        all.extend(next.iter().cloned());
        last = next;
    }
    all
}

#[test]
fn in_place_normalisation_matches_the_segment_list_on_every_short_path() {
    for path in every_path(8) {
        for allow in [true, false] {
            let got = normalize(&path, allow).ok();
            assert_eq!(
                got,
                reference(&path, allow),
                "{:?} (allow_dotdot {allow})",
                String::from_utf8_lossy(&path)
            );
        }
    }
}

#[test]
fn a_path_is_normal_exactly_when_normalising_leaves_it_as_it_is() {
    for path in every_path(8) {
        let unchanged = normalize(&path, true).is_ok_and(|n| n == path);
        assert_eq!(
            is_normal(&path),
            unchanged,
            "{:?}",
            String::from_utf8_lossy(&path)
        );
    }
}

#[test]
fn the_one_pass_check_answers_as_the_check_then_the_normal_form_test() {
    // Every path of up to six bytes over the bytes that matter to either, in every order.
    let alphabet = [b'/', b'.', b'a', b'\\', 0, b'\n', b'\r'];
    let mut paths: Vec<Vec<u8>> = vec![Vec::new()];
    let mut last: Vec<Vec<u8>> = vec![Vec::new()];
    for _ in 0..6 {
        last = last
            .iter()
            .flat_map(|p| {
                alphabet.iter().map(move |&c| {
                    let mut q = p.clone();
                    q.push(c);
                    q
                })
            })
            .collect();
        paths.extend(last.iter().cloned());
    }
    for path in paths {
        let want = super::check_decoded(&path).map(|()| is_normal(&path));
        assert_eq!(
            super::checked_is_normal(&path),
            want,
            "{:?}",
            path.escape_ascii().to_string()
        );
    }
}

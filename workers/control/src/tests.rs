//! The control messages the template accepts, read from a real SOCK_SEQPACKET socket pair.

use super::*;

#[test]
fn only_fork_with_a_number_is_a_fork() {
    assert_eq!(fork_key(b"fork 7"), Some(7));
    assert_eq!(fork_key(b"fork 18446744073709551615"), Some(u64::MAX));
    for bad in [
        &b"fork"[..],
        b"fork ",
        b"fork -1",
        b"fork 7 ",
        b"fork +7",
        b"fork 18446744073709551616",
        b"fork 0000000000000000000007",
        b"ready 7",
        b"\xfffork 7",
    ] {
        assert_eq!(fork_key(bad), None, "{bad:?}");
    }
}

/// A connected SOCK_SEQPACKET pair: (corral's end, the template's end).
fn pair() -> (RawFd, RawFd) {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

/// A pipe, non-blocking: (read end, write end).
fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

/// Whether every copy of the pipe's write end is closed (its read end sees the end).
fn writers_gone(read_end: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: one byte into `byte`, valid for the call.
    unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) == 0 }
}

/// Sends `text` with `fds` attached, as corral does.
fn send_with(to: RawFd, text: &[u8], fds: &[RawFd]) {
    let mut space = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: text.as_ptr().cast_mut().cast(),
        iov_len: text.len(),
    };
    // SAFETY: msghdr is zeroed, then pointed at buffers that outlive the call; the
    // SCM_RIGHTS header is written inside `space`, which CMSG_SPACE(len) bytes fit.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let len = std::mem::size_of_val(fds) as u32;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(len) as usize;
            assert!(msg.msg_controllen <= std::mem::size_of_val(&space));
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(len) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                len as usize,
            );
        }
        let n = libc::sendmsg(to, &msg, 0);
        assert_eq!(
            n,
            text.len() as isize,
            "{}",
            std::io::Error::last_os_error()
        );
    }
}

fn close(fd: RawFd) {
    // SAFETY: the test owns `fd`.
    unsafe { libc::close(fd) };
}

#[test]
fn fork_with_one_descriptor_is_a_fork() {
    let (corral, template) = pair();
    let (r, w) = pipe();
    send_with(corral, b"fork 42", &[w]);
    close(w);
    match receive(template) {
        Received::Fork(42, got) => {
            assert!(
                !writers_gone(r),
                "the descriptor passed is the one received"
            );
            close(got);
            assert!(writers_gone(r));
        }
        other => panic!("{other:?}"),
    }
    close(r);
    close(corral);
    assert_eq!(receive(template), Received::Closed);
    close(template);
}

/// Sends `text` with `n` write ends of fresh pipes, receives it, and checks it is refused
/// with every descriptor that came closed.
fn refused(corral: RawFd, template: RawFd, text: &[u8], n: usize) -> Received {
    let pipes: Vec<(RawFd, RawFd)> = (0..n).map(|_| pipe()).collect();
    let writers: Vec<RawFd> = pipes.iter().map(|&(_, w)| w).collect();
    send_with(corral, text, &writers);
    for w in writers {
        close(w);
    }
    let got = receive(template);
    for (r, _) in pipes {
        assert!(
            writers_gone(r),
            "{text:?}: a received descriptor was left open"
        );
        close(r);
    }
    got
}

#[test]
fn a_malformed_message_closes_what_came_with_it() {
    let (corral, template) = pair();
    for (text, n) in [
        (&b"fork 42"[..], 2),
        (b"fork 42", 0),
        (b"fork +42", 1),
        (b"exited 1 code 0", 1),
    ] {
        assert_eq!(
            refused(corral, template, text, n),
            Received::Malformed {
                bytes: text.len(),
                truncated: false
            },
            "{text:?}"
        );
    }
    // Longer than any control message: cut short, never a fork.
    let mut long = b"fork 1".to_vec();
    long.resize(MAX_CONTROL + 1, b'0');
    assert_eq!(
        refused(corral, template, &long, 1),
        Received::Malformed {
            bytes: MAX_CONTROL,
            truncated: true
        }
    );
    // More descriptors than there is room for: those past the room are cut (the kernel
    // closes them), the rest closed here.
    assert_eq!(
        refused(corral, template, b"fork 42", MAX_FDS + 1),
        Received::Malformed {
            bytes: 7,
            truncated: true
        }
    );
    close(corral);
    close(template);
}

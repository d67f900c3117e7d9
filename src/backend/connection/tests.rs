//! Tests of the idle stacks: readiness, threads, lanes taken in turn.

use super::*;
use nix::sys::socket::{recv, MsgFlags};
use tokio::io::AsyncWriteExt;

fn pair() -> (BackendConnection, tokio::net::UnixStream) {
    let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
    let address = BackendAddress::Unix("/nonexistent/backend.sock".into());
    (
        BackendConnection::from_stream(
            Stream::Unix(crate::net::QuietUnix::from_tokio(ours).unwrap()),
            address,
        )
        .unwrap(),
        theirs,
    )
}

fn unix(conn: &BackendConnection) -> &crate::net::QuietUnix {
    match &conn.stream {
        Stream::Unix(s) => s,
        Stream::Tcp(_) => unreachable!("made from a socketpair"),
    }
}

/// Readiness the reactor set and a read left behind (a read that does not end in
/// `WouldBlock` keeps it) says nothing about the connection now: it is quiet, and the
/// peek that finds so clears the mark.
#[tokio::test]
async fn a_readiness_mark_left_by_a_read_does_not_condemn_a_quiet_connection() {
    let (conn, mut theirs) = pair();
    assert!(conn.is_quiet(), "never readable");
    theirs.write_all(b"x").await.unwrap();
    unix(&conn).readable().await.unwrap();
    let mut byte = [0u8; 1];
    let read = unix(&conn)
        .try_read_io(|fd| recv(fd, &mut byte, MsgFlags::MSG_DONTWAIT).map_err(io::Error::from));
    assert_eq!(read.unwrap(), 1);
    assert!(conn.is_quiet(), "read to the end, still marked readable");
    assert!(conn.is_quiet(), "the mark is cleared");
}

#[tokio::test]
async fn bytes_or_a_close_while_idle_condemn_the_connection() {
    let (conn, mut theirs) = pair();
    theirs.write_all(b"stray").await.unwrap();
    unix(&conn).readable().await.unwrap();
    assert!(!conn.is_quiet(), "bytes no request asked for");
    let (conn, theirs) = pair();
    drop(theirs);
    unix(&conn).readable().await.unwrap();
    assert!(!conn.is_quiet(), "closed by the backend");
    assert!(!conn.is_quiet(), "a close stays seen");
}

/// Runs `f` on serving thread `i` of `shards` and returns what it gave.
fn on<T: Send + 'static>(
    shards: &crate::shards::Shards,
    i: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    shards.handles()[i].spawn(async move {
        let _ = tx.send(f());
    });
    rx.recv().unwrap()
}

/// A connection marked with `mark` (as its count of requests served) put back on
/// serving thread `i`; the backend's end is returned to keep it open.
fn put_on(
    shards: &crate::shards::Shards,
    i: usize,
    conns: &Connections,
    mark: u64,
) -> tokio::net::UnixStream {
    let conns = conns.clone();
    on(shards, i, move || {
        let (mut conn, theirs) = pair();
        conn.served = mark;
        conns.put(conn);
        theirs
    })
}

#[test]
fn a_thread_takes_its_own_idle_connection_first_and_another_threads_when_it_has_none() {
    let shards = crate::shards::Shards::start(2, false, false).unwrap();
    let conns = Connections::new(4);
    let addr = BackendAddress::Unix("/nonexistent/backend.sock".into());
    let _a = put_on(&shards, 0, &conns, 1);
    let _b = put_on(&shards, 1, &conns, 2);
    assert_eq!(conns.idle(&addr), 2, "counted over every thread's stack");
    let take = |i: usize| {
        let (conns, addr) = (conns.clone(), addr.clone());
        on(&shards, i, move || {
            conns.take_idle(&addr, None).map(|c| {
                let got = (c.requests_served(), c.shard);
                // Given back on this thread, as a clean exchange does.
                c.finish();
                got
            })
        })
    };
    assert_eq!(take(1), Some((2, Some(1))), "thread 1's own");
    assert_eq!(take(0), Some((1, Some(0))), "thread 0's own");
    // Both are on thread 1's stack after this: thread 0 then has none of its own and
    // takes thread 1's, moved to its runtime.
    assert_eq!(take_and_keep(&shards, 1, &conns, &addr), 2);
    let moved = take(0).unwrap();
    assert_eq!(moved.1, Some(0), "registered with the taking thread");
    assert_eq!(conns.idle(&addr), 2);
    conns.forget(&addr);
    assert_eq!(conns.idle(&addr), 0, "forgotten on every thread's stack");
}

/// A connection another thread's reactor watches is asked of its socket: that reactor
/// may not have turned since the backend wrote (here it cannot: its thread is held), so
/// its readiness would call a condemned connection quiet.
#[test]
fn a_connection_from_another_thread_is_peeked_not_judged_by_that_threads_reactor() {
    use std::io::Write;
    let shards = crate::shards::Shards::start(2, false, false).unwrap();
    let conns = Connections::new(4);
    let addr = BackendAddress::Unix("/nonexistent/backend.sock".into());
    let theirs = {
        let conns = conns.clone();
        on(&shards, 0, move || {
            let (conn, theirs) = pair();
            conns.put(conn);
            theirs.into_std().unwrap()
        })
    };
    // Thread 0 is held in a task: its reactor does not turn until it is let go.
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    shards.handles()[0].spawn(async move {
        let _ = held_tx.send(());
        let _ = go_rx.recv();
    });
    held_rx.recv().unwrap();
    // What an LSAPI worker's CONN_CLOSE on an idle connection looks like to corral.
    (&theirs).write_all(b"LS\x01").unwrap();
    let taken = {
        let (conns, addr) = (conns.clone(), addr.clone());
        on(&shards, 1, move || conns.take_idle(&addr, None).is_some())
    };
    go_tx.send(()).unwrap();
    assert!(!taken, "a connection the backend wrote on was handed out");
    assert_eq!(conns.idle(&addr), 0, "and dropped");
}

/// Takes both idle connections on thread `i` and gives them back there.
fn take_and_keep(
    shards: &crate::shards::Shards,
    i: usize,
    conns: &Connections,
    addr: &BackendAddress,
) -> usize {
    let (conns, addr) = (conns.clone(), addr.clone());
    on(shards, i, move || {
        let taken: Vec<_> = std::iter::from_fn(|| conns.take_idle(&addr, None)).collect();
        let n = taken.len();
        for c in taken {
            c.finish();
        }
        n
    })
}

/// On stacks that take connections in turn, each lane has a connection of its own: a
/// request gets its lane's, whichever is newest, and none when its lane has none (it then
/// connects, and so reaches a child that holds no connection). Other stacks ignore lanes.
#[tokio::test]
async fn in_turn_a_lane_takes_its_own_connection_and_no_other() {
    let addr = BackendAddress::Unix("/nonexistent/backend.sock".into());
    let in_turn = Connections::with_reuse(
        2,
        Reuse {
            leave_reads: false,
            in_turn: true,
        },
    );
    let plain = Connections::new(2);
    let mut theirs = Vec::new();
    for conns in [&in_turn, &plain] {
        for lane in [0, 1] {
            let (mut conn, other_end) = pair();
            conn.lane = Some(lane);
            conn.served = 10 + u64::from(lane);
            conns.put(conn);
            theirs.push(other_end);
        }
    }
    assert!(
        in_turn.take_idle(&addr, Some(2)).is_none(),
        "lane 2 has none"
    );
    assert_eq!(in_turn.idle(&addr), 2, "and took no other lane's");
    let zero = in_turn.take_idle(&addr, Some(0)).unwrap();
    assert_eq!(zero.requests_served(), 10, "lane 0's, not the newest");
    assert_eq!(zero.lane, Some(0), "keeps its lane");
    assert!(in_turn.take_idle(&addr, Some(0)).is_none(), "one per lane");
    assert_eq!(
        in_turn.take_idle(&addr, None).unwrap().requests_served(),
        11
    );
    let newest = plain.take_idle(&addr, Some(0)).unwrap();
    assert_eq!(
        newest.requests_served(),
        11,
        "newest first where lanes mean nothing"
    );
    assert_eq!(newest.lane, Some(1));
}

//! Long-lived tasks that serve a CGI front listener's connections one after another.
//!
//! A front server that opens a connection per request (nginx's plain `fastcgi_pass` and its
//! `scgi_pass`) would make a tokio task per request: an aligned allocation for the task's
//! cell, a boxed connection future of several kilobytes, the spawn and the task's teardown.
//! Instead, each accept loop keeps a crew: a task that has served a connection waits, idle,
//! for the next one, and the accept loop hands a new connection to an idle task (a slot
//! under a lock, which with the per-thread scheduler no other serving thread takes, and a
//! wake-up of that task), spawning one only when none is idle. The connection's future is made inside the task's own state, which
//! lives as long as the task: nothing is allocated per connection for it.
//!
//! At most [`MAX_IDLE`] tasks wait per accept loop; one that ends its connection with that
//! many already idle ends too. When the accept loop ends (its listener stops, or shutdown),
//! the crew is dropped: idle tasks end at once, busy ones once their connection has ended,
//! so the connection tracker drains as it did with a task per connection.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{FrontTimeouts, ListenAddress};
use crate::front::limits::Ticket;
use crate::front::{fastcgi, scgi};
use crate::gateway::Gateway;
use crate::net::Stream;

/// Idle tasks one accept loop keeps at most: what the connections of a busy moment leave
/// behind, each holding a connection's state (a few kilobytes) while it waits.
const MAX_IDLE: usize = 64;

/// The CGI front a crew serves.
#[derive(Debug, Clone, Copy)]
pub enum Front {
    /// `fastcgi::serve_kept`.
    Fastcgi,
    /// `scgi::serve_connection`.
    Scgi,
}

/// One accepted connection for a crew task.
struct Job {
    stream: Stream,
    ticket: Ticket,
}

/// What every connection of the listener is served with.
struct Serve {
    front: Front,
    listener: Arc<ListenAddress>,
    timeouts: FrontTimeouts,
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
}

/// Where an idle task waits for its next connection.
#[derive(Default)]
struct Post {
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    job: Option<Job>,
    /// The waiting task's waker, kept between waits (the same task each time).
    waker: Option<Waker>,
    /// The crew has ended: the task ends instead of waiting.
    stop: bool,
}

/// The crew's idle tasks, shared by the accept loop and its tasks.
#[derive(Default)]
struct Idle {
    posts: Vec<Arc<Post>>,
    /// The accept loop has ended: a task that ends its connection ends too.
    closed: bool,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A task that panicked left nothing half-changed under these locks (each section only
    // moves an Option or a Vec element).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The tasks serving one accept loop's connections.
pub struct Crew {
    idle: Arc<Mutex<Idle>>,
    serve: Arc<Serve>,
    tracker: TaskTracker,
}

impl Crew {
    /// A crew for a CGI front listener, its tasks counted in `tracker`.
    pub fn new(
        front: Front,
        listener: Arc<ListenAddress>,
        timeouts: FrontTimeouts,
        gateway: Arc<Gateway>,
        shutdown: CancellationToken,
        tracker: TaskTracker,
    ) -> Crew {
        Crew {
            idle: Arc::default(),
            serve: Arc::new(Serve {
                front,
                listener,
                timeouts,
                gateway,
                shutdown,
            }),
            tracker,
        }
    }

    /// Serves `stream` in an idle task, or in a new one when none is idle.
    pub fn serve(&self, stream: Stream, ticket: Ticket) {
        let job = Job { stream, ticket };
        let post = locked(&self.idle).posts.pop();
        match post {
            Some(post) => {
                let mut slot = locked(&post.slot);
                slot.job = Some(job);
                if let Some(waker) = &slot.waker {
                    waker.wake_by_ref();
                }
            }
            None => {
                let work = work(
                    job,
                    Arc::default(),
                    Arc::clone(&self.idle),
                    Arc::clone(&self.serve),
                );
                // Boxed: the task's cell would otherwise be as large as a connection's state
                // and moved whole into it.
                self.tracker.spawn(Box::pin(work));
            }
        }
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        let posts = {
            let mut idle = locked(&self.idle);
            idle.closed = true;
            std::mem::take(&mut idle.posts)
        };
        for post in posts {
            let mut slot = locked(&post.slot);
            slot.stop = true;
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
    }
}

/// One crew task: serves `job`, then each connection it is handed, until the crew ends or
/// enough others are idle.
async fn work(mut job: Job, post: Arc<Post>, idle: Arc<Mutex<Idle>>, serve: Arc<Serve>) {
    // A FastCGI connection's state, and its inline answer's allocation, serve the next one.
    let kept = fastcgi::Kept::default();
    let mut spare = fastcgi::SpareAnswer::default();
    loop {
        let Job { stream, ticket } = job;
        let (listener, gateway) = (Arc::clone(&serve.listener), Arc::clone(&serve.gateway));
        let shutdown = serve.shutdown.clone();
        match serve.front {
            Front::Scgi => {
                scgi::serve_connection(stream, listener, ticket, serve.timeouts, gateway, shutdown)
                    .await
            }
            Front::Fastcgi => {
                let served = fastcgi::Served {
                    listener,
                    ticket,
                    timeouts: serve.timeouts,
                    gateway,
                    shutdown,
                };
                fastcgi::serve_kept(stream, served, &kept, &mut spare).await
            }
        }
        {
            let mut idle = locked(&idle);
            if idle.closed || idle.posts.len() >= MAX_IDLE {
                return;
            }
            idle.posts.push(Arc::clone(&post));
        }
        job = match next(&post).await {
            Some(job) => job,
            None => return,
        };
    }
}

/// The next connection handed to `post`, or `None` once the crew has ended.
async fn next(post: &Post) -> Option<Job> {
    std::future::poll_fn(|cx| {
        let mut slot = locked(&post.slot);
        if let Some(job) = slot.job.take() {
            return Poll::Ready(Some(job));
        }
        if slot.stop {
            return Poll::Ready(None);
        }
        if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            slot.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Crew, Front, MAX_IDLE};
    use crate::front::limits::{Admission, Client};
    use crate::gateway::{BuildSettings, Gateway};
    use crate::net::{QuietUnix, Stream};
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    /// Waits (at most 5 s) until `done` holds, letting the runtime run meanwhile.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..5000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("timed out waiting until {what}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_task_serves_connection_after_connection_and_the_idle_ones_end_with_the_crew() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[server]\nruntime_dir = \"{d}/run\"\n[[listen]]\naddress = \"unix:{d}/f.sock\"\n\
             protocol = \"fastcgi\"\n[pools.p]\nservers = [\"unix:{d}/none.sock\"]\n\
             [[contexts]]\npool = \"p\"\n",
            d = dir.path().display()
        );
        let config = crate::config::parse(&text, "t.toml").unwrap();
        let (gateway, drivers) = Gateway::build(&config, &BuildSettings::default()).unwrap();
        assert!(drivers.is_empty());
        let tracker = TaskTracker::new();
        let crew = Crew::new(
            Front::Fastcgi,
            Arc::new(config.listeners[0].bind.address()),
            config.listeners[0].timeouts,
            Arc::new(gateway),
            CancellationToken::new(),
            tracker.clone(),
        );
        let admission = Admission::new("front", 1024);
        let connect = || {
            let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
            let client = Client {
                listener: 0,
                addr: None,
                cap: None,
            };
            crew.serve(
                Stream::Unix(QuietUnix::from_tokio(ours).unwrap()),
                admission.admit(client).unwrap(),
            );
            theirs
        };
        // One connection after another: the task that served the first serves the rest.
        for n in 0..3 {
            let peer = connect();
            until("the connection is counted", || admission.open() == 1).await;
            drop(peer);
            until("the connection has ended", || admission.open() == 0).await;
            assert_eq!(
                tracker.len(),
                1,
                "connection {n} was given a task of its own"
            );
        }
        // Connections at once get tasks of their own; when they end, at most MAX_IDLE stay.
        let peers: Vec<_> = (0..MAX_IDLE + 8).map(|_| connect()).collect();
        until("every connection is counted", || {
            admission.open() == peers.len()
        })
        .await;
        assert_eq!(tracker.len(), MAX_IDLE + 8);
        drop(peers);
        until("the connections have ended", || admission.open() == 0).await;
        until("the tasks past the bound have ended", || {
            tracker.len() == MAX_IDLE
        })
        .await;
        // The accept loop's end ends the idle tasks.
        drop(crew);
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .expect("idle crew tasks ended with the crew");
    }
}

//! How many serving threads `corral run` starts when `[server] threads` is not set.
//!
//! The serving threads carry corral's own work: the front connections, the slot hand-off, the
//! backend exchanges. When corral spawns the workers, they run on the same CPUs and each of
//! their requests costs more CPU than corral's hop for it (php-cgi's hello world already
//! several times more, a real application hundreds of times more), so a serving thread per
//! CPU only takes CPU from them: on 2 CPUs, with 2 php-cgi workers, one serving thread
//! answered more requests than two (decision 31).
//! Servers a pool names on this machine (a Unix socket, a loopback address) are the same case:
//! php-fpm, gunicorn or Puma beside corral need the CPUs as much as spawned workers do, and on
//! 2 CPUs one serving thread in front of a local null FastCGI server spent less CPU per
//! request than two and answered as many (benches/RESULTS.md, "ab-threads-local").
//! When every pool is a pool of servers run elsewhere, corral's own work is the load on this
//! machine and a thread per CPU is what serves the most.
//!
//! The same rule decides whether the serving threads run under `SCHED_BATCH`
//! (`[server] sched_batch`, decision 45). Under Linux's default policy a thread woken by a
//! worker's write may take the CPU from that worker at once; a PHP page arrives in several
//! writes, and corral woken for each one relays each one, which wakes the front server in
//! turn. A batch thread woken while every CPU is busy waits for one to free up instead, and
//! then finds more of the page waiting: on WordPress at c=10, corral's context switches per
//! page fell by about a fifth and its CPU per page by 7% behind nginx and 15% on the http
//! listener (`benches/sched-batch.sh`). With an idle CPU it runs at once, as before.

use super::{Backend, BackendAddress, Config, Scheduler};

impl Config {
    /// The serving threads to start on a machine where corral may run on `cpus` CPUs:
    /// `[server] threads` when set; else half the CPUs (at least one) when a pool spawns its
    /// workers here or names a server on this machine, one per CPU when none does.
    pub fn serving_threads(&self, cpus: usize) -> usize {
        if let Some(n) = self.server.threads {
            return n as usize;
        }
        let cpus = cpus.max(1);
        if self.local_workers() {
            (cpus / 2).max(1)
        } else {
            cpus
        }
    }

    /// Whether the serving threads move to `SCHED_BATCH`: `[server] sched_batch` when set;
    /// else when the per-thread scheduler serves a pool that spawns its workers here or
    /// names a server on this machine. (The work-stealing runtime's threads also fork the
    /// workers, which would inherit the policy.)
    pub fn serving_sched_batch(&self) -> bool {
        self.server.sched_batch.unwrap_or_else(|| {
            self.server.scheduler == Scheduler::PerThread && self.local_workers()
        })
    }

    /// Whether a pool spawns its workers here or names a server on this machine.
    fn local_workers(&self) -> bool {
        self.pools.iter().any(|p| match &p.backend {
            Backend::Spawned(_) => true,
            Backend::External { servers } => servers.iter().any(on_this_machine),
        })
    }
}

/// A Unix socket, a loopback IP literal or `localhost`: a server that runs on these CPUs. Any
/// other name may resolve anywhere, so it counts as elsewhere.
fn on_this_machine(server: &BackendAddress) -> bool {
    match server {
        BackendAddress::Unix(_) => true,
        BackendAddress::Tcp { host, .. } => {
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(src: &str) -> Config {
        let src = format!("{LISTEN}{src}");
        match crate::config::parse(&src, "t.toml") {
            Ok(c) => c,
            Err(e) => panic!("{src}: {e:?}"),
        }
    }

    const LISTEN: &str = "[[listen]]\naddress = \"127.0.0.1:8080\"\nprotocol = \"http\"\n";
    const SPAWNED: &str =
        "[[contexts]]\nprefix = \"/a\"\nroot = \"/var/www/html\"\npool = \"php\"\n\
                           [pools.php]\ncommand = [\"php-cgi\"]\n";
    const SERVERS: &str = "[[contexts]]\nprefix = \"/b\"\npool = \"up\"\n\
                           [pools.up]\nservers = [\"10.0.0.7:9000\", \"app.internal:9000\"]\n";

    fn servers(list: &str) -> Config {
        parse(&format!(
            "[[contexts]]\npool = \"up\"\n[pools.up]\nservers = [{list}]\n"
        ))
    }

    #[test]
    fn spawned_workers_get_half_the_cpus_and_servers_elsewhere_all_of_them() {
        let spawned = parse(SPAWNED);
        assert_eq!(spawned.serving_threads(1), 1);
        assert_eq!(spawned.serving_threads(2), 1);
        assert_eq!(spawned.serving_threads(3), 1);
        assert_eq!(spawned.serving_threads(8), 4);
        let servers = parse(SERVERS);
        assert_eq!(servers.serving_threads(2), 2);
        assert_eq!(servers.serving_threads(8), 8);
        // One pool with local workers is enough for them to need the CPUs.
        let both = parse(&format!("{SPAWNED}{SERVERS}"));
        assert_eq!(both.serving_threads(2), 1);
        assert_eq!(parse(SERVERS).serving_threads(0), 1);
    }

    #[test]
    fn servers_on_this_machine_count_as_local_workers() {
        for local in [
            "\"unix:/run/php/php-fpm.sock\"",
            "\"127.0.0.1:9000\"",
            "\"127.0.0.2:9000\"",
            "\"[::1]:9000\"",
            "\"localhost:9000\"",
            "\"LocalHost:9000\"",
            "\"10.0.0.7:9000\", \"unix:/run/app.sock\"",
        ] {
            assert_eq!(servers(local).serving_threads(2), 1, "{local}");
            assert_eq!(servers(local).serving_threads(8), 4, "{local}");
        }
        for elsewhere in [
            "\"10.0.0.7:9000\"",
            "\"[2001:db8::1]:9000\"",
            "\"localhost.example.com:9000\"",
        ] {
            assert_eq!(servers(elsewhere).serving_threads(2), 2, "{elsewhere}");
        }
    }

    #[test]
    fn serving_threads_are_batch_by_default_where_workers_are_local() {
        assert!(parse(SPAWNED).serving_sched_batch());
        assert!(servers("\"unix:/run/php/php-fpm.sock\"").serving_sched_batch());
        assert!(!parse(SERVERS).serving_sched_batch());
        let stealing = parse(&format!(
            "{SPAWNED}[server]\nscheduler = \"work-stealing\"\n"
        ));
        assert!(
            !stealing.serving_sched_batch(),
            "never on by default with work-stealing"
        );
        let off = parse(&format!("{SPAWNED}[server]\nsched_batch = false\n"));
        assert!(!off.serving_sched_batch());
        let on = parse(&format!("{SERVERS}[server]\nsched_batch = true\n"));
        assert!(on.serving_sched_batch());
    }

    #[test]
    fn threads_when_set_wins() {
        let set = parse(&format!("{SPAWNED}[server]\nthreads = 2\n"));
        assert_eq!(set.serving_threads(2), 2);
        assert_eq!(set.serving_threads(16), 2);
    }
}

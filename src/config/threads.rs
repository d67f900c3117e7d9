//! How many serving threads `corral run` starts when `[server] threads` is not set.
//!
//! The serving threads carry corral's own work: the front connections, the slot hand-off, the
//! backend exchanges. When corral spawns the workers, they run on the same CPUs and each of
//! their requests costs more CPU than corral's hop for it (php-cgi's hello world already
//! several times more, a real application hundreds of times more), so a serving thread per
//! CPU only takes CPU from them: on 2 CPUs, with 2 php-cgi workers, one serving thread
//! answered more requests than two (decision 31).
//! When every pool is a pool of servers run elsewhere, corral's own work is the load on this
//! machine and a thread per CPU is what serves the most.

use super::{Backend, Config};

impl Config {
    /// The serving threads to start on a machine where corral may run on `cpus` CPUs:
    /// `[server] threads` when set; else half the CPUs (at least one) when a pool spawns its
    /// workers here, one per CPU when none does.
    pub fn serving_threads(&self, cpus: usize) -> usize {
        if let Some(n) = self.server.threads {
            return n as usize;
        }
        let cpus = cpus.max(1);
        let local_workers = self
            .pools
            .iter()
            .any(|p| matches!(p.backend, Backend::Spawned(_)));
        if local_workers {
            (cpus / 2).max(1)
        } else {
            cpus
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
                           [pools.up]\nservers = [\"127.0.0.1:9000\"]\n";

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
    fn threads_when_set_wins() {
        let set = parse(&format!("{SPAWNED}[server]\nthreads = 2\n"));
        assert_eq!(set.serving_threads(2), 2);
        assert_eq!(set.serving_threads(16), 2);
    }
}

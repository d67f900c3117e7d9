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

use super::{Backend, BackendAddress, Config};

impl Config {
    /// The serving threads to start on a machine where corral may run on `cpus` CPUs:
    /// `[server] threads` when set; else half the CPUs (at least one) when a pool spawns its
    /// workers here or names a server on this machine, one per CPU when none does.
    pub fn serving_threads(&self, cpus: usize) -> usize {
        if let Some(n) = self.server.threads {
            return n as usize;
        }
        let cpus = cpus.max(1);
        let local_workers = self.pools.iter().any(|p| match &p.backend {
            Backend::Spawned(_) => true,
            Backend::External { servers } => servers.iter().any(on_this_machine),
        });
        if local_workers {
            (cpus / 2).max(1)
        } else {
            cpus
        }
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
    fn threads_when_set_wins() {
        let set = parse(&format!("{SPAWNED}[server]\nthreads = 2\n"));
        assert_eq!(set.serving_threads(2), 2);
        assert_eq!(set.serving_threads(16), 2);
    }
}

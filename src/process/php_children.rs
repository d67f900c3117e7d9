//! A php-cgi worker that is a parent of children (`php_children`, src/config/php_children.rs;
//! ARCHITECTURE.md, "Shared OPcache"): its environment, and which of its processes are
//! children.
//!
//! php-cgi with `PHP_FCGI_CHILDREN=N` starts, creates its OPcache shared memory, makes itself
//! a session leader, forks N children that all accept on fd 0, and then only waits: whenever
//! a child exits (after `PHP_FCGI_MAX_REQUESTS` requests, on a crash or a kill) it forks
//! another, which inherits the same OPcache. On SIGTERM the parent sends SIGTERM to its
//! process group and exits.
//!
//! A child serves one connection at a time, every request on it, until the connection is
//! closed. Behind the gateway each child holds one of corral's kept connections, so its
//! children get `PHP_FCGI_MAX_REQUESTS=0` ([`kept`]): a child that exited at its limit would
//! close its connection just after its last response, and a request corral sent on it in
//! that moment (a POST may not be sent twice) would be lost. corral recycles the whole
//! group instead (`PoolSpec::group_of_children`). A direct pool's children accept the front
//! server's connections, not corral's, and count their own requests ([`for_worker`]).

use std::collections::BTreeMap;

use crate::config::PhpChildren;

/// Sets the variables that make php-cgi a parent of `group.children` children, each exiting
/// after `group.max_requests` requests (0 = never), over whatever the pool's `env` and the
/// single-process defaults set.
pub fn pin_environment(group: &PhpChildren, env: &mut BTreeMap<String, String>) {
    env.insert("PHP_FCGI_CHILDREN".into(), group.children.to_string());
    let max = group.max_requests.unwrap_or(0);
    env.insert("PHP_FCGI_MAX_REQUESTS".into(), max.to_string());
}

/// The group behind the gateway: children that never exit on their own (see the module
/// doc); corral counts the group's requests.
pub fn kept(group: &PhpChildren) -> PhpChildren {
    PhpChildren {
        children: group.children,
        max_requests: None,
        max_requests_jitter: 0,
    }
}

/// The group for direct-pool worker number `key`: `max_requests` with this worker's share of
/// the jitter, counted by each child.
pub fn for_worker(group: &PhpChildren, key: u64) -> PhpChildren {
    PhpChildren {
        children: group.children,
        max_requests: Some(group.child_max_requests(key)).filter(|&m| m > 0),
        max_requests_jitter: 0,
    }
}

/// The children of the php-cgi parent `parent`, from `/proc/PARENT/task/*/children`
/// (the kernel's list of a process's children); empty when it is gone.
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        pids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids.sort_unstable();
    pids
}

/// The PSS (RSS where PSS cannot be read) of the largest child of `parent`, each child
/// measured alone (its own process tree): what `max_memory` is compared with for a
/// php_children worker, so a limit means the same per PHP process as in a pool without it.
/// `None` when the parent has no children to measure.
pub fn largest_child(parent: u32) -> Option<u64> {
    children_of(parent)
        .into_iter()
        .filter_map(|child| super::memory::process_tree_pss(child).ok())
        .map(|usage| usage.bytes())
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_makes_a_parent_and_sets_the_child_limit() {
        let mut env = BTreeMap::from([("PHP_FCGI_MAX_REQUESTS".to_string(), "0".to_string())]);
        let group = PhpChildren {
            children: 4,
            max_requests: Some(120),
            max_requests_jitter: 0,
        };
        pin_environment(&group, &mut env);
        assert_eq!(env["PHP_FCGI_CHILDREN"], "4");
        assert_eq!(env["PHP_FCGI_MAX_REQUESTS"], "120");
    }

    #[test]
    fn a_group_behind_the_gateway_has_children_that_never_exit_on_their_own() {
        let group = PhpChildren {
            children: 3,
            max_requests: Some(500),
            max_requests_jitter: 50,
        };
        let mut env = BTreeMap::new();
        pin_environment(&kept(&group), &mut env);
        assert_eq!(env["PHP_FCGI_CHILDREN"], "3");
        assert_eq!(env["PHP_FCGI_MAX_REQUESTS"], "0");
    }

    #[test]
    fn each_worker_gets_its_own_jitter_within_the_range() {
        let group = PhpChildren {
            children: 2,
            max_requests: Some(100),
            max_requests_jitter: 10,
        };
        let limits: Vec<u64> = (0..20)
            .map(|k| for_worker(&group, k).max_requests.unwrap())
            .collect();
        assert!(limits.iter().all(|m| (100..=110).contains(m)), "{limits:?}");
        let first = limits[0];
        assert!(limits.iter().any(|&m| m != first), "{limits:?}");
        let never = PhpChildren {
            max_requests: None,
            ..group
        };
        assert_eq!(for_worker(&never, 3).max_requests, None);
    }

    #[test]
    fn a_process_that_is_gone_has_no_children() {
        assert!(children_of(u32::MAX).is_empty());
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let listed = children_of(std::process::id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(listed.contains(&child.id()), "{listed:?}");
    }
}

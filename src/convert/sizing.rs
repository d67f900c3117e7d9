//! A pool's process manager (`pm` and its counts) as corral's `mode`, `min`, `max`,
//! `php_children`, `spare_min`, `spare_max`, `idle_timeout` and `max_requests`, with the
//! checks php-fpm makes on them once every pool is read (each an error at its line).
//!
//! php-fpm's children, whatever its `pm`, share the OPcache their master created; separate
//! php-cgi workers would each compile the application into their own (on WordPress ~30 MiB
//! more PSS and ~15% more CPU per page each: docs/pools.md, "Shared OPcache"), on a machine
//! sized for php-fpm. So every pool of at most `MAX_PHP_CHILDREN` children becomes one
//! php-cgi parent forking `pm.max_children` children (`max = 1`, `php_children`): `static`
//! and `dynamic` as a static group (all children forked at start: php-fpm's process count at
//! full load, never more), `ondemand` as an ondemand group (started by the first request,
//! stopped when idle). Above that bound each stays separate workers sized as php-fpm sized
//! its children.

use std::collections::BTreeSet;

use super::emit::{string, Table};
use super::fpm::{Directive, Pool};
use super::Ctx;

/// Whether `pool` becomes one php-cgi parent and its children (`max = 1`, `php_children =
/// pm.max_children`): every pool whose `pm.max_children` one parent may fork.
pub fn is_group(pool: &Pool) -> bool {
    let max = pool.get("pm.max_children").map_or(0, Directive::number);
    (1..=i64::from(crate::config::MAX_PHP_CHILDREN)).contains(&max)
}

/// Why a dynamic pool's spare settings have no equivalent once it is a group.
const GROUP_FORKS_ALL: &str = "php-cgi's parent forks all its children at once, so the pool \
     runs pm.max_children processes from the start: as many as php-fpm at full load, never more";

/// `pm` and its counts as `mode`, `min`, `max`, `php_children`, `spare_min`, `spare_max`,
/// `idle_timeout`, `max_requests`, with php-fpm's own checks.
pub fn pm<'p>(
    pool: &'p Pool,
    table: &mut Table,
    used: &mut BTreeSet<&str>,
    ctx: &Ctx,
) -> Result<(), (Option<&'p Directive>, String)> {
    used.extend([
        "pm",
        "pm.max_children",
        "pm.min_spare_servers",
        "pm.max_spare_servers",
        "pm.start_servers",
        "pm.max_requests",
    ]);
    let Some(pm) = pool.get("pm") else {
        return Err((
            None,
            "the process manager is missing (static, dynamic or ondemand)".to_owned(),
        ));
    };
    let n = |key: &str| pool.get(key).map_or(0, Directive::number);
    let max = n("pm.max_children");
    if max < 1 {
        return Err((
            pool.get("pm.max_children").or(Some(pm)),
            "pm.max_children must be a positive value".to_owned(),
        ));
    }
    let kind = pm.text();
    let group = is_group(pool);
    match (kind.as_str(), group) {
        ("dynamic", true) => table.set(
            "mode",
            &string("static"),
            "pm = dynamic: the group's children are all forked at start",
        ),
        ("ondemand", true) => table.set(
            "mode",
            &string("ondemand"),
            "pm = ondemand: the group starts at the first request and stops after \
             idle_timeout, so an idle pool costs no process, as php-fpm's",
        ),
        _ => table.set("mode", &string(&kind), "pm"),
    }
    if group {
        table.set(
            "max",
            "1",
            "one php-cgi parent, whose children (php_children) take the requests",
        );
        table.set(
            "php_children",
            &max.to_string(),
            "pm.max_children: forked by that parent, they share its OPcache as php-fpm's \
             children share their master's (separate php-cgi workers would each compile the \
             application again: docs/pools.md, \"Shared OPcache\"); never more processes than \
             php-fpm's peak",
        );
    } else {
        table.set("max", &max.to_string(), "pm.max_children");
    }
    match kind.as_str() {
        "dynamic" => {
            let (lo, hi, start) = (
                n("pm.min_spare_servers"),
                n("pm.max_spare_servers"),
                n("pm.start_servers"),
            );
            let at = |k: &str| pool.get(k).or(Some(pm));
            if lo <= 0 || hi <= 0 {
                return Err((at(if lo <= 0 { "pm.min_spare_servers" } else { "pm.max_spare_servers" }), format!("pm.min_spare_servers({lo}) and pm.max_spare_servers({hi}) must be positive values")));
            }
            if lo > max || hi > max {
                return Err((at("pm.max_spare_servers"), format!("pm.min_spare_servers({lo}) and pm.max_spare_servers({hi}) cannot be greater than pm.max_children({max})")));
            }
            if hi < lo {
                return Err((at("pm.max_spare_servers"), format!("pm.max_spare_servers({hi}) must not be less than pm.min_spare_servers({lo})")));
            }
            if start > 0 && (start < lo || start > hi) {
                return Err((at("pm.start_servers"), format!("pm.start_servers({start}) must not be less than pm.min_spare_servers({lo}) and not greater than pm.max_spare_servers({hi})")));
            }
            let default_start = lo + (hi - lo) / 2;
            if group {
                match pool.get("pm.start_servers") {
                    Some(d) => table.note(&ctx.not_mapped(d, GROUP_FORKS_ALL)),
                    None => table.note(&format!(
                        "pm.start_servers not set (php-fpm starts {default_start}): not mapped: {GROUP_FORKS_ALL}"
                    )),
                }
                for d in ["pm.min_spare_servers", "pm.max_spare_servers"]
                    .into_iter()
                    .filter_map(|key| pool.get(key))
                {
                    table.note(&ctx.not_mapped(d, GROUP_FORKS_ALL));
                }
            } else {
                table.set(
                    "min",
                    &lo.to_string(),
                    "pm.min_spare_servers: php-fpm keeps that many idle, so never fewer workers",
                );
                table.set("spare_min", &lo.to_string(), "pm.min_spare_servers");
                table.set("spare_max", &hi.to_string(), "pm.max_spare_servers");
                let why =
                    "corral starts min workers, then spawns while fewer than spare_min are idle";
                match pool.get("pm.start_servers") {
                    Some(d) => table.note(&ctx.not_mapped(d, why)),
                    None => table.note(&format!(
                        "pm.start_servers not set (php-fpm starts {default_start}): {why}"
                    )),
                }
            }
        }
        "ondemand" => {
            used.insert("pm.process_idle_timeout");
            let idle = pool
                .get("pm.process_idle_timeout")
                .map_or(10, Directive::number);
            if idle < 1 {
                return Err((
                    pool.get("pm.process_idle_timeout"),
                    format!("pm.process_idle_timeout({idle}s) must be greater than 0s"),
                ));
            }
            let why = if pool.get("pm.process_idle_timeout").is_some() {
                "pm.process_idle_timeout"
            } else {
                "php-fpm's default pm.process_idle_timeout"
            };
            table.set("idle_timeout", &string(&format!("{idle}s")), why);
            for key in [
                "pm.start_servers",
                "pm.min_spare_servers",
                "pm.max_spare_servers",
            ] {
                if let Some(d) = pool.get(key) {
                    table.note(&ctx.not_mapped(d, "php-fpm ignores it in an ondemand pool"));
                }
            }
        }
        _ => {
            for key in [
                "pm.start_servers",
                "pm.min_spare_servers",
                "pm.max_spare_servers",
            ] {
                if let Some(d) = pool.get(key) {
                    table.note(&ctx.not_mapped(d, "php-fpm ignores it in a static pool"));
                }
            }
        }
    }
    match pool.get("pm.max_requests") {
        Some(d) if d.number() > 0 && group => table.set("max_requests", &d.number().to_string(), "pm.max_requests, per child: corral replaces the whole group, new first, after this many per child (plus up to 10% jitter)"),
        Some(d) if d.number() > 0 => table.set("max_requests", &d.number().to_string(), "pm.max_requests (corral adds up to 10% jitter so workers do not all recycle at once; max_requests_jitter = 0 to turn it off)"),
        Some(d) => table.note(&ctx.not_mapped(d, "0: never recycled, corral's default too")),
        None => {}
    }
    Ok(())
}

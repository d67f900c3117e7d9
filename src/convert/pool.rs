//! One php-fpm pool as corral tables: a FastCGI `[[listen]]` on the pool's `listen` address,
//! a php-cgi `[pools.NAME]` in gateway mode, and a `[[contexts]]` per allowed script
//! extension tying them, with the document root corral's script guard checks. php-fpm's
//! checks made once every pool is read (listen, pm and its counts, the status and ping
//! paths, slowlog against the terminate timeout) are made here, each an error at the line.
//!
//! Every directive of the pool comes out once: mapped (the corral line's comment names it)
//! or as a comment saying why not and what is nearest.

use std::collections::BTreeSet;

use super::emit::{array, string, Table};
use super::fpm::{Directive, FpmError, Pool, Typed};
use super::listen::{listen_access, listen_address};
use super::sizing::{is_group, pm};
use super::Ctx;

/// What one pool becomes.
pub struct PoolOut {
    /// Its corral name.
    pub name: String,
    /// The `[[listen]]` address (unique over pools, as php-fpm requires).
    pub address: String,
    /// `[[listen]]`, `[pools.NAME]` and the `[[contexts]]`, in order.
    pub tables: Vec<Table>,
    /// `[server]` keys php-fpm sets per pool: `(key, value, why)`.
    pub server: Vec<(&'static str, String, String)>,
}

/// Converts `pool`, named `name` in corral.
pub fn convert(pool: &Pool, name: String, ctx: &Ctx) -> Result<PoolOut, FpmError> {
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let err_at = |d: Option<&Directive>, message: String| FpmError {
        at: d.map_or_else(|| pool.at.clone(), |d| d.at.clone()),
        message: format!("[pool {}] {message}", pool.name),
    };
    let get = |key: &str| pool.get(key);
    let mut listen = Table::new("[[listen]]");
    let mut table = Table::new(&format!("[pools.{name}]"));
    if name != pool.name {
        table.note(&format!(
            "php-fpm's pool [{}] is named \"{name}\" here (corral's names: 1-32 of A-Z a-z 0-9 _ -)",
            pool.name
        ));
    }
    let prefix = get("prefix").map(Directive::text);
    used.insert("prefix");
    if let Some(p) = &prefix {
        table.note(&format!(
            "prefix = {p}: this pool's relative paths were taken from it"
        ));
    }
    let full = |path: &str| ctx.full_path(path, prefix.as_deref());

    // [[listen]]
    let Some(l) = get("listen").filter(|d| !d.text().is_empty()) else {
        return Err(err_at(
            None,
            "no listen address has been defined".to_owned(),
        ));
    };
    used.insert("listen");
    let (address, tcp, how) = listen_address(&l.text(), &full).map_err(|m| err_at(Some(l), m))?;
    listen.set(
        "address",
        &string(&address),
        &format!("listen = {}{how}", l.text()),
    );
    if let Some(path) = address.strip_prefix("unix:") {
        listen.note(&super::listen::socket_dir_note(path));
    }
    listen.set(
        "protocol",
        &string("fastcgi"),
        "php-fpm speaks FastCGI to nginx",
    );
    listen_access(pool, &address, tcp, &mut listen, &mut used)
        .map_err(|(d, m)| err_at(Some(d), m))?;
    let backlog = get("listen.backlog");
    used.insert("listen.backlog");
    match backlog.map(Directive::number) {
        Some(n) if n > 0 => listen.set("backlog", &n.to_string(), "listen.backlog"),
        Some(0) => listen.set("backlog", "1", "listen.backlog = 0 (corral's least is 1)"),
        n => listen.set(
            "backlog",
            &ctx.somaxconn.to_string(),
            &format!(
                "{}: the kernel's maximum (net.core.somaxconn)",
                if n.is_some() {
                    "listen.backlog = -1"
                } else {
                    "php-fpm's default on Linux, -1"
                }
            ),
        ),
    }
    for (key, corral) in [
        ("pm.status_path", "status_path"),
        ("ping.path", "ping_path"),
    ] {
        used.insert(key);
        let Some(d) = get(key).filter(|d| !d.text().is_empty()) else {
            continue;
        };
        let path = d.text();
        let ok_chars = path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_.~".contains(&b));
        if !path.starts_with('/') || path.len() < 2 || !ok_chars {
            return Err(err_at(
                Some(d),
                format!("{key} '{path}' must start with '/', be longer than that and hold only letters, digits and / - _ . ~"),
            ));
        }
        let why = if corral == "status_path" {
            "pm.status_path: answered by corral in php-fpm's formats (?json, ?full)"
        } else {
            "ping.path"
        };
        listen.set(corral, &string(&path), why);
    }
    used.insert("ping.response");
    if let Some(d) = get("ping.response") {
        if d.text() == "pong" || get("ping.path").is_none() {
            listen.note(&ctx.not_mapped(d, "corral's ping_path answers \"pong\"; php-fpm uses ping.response only with ping.path"));
        } else {
            listen.note(&ctx.not_mapped(d, "corral's ping_path always answers \"pong\": a monitor expecting this text needs changing"));
        }
    }

    // [pools.NAME]
    let mut command = vec![ctx.php_cgi.clone()];
    if let Some(ini) = &ctx.php_ini.file {
        command.push("-c".to_owned());
        command.push(ini.display().to_string());
    }
    let mut defines = Vec::new();
    for kind in ["php_value", "php_flag", "php_admin_value", "php_admin_flag"] {
        for d in arrays(pool, kind) {
            defines.push(d.written());
            command.push("-d".to_owned());
            command.push(php_define(d));
        }
    }
    let mut why =
        "php-cgi gets its socket on fd 0 (gateway mode: corral queues and dispatches)".to_owned();
    if ctx.php_ini.file.is_some() {
        why.push_str("; -c: php-fpm's php.ini, not php-cgi's own");
    }
    if !defines.is_empty() {
        why = format!(
            "{why}; each -d is one of: {} (php_admin_* values are last, so they win; php-cgi \
             cannot lock them against ini_set as php-fpm does)",
            defines.join(", ")
        );
    }
    table.set("command", &array(&command), &why);
    pm(pool, &mut table, &mut used, ctx).map_err(|(d, m)| err_at(d, m))?;
    used.insert("user");
    used.insert("group");
    match get("user").filter(|d| !d.text().is_empty()) {
        Some(u) => {
            table.set("user", &string(&u.text()), "user");
            match get("group").filter(|d| !d.text().is_empty()) {
                Some(g) => table.set("group", &string(&g.text()), "group"),
                None => match primary_group(&u.text()) {
                    Some(g) => table.set("group", &string(&g), "php-fpm's default: the user's primary group"),
                    None => table.note("group: php-fpm takes the user's primary group; that user is not on this machine, so say group = \"...\""),
                },
            }
        }
        None => {
            table.note("user: not set; php-fpm runs the pool as its own user, corral as [server] user (default \"nobody\" when corral is root)");
            if let Some(g) = get("group") {
                table.set("group", &string(&g.text()), "group");
            }
        }
    }
    used.insert("chdir");
    if let Some(d) = get("chdir").filter(|d| !d.text().is_empty()) {
        table.set("cwd", &string(&full(&d.text())), "chdir");
    }
    used.insert("request_terminate_timeout");
    let terminate = get("request_terminate_timeout").map_or(0, Directive::number);
    match get("request_terminate_timeout") {
        Some(d) if terminate > 0 && is_group(pool) => table.set("request_timeout", &string(&format!("{terminate}s")), &format!("{}: then 504 at once, and the group is replaced, stopped once its other children's requests are done", d.written())),
        Some(d) if terminate > 0 => table.set("request_timeout", &string(&format!("{terminate}s")), &format!("{}: then 504 and the worker is killed and replaced", d.written())),
        Some(d) => table.note(&ctx.not_mapped(d, "0 is off in php-fpm; corral's request_timeout cannot be off and stays at its default, 300s (PHP's max_execution_time still applies)")),
        None => table.note("request_terminate_timeout: not set (off in php-fpm); corral's request_timeout stays at its default, 300s"),
    }
    table.note("php-fpm has no queue timeout (a request waits in the listen backlog until the front server gives up); corral queues queue_size = 128 requests for queue_timeout = \"5s\", then answers 503");
    env(pool, &mut table, ctx);

    // [server] keys.
    let mut server = Vec::new();
    used.extend(["slowlog", "request_slowlog_timeout", "access.log"]);
    let slow = get("request_slowlog_timeout").map_or(0, Directive::number);
    if slow > 0 {
        if terminate > 0 && slow > terminate {
            return Err(err_at(get("request_slowlog_timeout"), format!("'request_slowlog_timeout' ({slow}) can't be greater than 'request_terminate_timeout' ({terminate})")));
        }
        server.push((
            "slow_threshold",
            string(&format!("{slow}s")),
            format!("[{}] request_slowlog_timeout", pool.name),
        ));
        match get("slowlog").filter(|d| !d.text().is_empty()) {
            Some(d) => server.push(("slow_log", string(&full(&d.text())), format!("[{}] slowlog: corral writes the request's timing split (queue, connect, head, total), not a PHP backtrace", pool.name))),
            None => table.note("request_slowlog_timeout without slowlog: corral logs slow requests to stderr"),
        }
    } else {
        for key in ["request_slowlog_timeout", "slowlog"] {
            if let Some(d) = get(key) {
                table.note(&ctx.not_mapped(d, "slow requests are logged only with request_slowlog_timeout above 0 (corral's slow_threshold)"));
            }
        }
    }
    if let Some(d) = get("access.log").filter(|d| !d.text().is_empty()) {
        server.push((
            "access_log",
            string(&full(&d.text())),
            format!(
                "[{}] access.log: one line per request, its pool in pool=",
                pool.name
            ),
        ));
    }

    used.insert("security.limit_extensions");
    for d in pool.directives.iter().filter(|d| d.index.is_none()) {
        let last = get(&d.name).is_some_and(|l| l.at == d.at);
        if !last {
            table.note(&ctx.not_mapped(d, "overridden by a later line, as in php-fpm"));
        } else if !used.contains(d.name.as_str()) {
            let pm = get("pm").map(Directive::text);
            table.note(&ctx.not_mapped(d, why_not(d, pm.as_deref(), is_group(pool))));
        }
    }
    for d in pool.directives.iter().filter(|d| d.index.is_some()) {
        if d.name == "access.suppress_path" {
            table.note(&ctx.not_mapped(d, "corral logs every request that reached a pool"));
        } else if !arrays(pool, &d.name).iter().any(|l| l.at == d.at) {
            table.note(&ctx.not_mapped(d, "overridden by a later line, as in php-fpm"));
        }
    }

    let mut tables = vec![listen, table];
    tables.extend(contexts(pool, &name, &address, ctx));
    Ok(PoolOut {
        name,
        address,
        tables,
        server,
    })
}

/// `env[...]` as the pool's `env`, and what corral does about `clear_env`.
fn env(pool: &Pool, table: &mut Table, ctx: &Ctx) {
    let mut pairs = Vec::new();
    let mut why = Vec::new();
    for d in arrays(pool, "env") {
        let key = d.index.clone().unwrap_or_default();
        if key == "PHP_FCGI_CHILDREN" || key == "PHP_FCGI_MAX_REQUESTS" {
            table.note(&ctx.not_mapped(
                d,
                "corral sizes and recycles the pool itself (php_children, max_requests)",
            ));
            continue;
        }
        let text = d.text();
        let value = match text.strip_prefix('$') {
            Some(var) => {
                why.push(format!(
                    "{key} copied from ${var} when converting (php-fpm reads it at start)"
                ));
                (ctx.env)(var).unwrap_or_default()
            }
            None => text,
        };
        pairs.push((key, value));
    }
    if let Some(dir) = &ctx.php_ini.scan_dir {
        if !pairs.iter().any(|(k, _)| k == "PHP_INI_SCAN_DIR") {
            pairs.push(("PHP_INI_SCAN_DIR".to_owned(), dir.display().to_string()));
            why.push("PHP_INI_SCAN_DIR: the conf.d php-fpm reads, not php-cgi's".to_owned());
        }
    }
    if !pairs.is_empty() {
        let inline: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{} = {}", super::emit::key(k), string(v)))
            .collect();
        let from_env = arrays(pool, "env").is_empty();
        let mut comment = if from_env {
            String::new()
        } else {
            "env[...]".to_owned()
        };
        if !why.is_empty() {
            let sep = if comment.is_empty() { "" } else { "; " };
            comment = format!("{comment}{sep}{}", why.join("; "));
        }
        table.set("env", &format!("{{ {} }}", inline.join(", ")), &comment);
    }
}

/// The array directives of one kind, the last of each key, in the order first given.
fn arrays<'p>(pool: &'p Pool, name: &str) -> Vec<&'p Directive> {
    let mut keys: Vec<&str> = Vec::new();
    for d in pool.directives.iter().filter(|d| d.name == name) {
        let k = d.index.as_deref().unwrap_or("");
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.iter()
        .filter_map(|k| {
            pool.directives
                .iter()
                .rev()
                .find(|d| d.name == name && d.index.as_deref() == Some(k))
        })
        .collect()
}

/// A `php_value` and friends as php-cgi's `-d NAME=VALUE`, so php-cgi's INI parser reads
/// what php-fpm's did: a plain value as written (constants and expressions such as
/// `E_ALL & ~E_NOTICE` keep working), anything else quoted. php-cgi itself quotes a value
/// starting with neither a letter, a digit nor a quote, so such a one is quoted here too.
fn php_define(d: &Directive) -> String {
    let key = d.index.clone().unwrap_or_default();
    if let Typed::Bool(b) = d.typed {
        return format!("{key}={}", u8::from(b));
    }
    let text = d.text();
    let starts_plain = text
        .chars()
        .next()
        .is_none_or(|c| c.is_ascii_alphanumeric());
    if d.value.plain && starts_plain && !text.contains('$') {
        return format!("{key}={text}");
    }
    let escaped = text
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('$', "\\$");
    format!("{key}=\"{escaped}\"")
}

/// One `[[contexts]]` per extension in `security.limit_extensions` (php-fpm's default
/// `.php .phar`): the script guard allows one extension per context.
fn contexts(pool: &Pool, name: &str, address: &str, ctx: &Ctx) -> Vec<Table> {
    let limit = pool.get("security.limit_extensions");
    let text = limit.map_or_else(|| ".php .phar".to_owned(), Directive::text);
    let mut exts: Vec<String> = Vec::new();
    let mut skipped = Vec::new();
    for word in text.split([' ', '\t']).filter(|w| !w.is_empty()) {
        match word.strip_prefix('.') {
            Some(e) if !e.is_empty() && e.bytes().all(|b| b.is_ascii_alphanumeric()) => {
                if !exts.iter().any(|x| x == e) {
                    exts.push(e.to_owned());
                }
            }
            _ => skipped.push(word.to_owned()),
        }
    }
    let why_ext = match limit {
        Some(d) => d.written(),
        None => "php-fpm's default security.limit_extensions = .php .phar".to_owned(),
    };
    if exts.is_empty() {
        exts.push("php".to_owned());
    }
    let mut out = Vec::new();
    for (i, ext) in exts.iter().enumerate() {
        let mut t = Table::new("[[contexts]]");
        if i == 0 {
            t.note(&format!("the script guard: before any worker is asked, SCRIPT_FILENAME must be a real .{ext} file under root, else 404 ({why_ext})"));
            if !skipped.is_empty() {
                t.note(&format!("security.limit_extensions {}: not mapped: corral's guard takes one extension of letters and digits per context", skipped.join(" ")));
            }
            if text.trim().is_empty() {
                t.note("security.limit_extensions is empty (php-fpm then runs any file): corral always guards, here with .php");
            }
        }
        t.set(
            "listen",
            &string(address),
            "requests from this pool's listener",
        );
        if i > 0 {
            t.set("extension", &string(ext), &why_ext);
        }
        t.set("root", &string(&ctx.root), "--root: the directory the front server's root names (php-fpm has none; nginx sends SCRIPT_FILENAME under it)");
        t.set("pool", &string(name), "");
        out.push(t);
    }
    out
}

/// Why a pool directive that has no corral key is left out, and what is nearest; `group`:
/// the pool is one php-cgi parent and its children (`sizing::is_group`).
fn why_not(d: &Directive, pm: Option<&str>, group: bool) -> &'static str {
    match d.name.as_str() {
        "listen.acl_users" | "listen.acl_groups" => "corral sets no POSIX ACL on a socket; nearest: owner, group and mode on the [[listen]]",
        "listen.setfib" => "FreeBSD only",
        "process.priority" => "corral sets no nice value per pool; nearest: Nice= in corral's systemd unit (corral and every worker)",
        "process.dumpable" => "corral leaves workers' dumpable flag as the kernel sets it",
        "pm.max_spawn_rate" if group => "php-cgi's parent forks all its children at once",
        "pm.max_spawn_rate" => "corral spawns what spare_min asks for at once, without a rate",
        "pm.process_idle_timeout" if pm != Some("ondemand") && group => "php-fpm uses it in ondemand pools only; this pool's group of children runs from start to stop",
        "pm.process_idle_timeout" if pm != Some("ondemand") => "php-fpm uses it in ondemand pools only; corral's idle_timeout (default 10s) retires idle workers above min",
        "pm.status_listen" => "corral serves status on its own [status] listener (php-fpm's field names, ?json, ?full), not a second FastCGI socket; nearest: [status] address",
        "access.format" => "corral writes nginx's combined format plus its own fields (access_log_format = \"text\") or JSON",
        "request_slowlog_trace_depth" => "corral's slow log has the request's timing split, not a PHP backtrace",
        "request_terminate_timeout_track_finished" => "corral's request_timeout runs until the response is complete",
        "rlimit_files" => "corral has no per-pool file limit: workers get the limit corral was started with (LimitNOFILE= in its systemd unit)",
        "rlimit_core" => "corral has no per-pool core limit: LimitCORE= in its systemd unit",
        "chroot" => "corral does not chroot workers; nearest: RootDirectory= or ProtectSystem= in its systemd unit",
        "catch_workers_output" if d.flag() => "corral always logs workers' stdout and stderr, one event per line with the pool and pid",
        "catch_workers_output" => "corral always logs workers' stdout and stderr (php-fpm would discard them)",
        "decorate_workers_output" => "corral's log events always carry the pool and the worker's pid as fields",
        "clear_env" if d.flag() => "corral clears workers' environment too: they get PATH and the pool's env only",
        "clear_env" => "corral always clears workers' environment (PATH and the pool's env only): list what scripts need in env",
        "apparmor_hat" => "corral changes no AppArmor hat; nearest: AppArmorProfile= in its systemd unit",
        _ => "corral has no such setting",
    }
}

/// The name of `user`'s primary group on this machine.
pub fn primary_group(user: &str) -> Option<String> {
    let uid_or_name = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .or_else(|| {
            let uid = user.parse().ok()?;
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
        })?;
    nix::unistd::Group::from_gid(uid_or_name.gid)
        .ok()
        .flatten()
        .map(|g| g.name)
}

//! Validation of one `[[contexts]]` table: its match keys (listener, prefix, extension,
//! host), its CGI settings (root, index, params) and its pool and connection cap.

use std::fmt::Write as _;

use super::file::{FileConfig, FileContext};
use super::validate::Errors;
use std::path::PathBuf;

use super::{ContextConfig, ListenAddress, ListenerConfig, PoolConfig};

/// Checks one context against the validated listeners and pools. `None` when it references
/// something that does not exist (the error is recorded).
pub(super) fn context(
    e: &mut Errors,
    c: &FileContext,
    listeners: &[ListenerConfig],
    pools: &[PoolConfig],
    file: &FileConfig,
) -> Option<ContextConfig> {
    let listen = c.listen.as_ref().and_then(|l| {
        let addr = e.check(l.span(), ListenAddress::parse(l.get_ref()))?;
        if listeners.iter().any(|x| x.bind.address() == addr) {
            return Some(addr);
        }
        let mut have = String::new();
        for (i, x) in listeners.iter().enumerate() {
            let _ = write!(
                have,
                "{}{}",
                if i == 0 { "" } else { ", " },
                x.bind.address()
            );
        }
        e.at(
            l.span(),
            format!("listen \"{addr}\" is not the address of any [[listen]] (they are: {have})"),
        );
        None
    });
    let listen_ok = c.listen.is_none() || listen.is_some();

    let prefix = match &c.prefix {
        None => "/".to_owned(),
        Some(p) => {
            if let Err(m) = check_prefix(p.get_ref()) {
                e.at(p.span(), m);
            }
            p.get_ref().clone()
        }
    };
    let extension = c.extension.as_ref().map(|x| {
        let ext = x.get_ref();
        if let Some(bare) = ext.strip_prefix('.') {
            e.at(
                x.span(),
                format!("extension is written without the dot: \"{bare}\", not \"{ext}\""),
            );
        } else if ext.is_empty()
            || !ext
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            e.at(
                x.span(),
                format!("extension \"{ext}\" may only hold letters, digits, '_' and '-'"),
            );
        }
        ext.clone()
    });
    let host = c.host.as_ref().map(|h| {
        let host = h.get_ref().to_ascii_lowercase();
        if let Err(m) = check_host(&host) {
            e.at(h.span(), m);
        }
        host
    });
    // SERVER_NAME pinned, so a script never sees the client's Host there.
    let server_name = c.server_name.as_ref().map(|h| {
        let name = h.get_ref().to_ascii_lowercase();
        match check_host(&name) {
            Err(m) => e.at(h.span(), format!("server_name: {m}")),
            Ok(()) if name.starts_with("*.") => e.at(
                h.span(),
                format!("server_name \"{name}\" must be one host name, not a wildcard"),
            ),
            Ok(()) => {}
        }
        name
    });
    let root = c.root.as_ref().and_then(|r| e.absolute_path(r, "root"));

    let index = match &c.index {
        None if root.is_some() => vec!["index.php".to_owned()],
        None => Vec::new(),
        Some(list) => {
            if c.root.is_none() {
                e.at(list.span(), "index needs a root to look files up in");
            }
            for name in list.get_ref() {
                let n = name.get_ref();
                if n.is_empty() || n == "." || n == ".." || n.contains(['/', '\0']) {
                    e.at(
                        name.span(),
                        format!("index entry \"{n}\" must be a plain file name"),
                    );
                }
            }
            list.get_ref().iter().map(|n| n.get_ref().clone()).collect()
        }
    };
    let static_files = c.static_files.as_ref().is_some_and(|s| *s.get_ref());
    if let Some(s) = c
        .static_files
        .as_ref()
        .filter(|_| static_files && c.root.is_none())
    {
        e.at(
            s.span(),
            "static_files = true needs a root to serve files from",
        );
    }
    let params = e.string_table(
        c.params.as_ref(),
        "params",
        |n| !n.is_empty() && n.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_'),
        "CGI parameter names hold only letters, digits and '_'",
    );

    let front_controller = c.front_controller.as_ref().and_then(|f| {
        let checked = check_front_controller(f.get_ref(), c, listen.as_ref(), listeners);
        e.check(f.span(), checked)
    });
    let sendfile_dirs = c
        .sendfile_dirs
        .iter()
        .flat_map(|list| list.get_ref())
        .filter_map(|d| {
            let dir = e.absolute_path(d, "sendfile_dirs entry")?;
            e.check(d.span(), clean_dir(d.get_ref(), "sendfile_dirs entry"))?;
            Some(dir)
        })
        .collect();
    let mut accel_redirect: Vec<(String, PathBuf)> = c
        .accel_redirect
        .iter()
        .flat_map(|t| t.get_ref())
        .filter_map(|(prefix, dir)| {
            let p = prefix.get_ref();
            let prefix_ok = p.starts_with('/')
                && p.ends_with('/')
                && !p.split('/').any(|s| s == "." || s == "..")
                && !p.chars().any(|ch| ch.is_control() || "?#%\\".contains(ch));
            if !prefix_ok {
                e.at(
                    prefix.span(),
                    format!(
                        "accel_redirect prefix \"{p}\" must be a URI path that starts and ends \
                         with '/', without '.' or '..' segments, '?', '#', '%' or '\\'"
                    ),
                );
                return None;
            }
            let path = e.absolute_path(dir, "accel_redirect directory")?;
            e.check(
                dir.span(),
                clean_dir(dir.get_ref(), "accel_redirect directory"),
            )?;
            Some((p.clone(), path))
        })
        .collect();
    // The most specific prefix is tried first.
    accel_redirect.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));

    let pool_name = c.pool.get_ref();
    let Some(pool) = pools.iter().find(|p| &p.name == pool_name) else {
        // A pool that failed its own validation was reported already; only name a missing one.
        if !file.pools.contains_key(pool_name.as_str()) {
            e.at(
                c.pool.span(),
                format!("pool \"{pool_name}\" is not defined: add a [pools.{pool_name}] table"),
            );
        }
        return None;
    };
    if root.is_none() && c.root.is_none() && runs_php(pool) {
        e.at(
            c.pool.span(),
            format!(
                "pool \"{pool_name}\" runs PHP, so this context needs a root: without one \
                 nothing checks which file a request makes the interpreter run"
            ),
        );
    }
    let max_conns = match &c.max_conns {
        None => pool.max_conns,
        Some(m) if *m.get_ref() == 0 => {
            e.at(m.span(), "max_conns must be at least 1");
            pool.max_conns
        }
        Some(m) if *m.get_ref() > pool.max_conns => {
            e.at(
                m.span(),
                format!(
                    "max_conns {} is more than pool \"{pool_name}\" allows ({}), so it would \
                     never limit anything",
                    m.get_ref(),
                    pool.max_conns
                ),
            );
            pool.max_conns
        }
        Some(m) => *m.get_ref(),
    };
    let max_body = match &c.max_body {
        None => super::DEFAULT_MAX_BODY,
        Some(m) => match e.check(m.span(), super::units::parse_size(&m.get_ref().0)) {
            Some(0) => {
                e.at(
                    m.span(),
                    "max_body must be more than 0 (a body of 0 bytes is no body)",
                );
                super::DEFAULT_MAX_BODY
            }
            Some(b) => b,
            None => super::DEFAULT_MAX_BODY,
        },
    };
    if !listen_ok {
        return None;
    }
    Some(ContextConfig {
        listen,
        prefix,
        extension,
        host,
        server_name,
        root,
        index,
        pool: pool_name.clone(),
        max_conns,
        static_files,
        allow_php_value: c.allow_php_value.unwrap_or(false),
        params,
        max_body,
        request_buffering: c.request_buffering.unwrap_or(true),
        front_controller,
        sendfile_dirs,
        accel_redirect,
    })
}

/// A directory files are sent from: no `.` or `..` segment, so what the file system
/// resolves is what was written (symlinks aside, which the request path resolves).
fn clean_dir(dir: &str, key: &str) -> Result<(), String> {
    if dir.split('/').any(|s| s == "." || s == "..") {
        return Err(format!("{key} \"{dir}\" has a '.' or '..' segment"));
    }
    if dir == "/" {
        return Err(format!(
            "{key} \"/\" would let a backend send any file on the host; name the directory \
             it keeps those files in"
        ));
    }
    Ok(())
}

/// Whether a spawned pool's program is a PHP interpreter (php-cgi, php, lsphp, by the name of
/// its executable, or the native PHP worker), which runs any file it is told to.
pub(super) fn runs_php(pool: &PoolConfig) -> bool {
    let super::Backend::Spawned(spawn) = &pool.backend else {
        return false;
    };
    let argv = match &spawn.program {
        super::Program::Command(argv) => argv,
        super::Program::PhpNative { .. } => return true,
        super::Program::Wsgi { .. } | super::Program::Rack { .. } => return false,
    };
    let name = |word: &String| {
        std::path::Path::new(word)
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
    };
    let is_php = |n: &str| n.starts_with("php") || n.starts_with("lsphp");
    let Some(first) = argv.first().and_then(name) else {
        return false;
    };
    if first == "env" {
        // `env [-i] [NAME=VALUE...] php-cgi ...`: the program is the first other word.
        return argv
            .iter()
            .skip(1)
            .find(|w| !w.starts_with('-') && !w.contains('='))
            .and_then(name)
            .is_some_and(|n| is_php(&n));
    }
    is_php(&first)
}

/// A path prefix: absolute, clean, and free of characters a request path cannot carry.
fn check_prefix(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("prefix \"{p}\" must start with '/'"));
    }
    if p.chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '?' || c == '#')
    {
        return Err(format!(
            "prefix \"{p}\" holds a character a request path cannot (space, control, '?' or '#')"
        ));
    }
    if p.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(format!("prefix \"{p}\" has a '.' or '..' segment"));
    }
    Ok(())
}

/// A host name to match the request's Host against: a DNS name, optionally `*.` + a name.
fn check_host(host: &str) -> Result<(), String> {
    if host.contains(':') && !host.starts_with('[') {
        return Err(format!("host \"{host}\" must not include a port"));
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    let valid = !name.is_empty()
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if valid {
        Ok(())
    } else {
        Err(format!(
            "host \"{host}\" is not a host name (a wildcard is written \"*.example.com\")"
        ))
    }
}

/// A `front_controller`: a script path in the root that the context itself would run, so the
/// request it takes over is checked by the script guard like any other. Only the HTTP
/// listener applies it (a front server's own `try_files` does the job on the FastCGI and SCGI
/// listeners).
fn check_front_controller(
    path: &str,
    c: &FileContext,
    listen: Option<&ListenAddress>,
    listeners: &[ListenerConfig],
) -> Result<String, String> {
    if c.root.is_none() {
        return Err("front_controller needs a root: it names a script file under it".to_owned());
    }
    if let Some(ext) = &c.extension {
        let ext = ext.get_ref();
        return Err(format!(
            "front_controller takes the paths that name no script, but extension = \"{ext}\" \
             routes only paths naming a .{ext} script to this context: leave extension out \
             (the context's script extension is then \"php\")"
        ));
    }
    if !path.starts_with('/') {
        return Err(format!(
            "front_controller \"{path}\" must be an absolute path in the root, such as \
             \"/index.php\""
        ));
    }
    if path
        .chars()
        .any(|ch| ch.is_control() || matches!(ch, '\\' | '?' | '#' | '%'))
    {
        return Err(format!(
            "front_controller \"{path}\" must be a plain file path: no '\\', '?', '#', '%' or \
             control characters"
        ));
    }
    if path
        .split('/')
        .skip(1)
        .any(|seg| seg.is_empty() || seg.starts_with('.'))
    {
        return Err(format!(
            "front_controller \"{path}\" has an empty, '.', '..' or hidden segment"
        ));
    }
    // With no `extension` (required above) the context's script extension is php's.
    let script_ext = "php";
    let name = path.rsplit('/').next().unwrap_or(path);
    let has_ext = name.len() > script_ext.len() + 1
        && name.ends_with(script_ext)
        && name.as_bytes().get(name.len() - script_ext.len() - 1) == Some(&b'.');
    if !has_ext {
        return Err(format!(
            "front_controller \"{path}\" must end in the context's script extension \
             \".{script_ext}\""
        ));
    }
    let on_cgi_front = listen.is_some_and(|addr| {
        listeners
            .iter()
            .any(|l| l.bind.address() == *addr && l.protocol != super::FrontProtocol::Http)
    });
    if on_cgi_front {
        return Err(
            "front_controller applies on an http listener only; on fastcgi and scgi \
             listeners the front server's try_files chooses the script"
                .to_owned(),
        );
    }
    Ok(path.to_owned())
}

//! A worker's listening socket: bound by corral when it hands the socket over (mode
//! `WORKER_SOCKET_MODE`, a stale socket file replaced, never another file), or only an
//! address picked when the command binds it itself (`{socket}` and `{port}` substituted in
//! its argv). Used by `spawn.rs`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

use super::spawn::{invalid, Handoff, WorkerSocket, WORKER_SOCKET_MODE};
use crate::config::BackendAddress;

/// Binds the socket when corral hands it over; returns the address corral connects to.
pub(super) fn prepare_socket(
    socket: &WorkerSocket,
    handoff: Handoff,
) -> io::Result<(BackendAddress, Option<OwnedFd>)> {
    let corral_binds = handoff != Handoff::Placeholder;
    match socket {
        WorkerSocket::Unix(path) => {
            // Only a socket left by an earlier worker is removed, never another file.
            let stale = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
            if stale {
                std::fs::remove_file(path).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot remove the stale socket {}: {e}", path.display()),
                    )
                })?;
            }
            let listener = if corral_binds {
                // Only corral connects to it: the worker has the socket itself as fd 0 and
                // never needs the path, and nobody else may talk to an interpreter that
                // trusts every parameter it is sent. Bound with that mode as its umask
                // (under the lock a front socket's bind takes too, so a looser umask set for
                // one never applies to this one), and set again explicitly.
                let bound = super::own::with_umask(!WORKER_SOCKET_MODE & 0o777, || {
                    UnixListener::bind(path)
                })
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot bind {}: {e}", path.display()))
                })?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(WORKER_SOCKET_MODE))
                    .map_err(|e| {
                        io::Error::new(e.kind(), format!("cannot chmod {}: {e}", path.display()))
                    })?;
                Some(OwnedFd::from(bound))
            } else {
                None
            };
            Ok((BackendAddress::Unix(path.clone()), listener))
        }
        WorkerSocket::Tcp { port } => {
            let bound =
                TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, *port))).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot bind 127.0.0.1:{port}: {e}"))
                })?;
            let address = BackendAddress::Tcp {
                host: Ipv4Addr::LOCALHOST.to_string(),
                port: bound.local_addr()?.port(),
            };
            // For a placeholder the probe binding is closed again: the child binds.
            Ok((address, corral_binds.then(|| OwnedFd::from(bound))))
        }
    }
}

/// Removes `path` if it is a socket (never another file that came to be there).
pub(super) fn remove_socket_file(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Replaces `{socket}` (a path, or `127.0.0.1:PORT`) and `{port}` (TCP only) in `argv`.
pub(super) fn substitute(argv: &[String], address: &BackendAddress) -> io::Result<Vec<String>> {
    let socket = match address {
        BackendAddress::Unix(path) => path.display().to_string(),
        BackendAddress::Tcp { .. } => address.to_string(),
    };
    argv.iter()
        .map(|arg| {
            let arg = arg.replace("{socket}", &socket);
            match address {
                BackendAddress::Tcp { port, .. } => Ok(arg.replace("{port}", &port.to_string())),
                BackendAddress::Unix(_) if arg.contains("{port}") => Err(invalid(format!(
                    "`{{port}}` in the command needs a TCP worker socket, not {address}"
                ))),
                BackendAddress::Unix(_) => Ok(arg),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn placeholders_are_substituted() {
        let argv = vec![
            "app".to_string(),
            "--bind={socket}".to_string(),
            "-p{port}".to_string(),
        ];
        let tcp = BackendAddress::Tcp {
            host: "127.0.0.1".to_string(),
            port: 9001,
        };
        assert_eq!(
            substitute(&argv, &tcp).unwrap(),
            vec!["app", "--bind=127.0.0.1:9001", "-p9001"]
        );
        let unix = BackendAddress::Unix(PathBuf::from("/run/corral/w1.sock"));
        let err = substitute(&argv, &unix).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            substitute(&argv[..2], &unix).unwrap(),
            vec!["app", "--bind=/run/corral/w1.sock"]
        );
    }
}

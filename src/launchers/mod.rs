//! The launchers corral embeds for the apps people deploy (DESIGN decision 12): a Python WSGI
//! launcher speaking SCGI and a Ruby Rack launcher speaking LSAPI, each written with only its
//! language's standard library, each taking its listening socket on fd 0 and serving one
//! request at a time. A pool that says `app = "wsgi:module:callable"` or
//! `app = "rack:config.ru"` runs them; they are written into the runtime directory when the
//! pool is built, so the binary is all a deployment needs.

use std::io;
use std::path::{Path, PathBuf};

use crate::config::Program;

/// The Python WSGI launcher (SCGI on fd 0).
pub const WSGI: &str = include_str!("wsgi.py");
/// The Ruby Rack launcher (LSAPI on fd 0).
pub const RACK: &str = include_str!("rack.rb");

/// The argv that runs `program` through its launcher, after writing the launcher into
/// `runtime_dir`; `None` for a plain `command`, which needs no launcher.
pub fn command(program: &Program, runtime_dir: &Path) -> io::Result<Option<Vec<String>>> {
    match program {
        Program::Command(_) => Ok(None),
        Program::Wsgi { module, callable } => {
            let path = write(runtime_dir, "corral-wsgi.py", WSGI)?;
            Ok(Some(vec![
                "python3".to_owned(),
                path.display().to_string(),
                format!("{module}:{callable}"),
            ]))
        }
        Program::Rack { rackup } => {
            let path = write(runtime_dir, "corral-rack.rb", RACK)?;
            Ok(Some(vec![
                "ruby".to_owned(),
                path.display().to_string(),
                rackup.display().to_string(),
            ]))
        }
    }
}

/// Writes `text` to `dir/name` unless it is already there unchanged (several pools share a
/// launcher), through a temporary file renamed into place so a worker never runs half a file.
fn write(dir: &Path, name: &str, text: &str) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(name);
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(path);
    }
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_are_written_once_and_named_in_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let wsgi = Program::Wsgi {
            module: "app.wsgi".into(),
            callable: "application".into(),
        };
        let argv = command(&wsgi, dir.path()).unwrap().unwrap();
        assert_eq!(argv[0], "python3");
        assert_eq!(argv[2], "app.wsgi:application");
        assert_eq!(std::fs::read_to_string(&argv[1]).unwrap(), WSGI);
        // A second pool reuses the file.
        assert_eq!(command(&wsgi, dir.path()).unwrap().unwrap(), argv);
        let rack = Program::Rack {
            rackup: "config.ru".into(),
        };
        let argv = command(&rack, dir.path()).unwrap().unwrap();
        assert_eq!((argv[0].as_str(), argv[2].as_str()), ("ruby", "config.ru"));
        assert!(
            command(&Program::Command(vec!["php-cgi".into()]), dir.path())
                .unwrap()
                .is_none()
        );
    }
}

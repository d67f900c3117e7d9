//! Front listeners: the sockets corral accepts front servers and clients on.

pub mod backlog;
pub mod cgi;
pub mod eviction;
pub mod fastcgi;
mod file;
mod halves;
pub mod http;
mod http10;
pub mod limits;
pub mod listener;
mod open_files;
mod quiet;
pub mod scgi;
mod sendfile;
mod static_files;

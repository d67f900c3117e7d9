//! corral: an application-server gateway.
//!
//! Everything testable lives in this library; `main.rs` is a thin shell around it. The wire
//! formats come from the `corral-protocols` crate, which does no I/O.

pub use corral_protocols as protocols;

pub mod access;
pub mod app;
pub mod backend;
pub mod bench;
pub mod beneath;
pub mod cli;
pub mod config;
pub mod control;
pub mod convert;
pub mod deploy;
pub mod error;
pub mod front;
pub mod gateway;
pub mod launchers;
pub mod logs;
pub mod net;
pub mod pool;
pub mod process;
pub mod router;
pub mod runtime_dir;
pub mod shards;
pub mod signals;
pub mod status;
pub mod systemd;

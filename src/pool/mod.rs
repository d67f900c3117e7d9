//! Pools: workers, the slots that bound the requests sent to them, the queue, and the
//! request counters the status page reads (`requests`, `histogram`, `request_timer`).

pub mod direct;
pub mod driver;
pub mod health;
pub mod histogram;
mod memory_checks;
pub mod preloader;
pub mod request_timer;
pub mod requests;
pub mod slots;
pub mod state;

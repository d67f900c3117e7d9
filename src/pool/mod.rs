//! Pools: workers, the slots that bound the requests sent to them, and the queue.

pub mod direct;
pub mod driver;
pub mod health;
mod memory_checks;
pub mod preloader;
pub mod slots;
pub mod state;

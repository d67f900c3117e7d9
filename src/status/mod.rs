//! Supervisor-served status and metrics (ARCHITECTURE.md decision 9): counted by the gateway and
//! the pool drivers, collected without waiting on any worker, rendered as php-fpm-compatible text
//! and JSON or as OpenMetrics, and served on the `[status]` listener.
//!
//! What the request path counts lives in `crate::pool::requests` (status reads it, never owns
//! it); `collect` joins it with the
//! configured limits and the drivers' published state, `render` and `metrics` write the
//! formats, `history` keeps the last minutes per pool, `html` is the page for people,
//! `server` answers `/status`, `/metrics` and `/ping` (to the Hosts `host` allows), and `watch` is the terminal view of
//! `corral status --watch`.

pub mod collect;
pub mod history;
pub mod host;
pub mod html;
pub mod metrics;
pub mod reload;
pub mod render;
pub mod server;
pub mod watch;

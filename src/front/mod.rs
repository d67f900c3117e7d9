//! Front listeners: the sockets corral accepts front servers and clients on.

pub mod listener;

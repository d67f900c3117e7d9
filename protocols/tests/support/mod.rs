//! What the protocol test binaries share. Each binary declares `mod support;` and uses the
//! part it needs (a binary that leaves some of it unused must not warn).

#![allow(dead_code)]

pub mod cgi;
pub mod fastcgi;

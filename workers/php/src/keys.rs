//! Worker mode: the `$_SERVER` keys of one request kept for the next. corral sends the same
//! variables in the same order request after request, so the key at each place is compared
//! with the one kept there (a few bytes) and, when it is the same name, PHP's string for it
//! is reused: its hash computed once, and no look-up in OPcache's interned strings
//! (`zend_string_init_interned`), which was the largest part of building `$_SERVER`
//! (callgrind). A key that differs replaces the one kept at its place.
//!
//! The strings live in the worker script's own request, which outlasts every request it
//! serves; they are released before that request ends (`corral_rs_release_keys`, called by
//! `sapi.c`). Classic mode keeps nothing: each of its requests frees its memory.

use std::cell::RefCell;
use std::ptr::NonNull;

use crate::php::{self, ZendString, Zval};

/// Most keys kept (a request with more registers the rest the ordinary way).
const MAX_KEPT: usize = 256;

/// A key kept at one place: the name and PHP's string for it (`None`: a key PHP must parse).
type Kept = (Box<[u8]>, Option<NonNull<ZendString>>);

thread_local! {
    static KEPT: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
}

/// Registers `$_SERVER[key] = value`, `key` being the `at`-th key of this request.
pub fn register(track_vars: *mut Zval, at: usize, key: &[u8], value: &[u8]) {
    KEPT.with(|kept| {
        let mut kept = kept.borrow_mut();
        if let Some((name, Some(string))) = kept.get(at) {
            if **name == *key {
                return php::register_key(track_vars, *string, value);
            }
        }
        if at >= MAX_KEPT {
            return php::register_variable(track_vars, key, value);
        }
        while kept.len() <= at {
            kept.push((Box::default(), None));
        }
        let string = if php::plain_key(key) {
            php::key_new(key)
        } else {
            None
        };
        if let Some((name, old)) = kept.get_mut(at) {
            if let Some(old) = old.take() {
                php::key_release(old);
            }
            *name = key.into();
            *old = string;
        }
        match string {
            Some(string) => php::register_key(track_vars, string, value),
            None => php::register_variable(track_vars, key, value),
        }
    });
}

/// Releases every kept key (the worker script's request is about to end).
#[no_mangle]
extern "C" fn corral_rs_release_keys() {
    KEPT.with(|kept| {
        for (_, string) in kept.borrow_mut().drain(..) {
            if let Some(string) = string {
                php::key_release(string);
            }
        }
    });
}

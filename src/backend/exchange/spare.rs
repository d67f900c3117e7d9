//! Spare exchange allocations, a few per serving thread.
//!
//! Every backend request lives in one heap allocation (`begin`), and an exchange is larger
//! than the sizes glibc's per-thread cache serves, so a fresh one cost a trip through
//! `malloc`'s bins and `free`'s consolidation on every request (about 600 instructions under
//! callgrind). A response body that ends gives its allocation back here, emptied, and a
//! later exchange on the same thread is built in it. A thread keeps at most [`MAX_SPARE`]
//! (as many as it usually has exchanges in flight at once), so what it holds stays a few
//! exchanges' size whatever it served.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::Exchange;

/// Most spare allocations one thread keeps.
const MAX_SPARE: usize = 16;

thread_local! {
    // Boxes on purpose: each is an allocation handed out whole to an exchange.
    #[allow(clippy::vec_box)]
    static SPARE: RefCell<Vec<Box<MaybeUninit<Exchange>>>> = const { RefCell::new(Vec::new()) };
}

/// `exchange` on the heap, in one of this thread's spare allocations when it has one.
#[inline]
pub(super) fn boxed(exchange: Exchange) -> Box<Exchange> {
    let spare = SPARE
        .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten();
    match spare {
        Some(mut spare) => {
            spare.write(exchange);
            // SAFETY: the line above initialised the whole value.
            unsafe { spare.assume_init() }
        }
        None => Box::new(exchange),
    }
}

/// Drops the exchange in `exchange` (its `Drop` runs as usual: an abort, the connection
/// closed) and keeps the allocation as this thread's spare.
pub(super) fn recycle(exchange: Box<Exchange>) {
    let raw = Box::into_raw(exchange);
    // SAFETY: `raw` comes from `Box::into_raw` just above, so it points to a live, aligned
    // `Exchange` that nothing else references; it is dropped exactly once, here, and not
    // read again as an `Exchange` afterwards.
    unsafe { std::ptr::drop_in_place(raw) };
    // SAFETY: the allocation was made by a `Box<Exchange>`, and `MaybeUninit<Exchange>` has
    // the same size and alignment, so the box frees it with the layout it was allocated
    // with; its contents, dropped above, are uninitialised as far as the new type says.
    let spare = unsafe { Box::from_raw(raw.cast::<MaybeUninit<Exchange>>()) };
    // Past the bound, or on a thread whose locals are being torn down, it is freed instead
    // (`spare` dropped).
    let _ = SPARE.try_with(|kept| {
        if let Ok(mut kept) = kept.try_borrow_mut() {
            if kept.len() < MAX_SPARE {
                kept.push(spare);
            }
        }
    });
}

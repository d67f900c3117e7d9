#![no_main]
//! placeholder: being written.
libfuzzer_sys::fuzz_target!(|_data: &[u8]| {});

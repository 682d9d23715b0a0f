//! See `strand::fuzz::config`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| strand::fuzz::config(data));

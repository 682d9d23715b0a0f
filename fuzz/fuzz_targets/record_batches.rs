//! See `strand::fuzz::record_batches`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| strand::fuzz::record_batches(data));

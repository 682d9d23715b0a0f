//! See `strand::fuzz::coordinator_records`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| strand::fuzz::coordinator_records(data));

//! See `strand::fuzz::controller_frame`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| strand::fuzz::controller_frame(data));

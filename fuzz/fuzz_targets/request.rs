//! One request frame (without its size prefix) handed to a running broker
//! as a connection hands it: header and body decoding, then the handler.
#![no_main]
use libfuzzer_sys::fuzz_target;

thread_local! {
    static BROKER: strand::fuzz::RequestTarget = strand::fuzz::RequestTarget::new();
}

fuzz_target!(|data: &[u8]| {
    BROKER.with(|broker| broker.request(data));
});

//! Fuzzes path probes and their replies.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_proto::routing::probe::check_untrusted(data);
});

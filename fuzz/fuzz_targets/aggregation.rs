//! Fuzzes the aggregation decoder on raw payload bytes (decode, re-encode, compare).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_proto::wire::check_untrusted_messages(data);
});

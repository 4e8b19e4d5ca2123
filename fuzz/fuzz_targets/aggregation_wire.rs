//! Fuzzes the aggregation service's messages between servers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_services::aggregate::wire::check_untrusted(data);
});

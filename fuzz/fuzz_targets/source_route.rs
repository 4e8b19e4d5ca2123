//! Fuzzes source routes as forwarders follow and strip them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_proto::routing::source::check_untrusted(data);
});

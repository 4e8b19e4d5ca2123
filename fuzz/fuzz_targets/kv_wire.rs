//! Fuzzes the key-value store's messages between servers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_services::kv::wire::check_untrusted(data);
});

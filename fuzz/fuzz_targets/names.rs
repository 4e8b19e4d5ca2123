//! Fuzzes the name directory's messages between servers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_services::names::check_untrusted(data);
});

//! Fuzzes remote memory's messages between servers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_dataplane::rmem::wire::check_untrusted(data);
});

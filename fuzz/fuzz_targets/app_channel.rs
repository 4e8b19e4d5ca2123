//! Fuzzes an application's channel as torusd's host reads it: submission entries, TX data
//! and ring indices written by a hostile application.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_dataplane::apps::host::check_untrusted(data);
});

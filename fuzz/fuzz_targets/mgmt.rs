//! Fuzzes torusd's management socket: request lines, and the view request's fields.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_dataplane::mgmt::check_untrusted(data);
});

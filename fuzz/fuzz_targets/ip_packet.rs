//! Fuzzes IP packets as the TUN service classifies and answers them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_dataplane::ip::packet::check_untrusted(data);
});

//! Fuzzes control-plane frames (hellos and link-state records).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_proto::control::check_untrusted(data);
});

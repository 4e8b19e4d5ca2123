//! Fuzzes the torus frame parser (view, header parse, re-emit, aggregated payload).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_proto::wire::check_untrusted(data);
});

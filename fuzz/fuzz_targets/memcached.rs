//! Fuzzes the memcached gateway's parser (text and meta commands of one connection).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    torusnet_services::kv::memcached::check_untrusted(data);
});

//! libFuzzer entry point of the `tls` target: see `dpu_fuzz::tls`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::tls::run(data));

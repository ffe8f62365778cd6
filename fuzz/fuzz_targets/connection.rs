//! libFuzzer entry point of the `connection` target: see `dpu_fuzz::connection`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::connection::run(data));

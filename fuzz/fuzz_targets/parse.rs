//! libFuzzer entry point of the `parse` target: see `dpu_fuzz::parse`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::parse::run(data));

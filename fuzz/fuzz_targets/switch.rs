//! libFuzzer entry point of the `switch` target: see `dpu_fuzz::switch`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::switch::run(data));

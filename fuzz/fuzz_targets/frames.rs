//! libFuzzer entry point of the `frames` target: see `dpu_fuzz::frames`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::frames::run(data));

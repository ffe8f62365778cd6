//! libFuzzer entry point of the `rules` target: see `dpu_fuzz::rules`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::rules::run(data));

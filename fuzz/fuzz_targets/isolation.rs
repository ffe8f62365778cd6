//! libFuzzer entry point of the `isolation` target: see `dpu_fuzz::isolation`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::isolation::run(data));

//! libFuzzer entry point of the `host` target: see `dpu_fuzz::host`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::host::run(data));

//! libFuzzer entry point of the `auth` target: see `dpu_fuzz::auth`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::auth::run(data));

//! libFuzzer entry point of the `saved_tables` target: see `dpu_fuzz::saved_tables`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::saved_tables::run(data));

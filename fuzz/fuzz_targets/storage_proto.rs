//! libFuzzer entry point of the `storage_proto` target: see `dpu_fuzz::storage_proto`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::storage_proto::run(data));

//! libFuzzer entry point of the `opi_proto` target: see `dpu_fuzz::opi_proto`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::opi_proto::run(data));

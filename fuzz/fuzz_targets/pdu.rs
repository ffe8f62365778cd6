//! libFuzzer entry point of the `pdu` target: see `dpu_fuzz::pdu`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::pdu::run(data));

//! libFuzzer entry point of the `handshake` target: see `dpu_fuzz::handshake`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::handshake::run(data));

//! libFuzzer entry point of the `rule_proto` target: see `dpu_fuzz::rule_proto`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dpu_fuzz::rule_proto::run(data));

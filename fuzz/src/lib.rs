//! The fuzz targets of dpu-service, one module per target, each with a
//! `run(data: &[u8])` that takes one fuzzer input and panics on a bug.
//!
//! The libFuzzer binaries (`fuzz_targets/<target>.rs`, built by
//! `cargo fuzz` with the `libfuzzer` feature) only call `run`; fuzz/run.sh
//! at the repository root builds and runs them all (`fuzz/run.sh pdu` for
//! one). The committed inputs under `fuzz/seeds/<target>/` and
//! `fuzz/regressions/<target>/` replay through the same `run` as plain
//! tests (`cargo test -p dpu-fuzz`, `tests/seeds.rs`), without libFuzzer
//! and without `cfg(fuzzing)`, under which smoltcp skips checksums: there
//! a `frames` input's crafted frames meet the checksum checks.
//!
//! - NVMe/TCP (`dpu-nvmeof`): [`pdu`], [`connection`], [`handshake`],
//!   [`auth`], the secure channel's identities and keys, [`tls`], and its
//!   host side against a hostile controller, [`host`];
//! - the data plane (`dpu-dataplane`, without DPDK): [`parse`],
//!   [`switch`], [`isolation`], [`rules`], and the switch's tables saved
//!   across a restart, [`saved_tables`];
//! - the control plane (`dpu-control`): [`rule_proto`], and the checks
//!   of OPI's NVMe front end, [`opi_proto`], and of volumes and the
//!   namespaces made on them, [`storage_proto`];
//! - storage endpoints (`dpu-endpoint`): [`frames`].

#![forbid(unsafe_code)]

pub mod auth;
pub mod connection;
pub mod frames;
pub mod handshake;
pub mod host;
pub mod isolation;
pub mod opi_proto;
pub mod parse;
pub mod pdu;
pub mod rule_proto;
pub mod rules;
pub mod saved_tables;
pub mod storage_proto;
pub mod switch;
pub mod tls;

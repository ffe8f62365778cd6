//! The `dpu.v1` gRPC contract of dpu-service.
//!
//! This crate holds the protobuf sources (`dpu/v1/*.proto`, the product's
//! public API) and the code tonic and prost generate from them: message
//! types, server traits and client stubs, plus serde implementations that
//! follow the canonical proto3 JSON mapping, and ([`text`]) the short text
//! forms of attachments, port ranges, protocols and rates that `dpuctl`
//! and the service's configuration share. It checks no values.
//!
//! It also holds ([`opi::storage::v1`]) the Open Programmable
//! Infrastructure project's storage API, `opi_api.storage.v1`, written
//! here wire-compatible with OPI's published protos (`opi_api/storage/v1/`,
//! checked against pydpu's by `tests/python/opi_wire.py`). The daemon
//! serves its NVMe subsystem calls (`docs/opi.md`).
//!
//! Compatibility: `dpu.v1` only grows. Fields and RPCs are added, never
//! renumbered, retyped or removed; a breaking change means a new package.

#![forbid(unsafe_code)]

/// Messages, enums, clients and servers of package `dpu.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("dpu.v1");
    include!(concat!(env!("OUT_DIR"), "/dpu.v1.serde.rs"));
}

pub mod text;

/// The Open Programmable Infrastructure project's gRPC APIs.
pub mod opi {
    /// OPI's storage APIs.
    pub mod storage {
        /// Messages, enums, clients and servers of package
        /// `opi_api.storage.v1`: the NVMe front end, the malloc, AIO, null
        /// and remote NVMe back ends (see `docs/opi.md`).
        #[allow(missing_docs, clippy::all, clippy::pedantic)]
        pub mod v1 {
            tonic::include_proto!("opi_api.storage.v1");
        }
    }
}

/// The encoded `FileDescriptorSet` of `dpu.v1` and its imports, for gRPC
/// server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/dpu_v1_descriptor.bin"));

/// The encoded `FileDescriptorSet` of `opi_api.storage.v1` and its imports
/// (the well-known types it uses), for reflection and for comparing the
/// contract with OPI's published descriptors.
pub const OPI_STORAGE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/opi_storage_descriptor.bin"));

/// The API package this crate implements.
pub const API_VERSION: &str = "dpu.v1";

/// Well-known protobuf types used by the contract (Timestamp, FieldMask).
pub use pbjson_types;

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
//! And ([`opi::network::evpn_gw::v1alpha1`]) OPI's EVPN gateway API,
//! `opi_api.network.evpn_gw.v1alpha1` (logical bridges, bridge ports, VRFs
//! and SVIs), with the common network types it uses
//! ([`opi::network::opinetcommon::v1alpha1`]), written and checked the
//! same way (`opi_api/network/`). The daemon serves its logical bridges
//! and bridge ports as views of its tenants, and answers its VRF and SVI
//! calls `UNIMPLEMENTED`.
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

    /// OPI's network APIs. The generated code of one package names the
    /// other's types by relative paths (`super::super::opinetcommon::..`),
    /// so both sit here, as their packages nest.
    pub mod network {
        /// Messages, enums, clients and servers of package
        /// `opi_api.network.evpn_gw.v1alpha1`, OPI's EVPN gateway: logical
        /// bridges and bridge ports (layer 2), VRFs and SVIs (layer 3);
        /// see `docs/opi.md`.
        pub mod evpn_gw {
            /// Version `v1alpha1` of the EVPN gateway API.
            #[allow(missing_docs, clippy::all, clippy::pedantic)]
            pub mod v1alpha1 {
                tonic::include_proto!("opi_api.network.evpn_gw.v1alpha1");
            }
        }

        /// OPI's types shared by its network APIs.
        pub mod opinetcommon {
            /// Messages and enums of package
            /// `opi_api.network.opinetcommon.v1alpha1` (`networktypes.proto`):
            /// addresses, prefixes, encapsulations, match rules.
            #[allow(missing_docs, clippy::all, clippy::pedantic)]
            pub mod v1alpha1 {
                tonic::include_proto!("opi_api.network.opinetcommon.v1alpha1");
            }
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

/// The encoded `FileDescriptorSet` of `opi_api.network.evpn_gw.v1alpha1`
/// and its imports (`opi_api.network.opinetcommon.v1alpha1`'s
/// `networktypes.proto` and the well-known types it uses), for reflection
/// and for comparing the contract with OPI's published descriptors.
pub const OPI_NETWORK_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/opi_network_descriptor.bin"));

/// The API package this crate implements.
pub const API_VERSION: &str = "dpu.v1";

/// Well-known protobuf types used by the contract (Timestamp, FieldMask).
pub use pbjson_types;

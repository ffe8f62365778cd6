//! Compiles `dpu/v1/*.proto` into tonic/prost code, the encoded file
//! descriptor set (for gRPC server reflection) and pbjson serde impls (the
//! canonical proto3 JSON mapping used by `dpuctl --output json`); and
//! `opi_api/storage/v1/*.proto`, the OPI storage contract, and
//! `opi_api/network/.../*.proto`, OPI's EVPN gateway contract, into
//! tonic/prost code and a descriptor set of their own each.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "dpu/v1/info.proto",
    "dpu/v1/tenant.proto",
    "dpu/v1/port.proto",
    "dpu/v1/filter.proto",
    "dpu/v1/storage.proto",
    "dpu/v1/telemetry.proto",
];

/// The OPI storage contract (`opi_api.storage.v1`), kept wire-compatible
/// with OPI's published API by `tests/python/opi_wire.py`.
const OPI_STORAGE_PROTOS: &[&str] = &[
    "opi_api/storage/v1/opicommon.proto",
    "opi_api/storage/v1/frontend_nvme.proto",
    "opi_api/storage/v1/backend_malloc.proto",
    "opi_api/storage/v1/backend_aio.proto",
    "opi_api/storage/v1/backend_null.proto",
    "opi_api/storage/v1/backend_nvme.proto",
];

/// OPI's EVPN gateway contract (`opi_api.network.evpn_gw.v1alpha1`) and
/// the common network types it imports
/// (`opi_api.network.opinetcommon.v1alpha1`), kept wire-compatible with
/// OPI's published API by `tests/python/opi_wire.py --package network`.
const OPI_NETWORK_PROTOS: &[&str] = &[
    "opi_api/network/opinetcommon/v1alpha1/networktypes.proto",
    "opi_api/network/evpn_gw/v1alpha1/component.proto",
    "opi_api/network/evpn_gw/v1alpha1/l2_xpu_infra_mgr.proto",
    "opi_api/network/evpn_gw/v1alpha1/l3_xpu_infra_mgr.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A protoc from the environment wins; otherwise use the vendored one so a
    // fresh machine needs no package for it.
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        std::env::set_var("PROTOC", protoc);
    }
    let include = protoc_bin_vendored::include_path()?;
    let include = include.to_str().ok_or("protoc include path is not UTF-8")?;
    let includes = [".", include];
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("dpu_v1_descriptor.bin");

    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(PROTOS, &includes)?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .emit_fields()
        .build(&[".dpu.v1"])?;

    // OPI: its own descriptor set; the well-known types are pbjson_types',
    // like dpu.v1's, so both modules share them. No serde impls.
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("opi_storage_descriptor.bin"))
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(OPI_STORAGE_PROTOS, &includes)?;

    // OPI network: a third pass, a third descriptor set, the same
    // well-known types.
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("opi_network_descriptor.bin"))
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(OPI_NETWORK_PROTOS, &includes)?;

    for p in PROTOS
        .iter()
        .chain(OPI_STORAGE_PROTOS)
        .chain(OPI_NETWORK_PROTOS)
    {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}

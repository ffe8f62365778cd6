//! The OPI storage contract (`proto/opi_api/storage/v1/*.proto`) against
//! OPI's own: writes [`dpu_proto::OPI_STORAGE_DESCRIPTOR_SET`] to a file
//! and runs `tests/python/run.sh opi-wire` on it, which compares every
//! message, field, enum and method with the descriptors of the OPI stubs
//! pydpu (PyPI, pinned in `tests/python/requirements.txt`) ships. Needs
//! `python3` with `venv`, and PyPI the first time (`tests/deps.sh`
//! installs the former).

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;

#[test]
fn opi_storage_contract_matches_pydpu() {
    let set = Path::new(env!("CARGO_TARGET_TMPDIR")).join("opi_storage_descriptor.bin");
    std::fs::write(&set, dpu_proto::OPI_STORAGE_DESCRIPTOR_SET)
        .unwrap_or_else(|e| panic!("writing {}: {e}", set.display()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("opi-wire")
        .arg(&set)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "our opi_api.storage.v1 differs from pydpu's ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("opi_wire: OK"),
        "no verdict:\n{stdout}\n{stderr}"
    );
}

/// The generated code holds what the contract names: a client and a
/// server per service under OPI's service names, messages with their
/// oneofs, `optional` fields and nested enums.
#[test]
fn opi_storage_code_is_generated() {
    use dpu_proto::opi::storage::v1 as opi;

    let controller = opi::NvmeControllerSpec {
        nvme_controller_id: Some(1),
        endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
            opi::FabricsEndpoint {
                traddr: "127.0.0.1".into(),
                trsvcid: "4420".into(),
                adrfam: opi::NvmeAddressFamily::Ipv4.into(),
            },
        )),
        ..Default::default()
    };
    assert_eq!(controller.nvme_controller_id, Some(1));
    assert_eq!(opi::nvme_namespace_status::State::Enabled as i32, 2);
    assert_eq!(
        [
            opi::frontend_nvme_service_server::SERVICE_NAME,
            opi::malloc_volume_service_server::SERVICE_NAME,
            opi::aio_volume_service_server::SERVICE_NAME,
            opi::null_volume_service_server::SERVICE_NAME,
            opi::nvme_remote_controller_service_server::SERVICE_NAME,
        ],
        [
            "opi_api.storage.v1.FrontendNvmeService",
            "opi_api.storage.v1.MallocVolumeService",
            "opi_api.storage.v1.AioVolumeService",
            "opi_api.storage.v1.NullVolumeService",
            "opi_api.storage.v1.NvmeRemoteControllerService",
        ]
    );
    let _connect = opi::frontend_nvme_service_client::FrontendNvmeServiceClient::<
        tonic::transport::Channel,
    >::new;
}

//! The OPI contracts against OPI's own: the storage one
//! (`proto/opi_api/storage/v1/*.proto`) and the network one
//! (`proto/opi_api/network/*/v1alpha1/*.proto`, the EVPN gateway and the
//! common types it imports). Each test writes a descriptor set
//! ([`dpu_proto::OPI_STORAGE_DESCRIPTOR_SET`],
//! [`dpu_proto::OPI_NETWORK_DESCRIPTOR_SET`]) to a file and runs
//! `tests/python/run.sh opi-wire` on it, which compares every message,
//! field, enum and method with the descriptors of the OPI stubs pydpu
//! (PyPI, pinned in `tests/python/requirements.txt`) ships. Needs
//! `python3` with `venv`, and PyPI the first time (`tests/deps.sh`
//! installs the former).

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;

/// Writes `set` to `file` under the test's temporary directory and runs
/// the wire check on it with `args`; fails unless it says OK.
fn check_wire(set: &[u8], file: &str, args: &[&str], package: &str) {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(file);
    std::fs::write(&path, set).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("opi-wire")
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "our {package} differs from pydpu's ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("opi_wire: OK"),
        "no verdict:\n{stdout}\n{stderr}"
    );
}

#[test]
fn opi_storage_contract_matches_pydpu() {
    check_wire(
        dpu_proto::OPI_STORAGE_DESCRIPTOR_SET,
        "opi_storage_descriptor.bin",
        &[],
        "opi_api.storage.v1",
    );
}

#[test]
fn opi_network_contract_matches_pydpu() {
    check_wire(
        dpu_proto::OPI_NETWORK_DESCRIPTOR_SET,
        "opi_network_descriptor.bin",
        &["--package", "network"],
        "opi_api.network.evpn_gw.v1alpha1 (or opinetcommon.v1alpha1)",
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

/// The same for the EVPN gateway: its four services under OPI's names,
/// `optional` fields, and the common types reached from the `evpn_gw`
/// module, where prost's `super::super::opinetcommon` paths lead.
#[test]
fn opi_network_code_is_generated() {
    use dpu_proto::opi::network::evpn_gw::v1alpha1 as evpn;
    use dpu_proto::opi::network::opinetcommon::v1alpha1 as common;

    let bridge = evpn::LogicalBridge {
        name: "logicalBridges/lb10".into(),
        spec: Some(evpn::LogicalBridgeSpec {
            vlan_id: 10,
            vni: Some(1010),
            vtep_ip_prefix: Some(common::IpPrefix {
                addr: Some(common::IpAddress {
                    af: common::IpAf::Inet.into(),
                    v4_or_v6: Some(common::ip_address::V4OrV6::V4Addr(0x0a00_0001)),
                }),
                len: 32,
            }),
        }),
        status: None,
    };
    assert_eq!(bridge.spec.as_ref().and_then(|s| s.vni), Some(1010));
    assert_eq!(evpn::BridgePortType::Trunk as i32, 2);
    assert_eq!(common::WildcardMatch::Any as i32, 256);
    let status = evpn::VrfStatus {
        oper_status: evpn::VrfOperStatus::Up.into(),
        components: vec![evpn::Component {
            name: "frr".into(),
            status: evpn::CompStatus::Success.into(),
            details: String::new(),
        }],
    };
    assert_eq!(status.components.len(), 1);
    assert_eq!(
        [
            evpn::logical_bridge_service_server::SERVICE_NAME,
            evpn::bridge_port_service_server::SERVICE_NAME,
            evpn::vrf_service_server::SERVICE_NAME,
            evpn::svi_service_server::SERVICE_NAME,
        ],
        [
            "opi_api.network.evpn_gw.v1alpha1.LogicalBridgeService",
            "opi_api.network.evpn_gw.v1alpha1.BridgePortService",
            "opi_api.network.evpn_gw.v1alpha1.VrfService",
            "opi_api.network.evpn_gw.v1alpha1.SviService",
        ]
    );
    let _connect = evpn::logical_bridge_service_client::LogicalBridgeServiceClient::<
        tonic::transport::Channel,
    >::new;
}

//! OPI's NVMe front-end sequence through the real binary, judged by the
//! Linux kernel initiator: Malloc volume `Malloc1`, a subsystem open to
//! any host, an NVMe/TCP controller on loopback and a namespace on the
//! volume, all made with the Rust clients of OPI's protos
//! (`opi_api.storage.v1.MallocVolumeService`, `FrontendNvmeService`). A
//! guest (`../shared/tools/kernel-nvme/run.sh`) discovers the subsystem,
//! connects, reads the EUI-64 OPI gave the namespace from Identify and
//! from sysfs, and runs fio with crc32c verification; OPI's stats count
//! its writes and verifying reads. `dpuctl` shows the same subsystem,
//! listener, namespace and volume, and after the guest disconnects OPI
//! deletes them in reverse order and `dpuctl` shows none left.

use anyhow::{ensure, Context, Result};
use dpu_e2e::guest::Guest;
use dpu_e2e::{free_port, Service};
use dpu_proto::opi::storage::v1 as opi;
use serde_json::Value;
use tonic::transport::Channel;

use opi::frontend_nvme_service_client::FrontendNvmeServiceClient;
use opi::malloc_volume_service_client::MallocVolumeServiceClient;

const NQN: &str = "nqn.2022-09.io.spdk:opi-kernel";
const SUBSYSTEM: &str = "nvmeSubsystems/opi-kernel";
const CONTROLLER: &str = "nvmeSubsystems/opi-kernel/nvmeControllers/tcp0";
const NAMESPACE: &str = "nvmeSubsystems/opi-kernel/nvmeNamespaces/ns1";
const VOLUME: &str = "mallocVolumes/Malloc1";
/// The EUI-64 given to the namespace; the host reads its big-endian bytes.
const EUI64: i64 = 0x1b4e_28ba_2fa1_11d2;
const BLOCK: i64 = 512;
const BLOCKS: i64 = (64 << 20) / BLOCK;
/// 64 MiB, as `dpuctl`'s JSON writes sizes.
const SIZE: &str = "67108864";

/// OPI's volume and front-end clients on one connection.
struct Clients {
    malloc: MallocVolumeServiceClient<Channel>,
    nvme: FrontendNvmeServiceClient<Channel>,
}

/// Runs `call` with OPI's clients connected to `svc`.
fn with_opi<T, F>(svc: &Service, call: impl FnOnce(Clients) -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    dpu_e2e::block_on(async {
        let ch = Channel::from_shared(svc.endpoint())?.connect().await?;
        call(Clients {
            malloc: MallocVolumeServiceClient::new(ch.clone()),
            nvme: FrontendNvmeServiceClient::new(ch),
        })
        .await
    })
}

/// Volume, subsystem, controller on 127.0.0.1:`port` and namespace, in
/// the order OPI's test client makes them.
fn opi_create(svc: &Service, port: u16) -> Result<()> {
    with_opi(svc, |mut c| async move {
        let v = c
            .malloc
            .create_malloc_volume(opi::CreateMallocVolumeRequest {
                malloc_volume_id: "Malloc1".into(),
                malloc_volume: Some(opi::MallocVolume {
                    block_size: BLOCK,
                    blocks_count: BLOCKS,
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        ensure!(
            v.name == VOLUME && v.block_size == BLOCK && v.blocks_count == BLOCKS,
            "{v:?}"
        );
        let s = c
            .nvme
            .create_nvme_subsystem(opi::CreateNvmeSubsystemRequest {
                nvme_subsystem_id: "opi-kernel".into(),
                nvme_subsystem: Some(opi::NvmeSubsystem {
                    spec: Some(opi::NvmeSubsystemSpec {
                        nqn: NQN.into(),
                        serial_number: "OPI-KERNEL-0001".into(),
                        model_number: "OPI Kernel Model".into(),
                        max_namespaces: 8,
                        // Empty: any host may connect.
                        hostnqn: String::new(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        ensure!(s.name == SUBSYSTEM, "{s:?}");
        let ctrl = c
            .nvme
            .create_nvme_controller(opi::CreateNvmeControllerRequest {
                parent: SUBSYSTEM.into(),
                nvme_controller_id: "tcp0".into(),
                nvme_controller: Some(opi::NvmeController {
                    spec: Some(opi::NvmeControllerSpec {
                        trtype: opi::NvmeTransportType::Tcp as i32,
                        endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
                            opi::FabricsEndpoint {
                                traddr: "127.0.0.1".into(),
                                trsvcid: port.to_string(),
                                adrfam: opi::NvmeAddressFamily::Ipv4 as i32,
                            },
                        )),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        ensure!(ctrl.name == CONTROLLER, "{ctrl:?}");
        let ns = c
            .nvme
            .create_nvme_namespace(opi::CreateNvmeNamespaceRequest {
                parent: SUBSYSTEM.into(),
                nvme_namespace_id: "ns1".into(),
                nvme_namespace: Some(opi::NvmeNamespace {
                    spec: Some(opi::NvmeNamespaceSpec {
                        volume_name_ref: "Malloc1".into(),
                        host_nsid: 1,
                        eui64: EUI64,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        let spec = ns.spec.clone().context("no spec")?;
        ensure!(
            ns.name == NAMESPACE && spec.host_nsid == 1 && spec.eui64 == EUI64,
            "{ns:?}"
        );
        Ok(())
    })
}

/// The read and write operations OPI's stats count on the namespace.
fn opi_ops(svc: &Service) -> Result<(i32, i32)> {
    with_opi(svc, |mut c| async move {
        let s = c
            .nvme
            .stats_nvme_namespace(opi::StatsNvmeNamespaceRequest {
                name: NAMESPACE.into(),
            })
            .await?
            .into_inner()
            .stats
            .context("no stats")?;
        Ok((s.read_ops_count, s.write_ops_count))
    })
}

/// Deletes namespace, controller, subsystem and volume through OPI.
fn opi_delete(svc: &Service) -> Result<()> {
    with_opi(svc, |mut c| async move {
        c.nvme
            .delete_nvme_namespace(opi::DeleteNvmeNamespaceRequest {
                name: NAMESPACE.into(),
                allow_missing: false,
            })
            .await?;
        c.nvme
            .delete_nvme_controller(opi::DeleteNvmeControllerRequest {
                name: CONTROLLER.into(),
                allow_missing: false,
            })
            .await?;
        c.nvme
            .delete_nvme_subsystem(opi::DeleteNvmeSubsystemRequest {
                name: SUBSYSTEM.into(),
                allow_missing: false,
            })
            .await?;
        c.malloc
            .delete_malloc_volume(opi::DeleteMallocVolumeRequest {
                name: VOLUME.into(),
                allow_missing: false,
            })
            .await?;
        Ok(())
    })
}

/// The one element of the JSON array `v`.
fn only(v: &Value) -> Result<&Value> {
    match v.as_array().map(Vec::as_slice) {
        Some([one]) => Ok(one),
        _ => anyhow::bail!("not one element: {v}"),
    }
}

#[test]
fn kernel_initiator_uses_what_opi_made() -> Result<()> {
    let svc = Service::start()?;
    let port = free_port();
    opi_create(&svc, port)?;

    let eui = format!("{EUI64:016x}");
    let script = format!(
        r#"
nvme discover -t tcp -a $TARGET_ADDR -s $TARGET_PORT | tee /tmp/disc
grep -q "subnqn: *{NQN}" /tmp/disc
nvme connect -t tcp -a $TARGET_ADDR -s $TARGET_PORT -n {NQN}
ns=$(nvme-wait-ns {NQN})
nvme list
nvme id-ns $ns | tee /tmp/idns
grep -q "nsze *: 0x20000" /tmp/idns
echo "ID-NS-EUI64 $(sed -n 's/^eui64 *: *//p' /tmp/idns)"
echo "SYSFS-EUI $(tr -d ' :' < /sys/block/${{ns#/dev/}}/eui)"
fio --name=opi --filename=$ns --direct=1 --ioengine=libaio --rw=randwrite --bs=4k \
    --iodepth=16 --size=32M --verify=crc32c --verify_fatal=1 --eta=never \
    --output=/tmp/fio.out
cat /tmp/fio.out
grep -q "err= 0" /tmp/fio.out
echo FIO-VERIFIED
nvme disconnect -n {NQN}
"#
    );
    let work = tempfile::tempdir()?;
    let guest = Guest::start(work.path(), "opi", &[port], &script)?;
    let console = guest.finish(&svc)?;
    let line = |key: &str| {
        console
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    ensure!(
        line("ID-NS-EUI64 ") == eui && line("SYSFS-EUI ") == eui,
        "the guest reads EUI-64 {:?} (Identify) and {:?} (sysfs), not {eui}",
        line("ID-NS-EUI64 "),
        line("SYSFS-EUI ")
    );
    ensure!(
        console.lines().any(|l| l.trim() == "FIO-VERIFIED"),
        "{console}"
    );
    // 32 MiB in 4 KiB writes, and fio's verify reads them back: the
    // target counts each.
    let (reads, writes) = opi_ops(&svc)?;
    ensure!(
        reads >= 8192 && writes >= 8192,
        "OPI counts {reads} reads and {writes} writes"
    );

    // dpuctl shows what OPI made.
    let s = svc.dpuctl_json(&["subsystem", "get", "opi-kernel"])?;
    ensure!(
        s["nqn"] == NQN
            && s["serialNumber"] == "OPI-KERNEL-0001"
            && s["modelNumber"] == "OPI Kernel Model"
            && s["allowAnyHost"] == true,
        "{s}"
    );
    let listeners = svc.dpuctl_json(&["listener", "list", "opi-kernel"])?;
    let l = only(&listeners)?;
    ensure!(
        l["name"] == "subsystems/opi-kernel/listeners/tcp0"
            && l["address"] == "127.0.0.1"
            && l["port"] == u64::from(port),
        "{listeners}"
    );
    let namespaces = svc.dpuctl_json(&["namespace", "list", "opi-kernel"])?;
    let n = only(&namespaces)?;
    ensure!(
        n["name"] == "subsystems/opi-kernel/namespaces/1"
            && n["volume"] == "Malloc1"
            && n["eui64"] == eui.as_str()
            && n["sizeBytes"] == SIZE,
        "{namespaces}"
    );
    let volumes = svc.dpuctl_json(&["volume", "list"])?;
    let v = only(&volumes)?;
    ensure!(
        v["name"] == "volumes/Malloc1"
            && v["namespace"] == "subsystems/opi-kernel/namespaces/1"
            && v["blockSize"] == BLOCK
            && v["sizeBytes"] == SIZE,
        "{volumes}"
    );

    // Deleted through OPI, in reverse order: nothing is left.
    opi_delete(&svc)?;
    let subsystems = svc.dpuctl_json(&["subsystem", "list"])?;
    ensure!(subsystems == serde_json::json!([]), "{subsystems}");
    let volumes = svc.dpuctl_json(&["volume", "list"])?;
    ensure!(volumes == serde_json::json!([]), "{volumes}");
    Ok(())
}

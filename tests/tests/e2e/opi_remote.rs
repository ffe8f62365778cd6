//! OPI's `NvmeRemoteControllerService` through two real service
//! processes: the first serves a subsystem with two RAM namespaces; on
//! the second, through OPI's Rust clients, a remote controller with a
//! path to the first lists both namespaces with the NGUIDs the first
//! reports, and an OPI namespace made from `nvme0n1` serves the first's
//! namespace 1: what a host writes through the second, it reads back
//! from the first directly. What is not offered is refused naming OPI's
//! fields, a controller under a namespace is not deleted, and the
//! controller and the namespace survive a restart of the second.

use std::net::TcpStream;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dpu_e2e::{free_port, refused, Service};
use dpu_nvmeof::host::{self, Controller, ControllerOptions, HostIdentity, QueueOptions, Transfer};
use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

use opi::frontend_nvme_service_client::FrontendNvmeServiceClient;
use opi::nvme_remote_controller_service_client::NvmeRemoteControllerServiceClient;
use pb::storage_service_client::StorageServiceClient;

const FAR_NQN: &str = "nqn.2024-01.io.dpu-service.test:opi-far";
/// A subsystem no namespace here is backed by.
const OTHER_NQN: &str = "nqn.2024-01.io.dpu-service.test:other";
const NEAR_NQN: &str = "nqn.2024-01.io.dpu-service.test:opi-near";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000e2";

/// A host connected to one subsystem, with one I/O queue.
struct Host {
    _ctrl: Controller<TcpStream>,
    io: host::Queue<TcpStream>,
    block: usize,
}

impl Host {
    fn connect(port: u16, nqn: &str, nsid: u32) -> Result<Host> {
        let opts = ControllerOptions {
            kato: Duration::from_secs(10),
            queue: QueueOptions {
                timeout: Some(Duration::from_secs(20)),
                ..QueueOptions::default()
            },
        };
        let me = HostIdentity::new(HOST, [0xe2; 16]);
        let addr = ("127.0.0.1", port);
        let mut ctrl = Controller::connect(TcpStream::connect(addr)?, &me, nqn, &opts)?;
        ensure!(ctrl.set_io_queues(1)? >= 1);
        let io = ctrl.io_queue(TcpStream::connect(addr)?, 1, 16)?;
        let block = ctrl.identify_namespace(nsid)?.block_size as usize;
        Ok(Host {
            _ctrl: ctrl,
            io,
            block,
        })
    }

    fn write(&mut self, nsid: u32, slba: u64, data: Vec<u8>) -> Result<()> {
        let nlb = (data.len() / self.block - 1) as u16;
        let done = self
            .io
            .call(host::write(nsid, slba, nlb), Transfer::Write(data))?;
        ensure!(done.is_success(), "write: {:?}", done.status());
        Ok(())
    }

    fn read(&mut self, nsid: u32, slba: u64, len: usize) -> Result<Vec<u8>> {
        let nlb = (len / self.block - 1) as u16;
        let done = self
            .io
            .call(host::read(nsid, slba, nlb), Transfer::Read(vec![0; len]))?;
        ensure!(done.is_success(), "read: {:?}", done.status());
        Ok(done.data)
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn channel(svc: &Service) -> Result<Channel> {
    Ok(Channel::from_shared(svc.endpoint())?.connect().await?)
}

fn path(id: &str, traddr: &str, port: u16, subnqn: &str) -> opi::CreateNvmePathRequest {
    opi::CreateNvmePathRequest {
        parent: "nvmeRemoteControllers/nvme0".into(),
        nvme_path_id: id.into(),
        nvme_path: Some(opi::NvmePath {
            trtype: opi::NvmeTransportType::Tcp as i32,
            traddr: traddr.into(),
            fabrics: Some(opi::FabricsPath {
                trsvcid: i64::from(port),
                subnqn: subnqn.into(),
                adrfam: opi::NvmeAddressFamily::Ipv4 as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn controller(id: &str, tcp: opi::TcpController) -> opi::CreateNvmeRemoteControllerRequest {
    opi::CreateNvmeRemoteControllerRequest {
        nvme_remote_controller_id: id.into(),
        nvme_remote_controller: Some(opi::NvmeRemoteController {
            multipath: opi::NvmeMultipath::Failover as i32,
            tcp: Some(tcp),
            ..Default::default()
        }),
    }
}

#[test]
fn a_remote_controllers_namespace_serves_through_an_opi_namespace() -> Result<()> {
    let rt = runtime()?;
    // The first: subsystem "far", two RAM namespaces, any host.
    let far = Service::start()?;
    let far_port = free_port();
    far.dpuctl_ok(&[
        "subsystem",
        "create",
        "far",
        "--nqn",
        FAR_NQN,
        "--allow-any-host",
    ])?;
    far.dpuctl_ok(&["namespace", "create", "far", "--ram", "1M"])?;
    far.dpuctl_ok(&["namespace", "create", "far", "--ram", "2M"])?;
    far.dpuctl_ok(&[
        "listener",
        "create",
        "far",
        "--address",
        "127.0.0.1",
        "--port",
        &far_port.to_string(),
    ])?;
    let far_nguids: Vec<(u32, String)> = rt.block_on(async {
        let mut c = StorageServiceClient::new(channel(&far).await?);
        let l = c
            .list_namespaces(pb::ListNamespacesRequest {
                parent: "subsystems/far".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        anyhow::Ok(
            l.namespaces
                .into_iter()
                .map(|n| (n.nsid, n.nguid.to_lowercase()))
                .collect(),
        )
    })?;
    ensure!(
        far_nguids.len() == 2 && far_nguids.iter().all(|(_, g)| g.len() == 32),
        "{far_nguids:?}"
    );

    // The second: a remote controller with a path to the first.
    let mut near = Service::start()?;
    let near_port = free_port();
    rt.block_on(async {
        let ch = channel(&near).await?;
        let mut rc = NvmeRemoteControllerServiceClient::new(ch.clone());
        let mut fe = FrontendNvmeServiceClient::new(ch);
        // Refused by field: digests, a TLS key.
        for (tcp, field) in [
            (
                opi::TcpController {
                    hdgst: true,
                    ..Default::default()
                },
                "nvme_remote_controller.tcp.hdgst",
            ),
            (
                opi::TcpController {
                    ddgst: true,
                    ..Default::default()
                },
                "nvme_remote_controller.tcp.ddgst",
            ),
            (
                opi::TcpController {
                    psk: b"NVMeTLSkey-1:01:abc".to_vec(),
                    ..Default::default()
                },
                "nvme_remote_controller.tcp.psk",
            ),
        ] {
            refused(
                rc.create_nvme_remote_controller(controller("nvme0", tcp))
                    .await,
                Code::InvalidArgument,
                field,
            )?;
        }
        let made = rc
            .create_nvme_remote_controller(controller("nvme0", Default::default()))
            .await?
            .into_inner();
        ensure!(
            made.name == "nvmeRemoteControllers/nvme0" && made.queue_size == 128,
            "{made:?}"
        );
        rc.create_nvme_path(path("a", "127.0.0.1", far_port, FAR_NQN))
            .await?;

        // Both namespaces, with the NGUIDs the first reports.
        let listed = rc
            .list_nvme_remote_namespaces(opi::ListNvmeRemoteNamespacesRequest {
                parent: "nvmeRemoteControllers/nvme0".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let seen: Vec<(u32, String)> = listed
            .nvme_remote_namespaces
            .iter()
            .map(|n| (n.nsid as u32, n.nguid.clone()))
            .collect();
        ensure!(seen == far_nguids, "{seen:?} != {far_nguids:?}");
        ensure!(
            listed.nvme_remote_namespaces[1].name
                == "nvmeRemoteControllers/nvme0/nvmeRemoteNamespaces/2",
            "{listed:?}"
        );

        // An OPI subsystem, TCP controller and namespace made from
        // nvme0n1.
        fe.create_nvme_subsystem(opi::CreateNvmeSubsystemRequest {
            nvme_subsystem_id: "near".into(),
            nvme_subsystem: Some(opi::NvmeSubsystem {
                spec: Some(opi::NvmeSubsystemSpec {
                    nqn: NEAR_NQN.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
        fe.create_nvme_controller(opi::CreateNvmeControllerRequest {
            parent: "nvmeSubsystems/near".into(),
            nvme_controller_id: "tcp0".into(),
            nvme_controller: Some(opi::NvmeController {
                spec: Some(opi::NvmeControllerSpec {
                    trtype: opi::NvmeTransportType::Tcp as i32,
                    endpoint: Some(opi::nvme_controller_spec::Endpoint::FabricsId(
                        opi::FabricsEndpoint {
                            traddr: "127.0.0.1".into(),
                            trsvcid: near_port.to_string(),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
        let ns = fe
            .create_nvme_namespace(opi::CreateNvmeNamespaceRequest {
                parent: "nvmeSubsystems/near".into(),
                nvme_namespace_id: "remote1".into(),
                nvme_namespace: Some(opi::NvmeNamespace {
                    spec: Some(opi::NvmeNamespaceSpec {
                        volume_name_ref: "nvme0n1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        ensure!(
            ns.spec.as_ref().map(|s| s.volume_name_ref.as_str()) == Some("nvme0n1"),
            "{ns:?}"
        );
        anyhow::Ok(())
    })?;

    // A host writes through the second and reads the same bytes back
    // from the first directly.
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut through = Host::connect(near_port, NEAR_NQN, 1).context("host on the second")?;
    through.write(1, 8, data.clone())?;
    ensure!(through.read(1, 8, data.len())? == data);
    let mut direct = Host::connect(far_port, FAR_NQN, 1).context("host on the first")?;
    ensure!(
        direct.read(1, 8, data.len())? == data,
        "the first does not hold what was written through the second"
    );
    drop(through);

    rt.block_on(async {
        let mut rc = NvmeRemoteControllerServiceClient::new(channel(&near).await?);
        // No path comes, changes or goes under its namespace (which
        // would not follow), and the controller stays.
        refused(
            rc.create_nvme_path(path("b", "127.0.0.2", far_port, FAR_NQN))
                .await,
            Code::FailedPrecondition,
            "paths it was made with",
        )?;
        refused(
            rc.delete_nvme_path(opi::DeleteNvmePathRequest {
                name: "nvmeRemoteControllers/nvme0/nvmePaths/a".into(),
                allow_missing: false,
            })
            .await,
            Code::FailedPrecondition,
            "subsystems/near/namespaces/1",
        )?;
        // Four paths at most; one subsystem a controller (on a
        // controller of a subsystem nothing is backed by).
        rc.create_nvme_remote_controller(controller("spare", opi::TcpController::default()))
            .await?;
        let spare = |id: &str, addr: &str, nqn: &str| {
            let mut p = path(id, addr, far_port, nqn);
            p.parent = "nvmeRemoteControllers/spare".into();
            p
        };
        rc.create_nvme_path(spare("a", "127.0.0.1", OTHER_NQN))
            .await?;
        refused(
            rc.create_nvme_path(spare(
                "b",
                "127.0.0.2",
                "nqn.2024-01.io.dpu-service.test:third",
            ))
            .await,
            Code::FailedPrecondition,
            "nvme_path.fabrics.subnqn",
        )?;
        for (id, addr) in [("b", "127.0.0.2"), ("c", "127.0.0.3"), ("d", "127.0.0.4")] {
            rc.create_nvme_path(spare(id, addr, OTHER_NQN)).await?;
        }
        refused(
            rc.create_nvme_path(spare("e", "127.0.0.5", OTHER_NQN))
                .await,
            Code::ResourceExhausted,
            "paths of a remote controller",
        )?;
        for id in ["a", "b", "c", "d"] {
            rc.delete_nvme_path(opi::DeleteNvmePathRequest {
                name: format!("nvmeRemoteControllers/spare/nvmePaths/{id}"),
                allow_missing: false,
            })
            .await?;
        }
        rc.delete_nvme_remote_controller(opi::DeleteNvmeRemoteControllerRequest {
            name: "nvmeRemoteControllers/spare".into(),
            allow_missing: false,
        })
        .await?;
        refused(
            rc.delete_nvme_remote_controller(opi::DeleteNvmeRemoteControllerRequest {
                name: "nvmeRemoteControllers/nvme0".into(),
                allow_missing: false,
            })
            .await,
            Code::FailedPrecondition,
            "subsystems/near/namespaces/1",
        )?;
        rc.reset_nvme_remote_controller(opi::ResetNvmeRemoteControllerRequest {
            name: "nvmeRemoteControllers/nvme0".into(),
        })
        .await?;
        let stats = rc
            .stats_nvme_remote_controller(opi::StatsNvmeRemoteControllerRequest {
                name: "nvmeRemoteControllers/nvme0".into(),
            })
            .await?
            .into_inner()
            .stats
            .unwrap_or_default();
        ensure!(
            stats.write_ops_count >= 1 && stats.read_ops_count >= 1,
            "{stats:?}"
        );
        anyhow::Ok(())
    })?;

    // A restart of the second keeps the controller, its path and the
    // namespace, which serves again.
    near.restart()?;
    rt.block_on(async {
        let ch = channel(&near).await?;
        let mut rc = NvmeRemoteControllerServiceClient::new(ch.clone());
        let mut fe = FrontendNvmeServiceClient::new(ch);
        let paths = rc
            .list_nvme_paths(opi::ListNvmePathsRequest {
                parent: "nvmeRemoteControllers/nvme0".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        ensure!(
            paths.nvme_paths.len() == 1
                && paths.nvme_paths[0].name == "nvmeRemoteControllers/nvme0/nvmePaths/a",
            "{paths:?}"
        );
        let ns = fe
            .get_nvme_namespace(opi::GetNvmeNamespaceRequest {
                name: "nvmeSubsystems/near/nvmeNamespaces/remote1".into(),
            })
            .await?
            .into_inner();
        ensure!(
            ns.spec.as_ref().map(|s| s.volume_name_ref.as_str()) == Some("nvme0n1"),
            "{ns:?}"
        );
        anyhow::Ok(())
    })?;
    let mut again = Host::connect(near_port, NEAR_NQN, 1).context("host after the restart")?;
    ensure!(again.read(1, 8, data.len())? == data);
    drop(again);

    // Without its namespace, the controller goes.
    rt.block_on(async {
        let ch = channel(&near).await?;
        let mut rc = NvmeRemoteControllerServiceClient::new(ch.clone());
        let mut fe = FrontendNvmeServiceClient::new(ch);
        fe.delete_nvme_namespace(opi::DeleteNvmeNamespaceRequest {
            name: "nvmeSubsystems/near/nvmeNamespaces/remote1".into(),
            allow_missing: false,
        })
        .await?;
        rc.delete_nvme_remote_controller(opi::DeleteNvmeRemoteControllerRequest {
            name: "nvmeRemoteControllers/nvme0".into(),
            allow_missing: false,
        })
        .await?;
        refused(
            rc.get_nvme_remote_controller(opi::GetNvmeRemoteControllerRequest {
                name: "nvmeRemoteControllers/nvme0".into(),
            })
            .await,
            Code::NotFound,
            "nvmeRemoteControllers/nvme0",
        )?;
        anyhow::Ok(())
    })?;
    Ok(())
}

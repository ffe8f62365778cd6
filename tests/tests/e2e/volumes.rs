//! Volumes through the real binary: a RAM volume's contents written by a
//! host through one namespace are read back through the next namespace
//! made on it (in another subsystem); a volume resized under its
//! namespace is seen by the host at its new size; a null volume reads
//! zeros; one namespace per volume, no volume deleted under its
//! namespace, RAM volumes and namespaces within one RAM limit; volumes
//! and the namespaces on them survive a restart; volumes declared in the
//! configuration are made at the first start and kept as stored after.

use std::net::TcpStream;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dpu_e2e::{free_port, Service};
use dpu_nvmeof::host::{self, Controller, ControllerOptions, HostIdentity, QueueOptions, Transfer};
use dpu_proto::v1 as pb;
use tonic::Code;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-0000000000e1";

type Client = pb::storage_service_client::StorageServiceClient<tonic::transport::Channel>;

/// Runs `call` with a `dpu.v1` storage client connected to `svc`.
fn with_client<T, F>(svc: &Service, call: impl FnOnce(Client) -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    dpu_e2e::block_on(async { call(Client::connect(svc.endpoint()).await?).await })
}

/// Subsystem `id` (`nqn`, any host) listening on 127.0.0.1:`port`, with
/// no namespace.
async fn subsystem(c: &mut Client, id: &str, nqn: &str, port: u16) -> Result<()> {
    c.create_subsystem(pb::CreateSubsystemRequest {
        subsystem_id: id.into(),
        subsystem: Some(pb::Subsystem {
            nqn: nqn.into(),
            allow_any_host: true,
            ..Default::default()
        }),
    })
    .await?;
    c.create_listener(pb::CreateListenerRequest {
        parent: format!("subsystems/{id}"),
        listener: Some(pb::Listener {
            address: "127.0.0.1".into(),
            port: u32::from(port),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await?;
    Ok(())
}

/// A namespace of `sid` made on volume `volume`.
fn on_volume(sid: &str, volume: &str) -> pb::CreateNamespaceRequest {
    pb::CreateNamespaceRequest {
        parent: format!("subsystems/{sid}"),
        namespace: Some(pb::Namespace {
            backend: Some(pb::namespace::Backend::Volume(volume.into())),
            ..Default::default()
        }),
    }
}

/// A host connected to `nqn` at 127.0.0.1:`port` with one I/O queue,
/// doing I/O to namespace 1 in its blocks.
struct Host {
    ctrl: Controller<TcpStream>,
    io: host::Queue<TcpStream>,
    block: usize,
}

impl Host {
    fn connect(port: u16, nqn: &str) -> Result<Host> {
        let opts = ControllerOptions {
            kato: Duration::from_secs(10),
            queue: QueueOptions {
                timeout: Some(Duration::from_secs(20)),
                ..QueueOptions::default()
            },
        };
        let me = HostIdentity::new(HOST, [0xe1; 16]);
        let addr = ("127.0.0.1", port);
        let mut ctrl = Controller::connect(TcpStream::connect(addr)?, &me, nqn, &opts)?;
        ensure!(ctrl.set_io_queues(1)? >= 1);
        let io = ctrl.io_queue(TcpStream::connect(addr)?, 1, 16)?;
        let block = ctrl.identify_namespace(1)?.block_size as usize;
        Ok(Host { ctrl, io, block })
    }

    /// Namespace 1's size in bytes, as Identify Namespace gives it.
    fn size(&mut self) -> Result<u64> {
        Ok(self.ctrl.identify_namespace(1)?.bytes())
    }

    fn write(&mut self, slba: u64, data: Vec<u8>) -> Result<()> {
        let nlb = (data.len() / self.block - 1) as u16;
        let done = self
            .io
            .call(host::write(1, slba, nlb), Transfer::Write(data))?;
        ensure!(done.is_success(), "write: {:?}", done.status());
        Ok(())
    }

    fn read(&mut self, slba: u64, len: usize) -> Result<Vec<u8>> {
        let nlb = (len / self.block - 1) as u16;
        let done = self
            .io
            .call(host::read(1, slba, nlb), Transfer::Read(vec![0; len]))?;
        ensure!(done.is_success(), "read: {:?}", done.status());
        Ok(done.data)
    }
}

#[test]
fn a_ram_volume_keeps_its_contents_from_one_namespace_to_the_next() -> Result<()> {
    let mut svc = Service::start()?;
    let (p1, p2) = (free_port(), free_port());
    let (nqn1, nqn2) = (
        "nqn.2024-01.io.dpu-service.test:vol-a",
        "nqn.2024-01.io.dpu-service.test:vol-b",
    );
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();

    let v = with_client(&svc, |mut c| async move {
        let v = c
            .create_volume(pb::CreateVolumeRequest {
                volume_id: "Malloc1".into(),
                volume: Some(pb::Volume {
                    backend: Some(pb::volume::Backend::Ram(pb::RamBackend {
                        size_bytes: 1 << 20,
                    })),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        subsystem(&mut c, "vol-a", nqn1, p1).await?;
        subsystem(&mut c, "vol-b", nqn2, p2).await?;
        let ns = c
            .create_namespace(on_volume("vol-a", "volumes/Malloc1"))
            .await?;
        let ns = ns.into_inner();
        ensure!(
            ns.backend == Some(pb::namespace::Backend::Volume("Malloc1".into())),
            "{ns:?}"
        );
        ensure!((ns.block_size, ns.size_bytes) == (512, 1 << 20), "{ns:?}");
        Ok(v)
    })?;
    assert_eq!(v.name, "volumes/Malloc1");
    assert_eq!((v.size_bytes, v.block_size), (1 << 20, 512));
    assert!(!v.uuid.is_empty());

    let mut h = Host::connect(p1, nqn1).context("host on vol-a")?;
    assert_eq!(h.size()?, 1 << 20);
    h.write(64, pattern.clone())?;
    drop(h);

    // The volume shows the namespace made on it; no second namespace,
    // no deletion under it.
    with_client(&svc, |mut c| async move {
        let v = c
            .get_volume(pb::GetVolumeRequest {
                name: "volumes/Malloc1".into(),
            })
            .await?
            .into_inner();
        ensure!(v.namespace == "subsystems/vol-a/namespaces/1", "{v:?}");
        let e = c
            .create_namespace(on_volume("vol-b", "Malloc1"))
            .await
            .unwrap_err();
        ensure!(e.code() == Code::FailedPrecondition, "{e:?}");
        ensure!(
            e.message().contains("subsystems/vol-a/namespaces/1"),
            "{e:?}"
        );
        let e = c
            .delete_volume(pb::DeleteVolumeRequest {
                name: "volumes/Malloc1".into(),
            })
            .await
            .unwrap_err();
        ensure!(e.code() == Code::FailedPrecondition, "{e:?}");
        // The namespace goes, and the next one, elsewhere, is made on it.
        c.delete_namespace(pb::DeleteNamespaceRequest {
            name: "subsystems/vol-a/namespaces/1".into(),
        })
        .await?;
        c.create_namespace(on_volume("vol-b", "Malloc1")).await?;
        Ok(())
    })?;
    let mut h = Host::connect(p2, nqn2).context("host on vol-b")?;
    assert_eq!(h.read(64, 4096)?, pattern, "what vol-a's host wrote");

    // Resized under its namespace: the host sees the new size.
    with_client(&svc, |mut c| async move {
        let v = c
            .resize_volume(pb::ResizeVolumeRequest {
                name: "volumes/Malloc1".into(),
                size_bytes: 2 << 20,
            })
            .await?
            .into_inner();
        ensure!(v.size_bytes == 2 << 20, "{v:?}");
        let e = c
            .resize_namespace(pb::ResizeNamespaceRequest {
                name: "subsystems/vol-b/namespaces/1".into(),
                size_bytes: 4 << 20,
            })
            .await
            .unwrap_err();
        ensure!(e.message().contains("ResizeVolume"), "{e:?}");
        Ok(())
    })?;
    assert_eq!(h.size()?, 2 << 20);
    assert_eq!(h.read(64, 4096)?, pattern, "kept across the resize");
    drop(h);

    // A restart keeps the volume and its namespace (RAM contents are
    // the process's, as a RAM namespace's are).
    svc.restart()?;
    let mut h = Host::connect(p2, nqn2).context("host after the restart")?;
    assert_eq!(h.size()?, 2 << 20);
    with_client(&svc, |mut c| async move {
        let list = c
            .list_volumes(pb::ListVolumesRequest::default())
            .await?
            .into_inner();
        ensure!(list.volumes.len() == 1, "{list:?}");
        ensure!(
            list.volumes[0].namespace == "subsystems/vol-b/namespaces/1",
            "{list:?}"
        );
        c.delete_namespace(pb::DeleteNamespaceRequest {
            name: "subsystems/vol-b/namespaces/1".into(),
        })
        .await?;
        c.delete_volume(pb::DeleteVolumeRequest {
            name: "volumes/Malloc1".into(),
        })
        .await?;
        let e = c
            .get_volume(pb::GetVolumeRequest {
                name: "volumes/Malloc1".into(),
            })
            .await
            .unwrap_err();
        ensure!(e.code() == Code::NotFound, "{e:?}");
        Ok(())
    })?;
    Ok(())
}

#[test]
fn null_volumes_and_the_ram_limit() -> Result<()> {
    let config = format!(
        "{}\n[limits]\nmax_volumes = 3\n",
        dpu_e2e::TEST_CONFIG.replace("ram_limit = \"256MiB\"", "ram_limit = \"2MiB\"")
    );
    let svc = Service::start_config(&config, &[])?;
    let port = free_port();
    let nqn = "nqn.2024-01.io.dpu-service.test:vol-null";
    let volume = |id: &str, b: pb::volume::Backend| pb::CreateVolumeRequest {
        volume_id: id.into(),
        volume: Some(pb::Volume {
            backend: Some(b),
            block_size: 4096,
            ..Default::default()
        }),
    };
    with_client(&svc, |mut c| async move {
        let null = pb::volume::Backend::Null(pb::NullBackend {
            size_bytes: 1 << 40,
        });
        c.create_volume(volume("n1", null)).await?;
        let ram = |size_bytes| pb::volume::Backend::Ram(pb::RamBackend { size_bytes });
        c.create_volume(volume("r1", ram(1 << 20))).await?;
        // RAM volumes and RAM namespaces share storage.ram_limit.
        let e = c
            .create_volume(volume("r2", ram(2 << 20)))
            .await
            .unwrap_err();
        ensure!(e.message().contains("storage.ram_limit"), "{e:?}");
        subsystem(&mut c, "vol-null", nqn, port).await?;
        let e = c
            .create_namespace(pb::CreateNamespaceRequest {
                parent: "subsystems/vol-null".into(),
                namespace: Some(pb::Namespace {
                    backend: Some(pb::namespace::Backend::Ram(pb::RamBackend {
                        size_bytes: 2 << 20,
                    })),
                    ..Default::default()
                }),
            })
            .await
            .unwrap_err();
        ensure!(e.message().contains("storage.ram_limit"), "{e:?}");
        // A volume's block size is the namespace's; another is refused.
        let mut other = on_volume("vol-null", "n1");
        if let Some(n) = other.namespace.as_mut() {
            n.block_size = 512;
        }
        let e = c.create_namespace(other).await.unwrap_err();
        ensure!(e.code() == Code::InvalidArgument, "{e:?}");
        ensure!(e.message().contains("namespace.block_size"), "{e:?}");
        let ns = c
            .create_namespace(on_volume("vol-null", "n1"))
            .await?
            .into_inner();
        ensure!(ns.block_size == 4096 && ns.size_bytes == 1 << 40, "{ns:?}");
        // A missing volume, a malformed reference and the cap are named.
        let e = c
            .create_namespace(on_volume("vol-null", "nope"))
            .await
            .unwrap_err();
        ensure!(e.message().contains("volumes/nope does not exist"), "{e:?}");
        let e = c
            .create_namespace(on_volume("vol-null", "a/b"))
            .await
            .unwrap_err();
        ensure!(e.code() == Code::InvalidArgument, "{e:?}");
        c.create_volume(volume(
            "n2",
            pb::volume::Backend::Null(pb::NullBackend { size_bytes: 4096 }),
        ))
        .await?;
        let e = c
            .create_volume(volume(
                "n3",
                pb::volume::Backend::Null(pb::NullBackend { size_bytes: 4096 }),
            ))
            .await
            .unwrap_err();
        ensure!(e.message().contains("limits.max_volumes"), "{e:?}");
        Ok(())
    })?;
    // A null store reads zeros, and takes writes.
    let mut h = Host::connect(port, nqn)?;
    assert_eq!(h.size()?, 1 << 40);
    assert_eq!(h.block, 4096, "the volume's block size");
    h.write(8, vec![0xab; 8192])?;
    assert_eq!(h.read(8, 8192)?, vec![0; 8192]);
    Ok(())
}

#[test]
fn declared_volumes_are_made_at_the_first_start_and_kept() -> Result<()> {
    let port = free_port();
    let nqn = "nqn.2024-01.io.dpu-service.test:vol-declared";
    let config = format!(
        "{}\n[[storage.volumes]]\nid = \"Malloc0\"\nram = \"4MiB\"\n\
         [[storage.subsystems]]\nid = \"declared\"\nnqn = \"{nqn}\"\nallow_any_host = true\n\
         [[storage.subsystems.namespaces]]\nvolume = \"Malloc0\"\n\
         [[storage.subsystems.listeners]]\naddress = \"127.0.0.1\"\nport = {port}\n",
        dpu_e2e::TEST_CONFIG
    );
    let mut svc = Service::start_config(&config, &[])?;
    let mut h = Host::connect(port, nqn)?;
    assert_eq!(h.size()?, 4 << 20);
    h.write(0, vec![0x5a; 512])?;
    drop(h);
    // Changed over gRPC: the stored volume is kept at the next start.
    with_client(&svc, |mut c| async move {
        c.resize_volume(pb::ResizeVolumeRequest {
            name: "volumes/Malloc0".into(),
            size_bytes: 8 << 20,
        })
        .await?;
        Ok(())
    })?;
    svc.restart()?;
    let mut h = Host::connect(port, nqn)?;
    assert_eq!(h.size()?, 8 << 20, "the stored size, not the declared one");
    let v = with_client(&svc, |mut c| async move {
        Ok(c.get_volume(pb::GetVolumeRequest {
            name: "volumes/Malloc0".into(),
        })
        .await?
        .into_inner())
    })?;
    assert_eq!(v.namespace, "subsystems/declared/namespaces/1");
    Ok(())
}

//! OPI's volume services (`opi_api.storage.v1.MallocVolumeService`,
//! `AioVolumeService`, `NullVolumeService`) through the real binary, with
//! the Rust clients of OPI's protos: create, get, list with paging, a
//! resize through update, the refusals naming OPI's fields, stats and
//! delete. What OPI makes is a `dpu.v1` volume and the reverse, each
//! service sees only its kind of volume in the one ID space, a volume a
//! `dpu.v1` namespace is made on cannot be deleted, and all of it
//! survives a restart.

use anyhow::{ensure, Context, Result};
use dpu_e2e::refused;
use dpu_e2e::Service;
use dpu_proto::opi::storage::v1 as opi;
use dpu_proto::pbjson_types::FieldMask;
use dpu_proto::v1 as pb;
use tonic::transport::Channel;
use tonic::Code;

use opi::aio_volume_service_client::AioVolumeServiceClient;
use opi::malloc_volume_service_client::MallocVolumeServiceClient;
use opi::null_volume_service_client::NullVolumeServiceClient;
use pb::storage_service_client::StorageServiceClient;

/// Clients of the three OPI volume services and of `dpu.v1`'s storage
/// service, on one connection.
struct Clients {
    malloc: MallocVolumeServiceClient<Channel>,
    aio: AioVolumeServiceClient<Channel>,
    null: NullVolumeServiceClient<Channel>,
    dpu: StorageServiceClient<Channel>,
}

impl Clients {
    async fn connect(svc: &Service) -> Result<Clients> {
        let ch = Channel::from_shared(svc.endpoint())?.connect().await?;
        Ok(Clients {
            malloc: MallocVolumeServiceClient::new(ch.clone()),
            aio: AioVolumeServiceClient::new(ch.clone()),
            null: NullVolumeServiceClient::new(ch.clone()),
            dpu: StorageServiceClient::new(ch),
        })
    }
}

/// Runs `call` with clients connected to `svc`.
fn with_clients<T, F>(svc: &Service, call: impl FnOnce(Clients) -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    dpu_e2e::block_on(async { call(Clients::connect(svc).await?).await })
}

fn malloc(block_size: i64, blocks_count: i64) -> opi::MallocVolume {
    opi::MallocVolume {
        block_size,
        blocks_count,
        ..Default::default()
    }
}

fn create_malloc(id: &str, v: opi::MallocVolume) -> opi::CreateMallocVolumeRequest {
    opi::CreateMallocVolumeRequest {
        malloc_volume: Some(v),
        malloc_volume_id: id.into(),
    }
}

fn get_malloc(name: &str) -> opi::GetMallocVolumeRequest {
    opi::GetMallocVolumeRequest { name: name.into() }
}

#[test]
fn opi_volumes_are_dpu_v1_volumes() -> Result<()> {
    let mut svc = Service::start()?;
    // Beneath storage.file_dirs, by default <state.dir>/volumes.
    let image = svc.state_dir.join("volumes").join("a1.img");
    let image_path = image.display().to_string();

    let made_null = with_clients(&svc, |mut c| async move {
        // Create one of each kind.
        let m1 = c
            .malloc
            .create_malloc_volume(create_malloc("m1", malloc(512, 2048)))
            .await?
            .into_inner();
        ensure!(
            m1.name == "mallocVolumes/m1"
                && m1.block_size == 512
                && m1.blocks_count == 2048
                && m1.uuid.len() == 36,
            "{m1:?}"
        );
        let n = c
            .null
            .create_null_volume(opi::CreateNullVolumeRequest {
                null_volume: Some(opi::NullVolume {
                    block_size: 4096,
                    blocks_count: 256,
                    ..Default::default()
                }),
                null_volume_id: String::new(),
            })
            .await?
            .into_inner();
        ensure!(
            n.name.starts_with("nullVolumes/opi-") && n.blocks_count == 256,
            "a generated ID: {n:?}"
        );
        let a1 = c
            .aio
            .create_aio_volume(opi::CreateAioVolumeRequest {
                aio_volume: Some(opi::AioVolume {
                    block_size: 4096,
                    blocks_count: 64,
                    filename: image_path.clone(),
                    ..Default::default()
                }),
                aio_volume_id: "a1".into(),
            })
            .await?
            .into_inner();
        ensure!(
            a1.name == "aioVolumes/a1" && a1.blocks_count == 64 && a1.filename == image_path,
            "{a1:?}"
        );

        // Get, and the kinds apart in the one ID space.
        let got = c
            .malloc
            .get_malloc_volume(get_malloc("mallocVolumes/m1"))
            .await?
            .into_inner();
        ensure!(got == m1, "{got:?} != {m1:?}");
        refused(
            c.null
                .get_null_volume(opi::GetNullVolumeRequest {
                    name: "nullVolumes/m1".into(),
                })
                .await,
            Code::NotFound,
            "nullVolumes/m1",
        )?;
        refused(
            c.aio
                .stats_aio_volume(opi::StatsAioVolumeRequest {
                    name: "aioVolumes/m1".into(),
                })
                .await,
            Code::NotFound,
            "aioVolumes/m1",
        )?;
        refused(
            c.malloc
                .create_malloc_volume(create_malloc("a1", malloc(512, 8)))
                .await,
            Code::AlreadyExists,
            "a1",
        )?;
        refused(
            c.malloc.get_malloc_volume(get_malloc("volumes/m1")).await,
            Code::InvalidArgument,
            "mallocVolumes/{id}",
        )?;

        // Refusals name OPI's fields.
        refused(
            c.malloc
                .create_malloc_volume(create_malloc("bad", malloc(0, 8)))
                .await,
            Code::InvalidArgument,
            "malloc_volume.block_size",
        )?;
        let mut meta = malloc(512, 8);
        meta.metadata_size = 64;
        refused(
            c.malloc
                .create_malloc_volume(create_malloc("bad", meta))
                .await,
            Code::InvalidArgument,
            "malloc_volume.metadata_size",
        )?;
        refused(
            c.malloc
                .create_malloc_volume(create_malloc("bad", malloc(4096, i64::MAX)))
                .await,
            Code::InvalidArgument,
            "malloc_volume.blocks_count",
        )?;
        refused(
            c.aio
                .create_aio_volume(opi::CreateAioVolumeRequest {
                    aio_volume: Some(opi::AioVolume {
                        block_size: 512,
                        blocks_count: 8,
                        filename: "/etc/opi-volume.img".into(),
                        ..Default::default()
                    }),
                    aio_volume_id: "bad".into(),
                })
                .await,
            Code::PermissionDenied,
            "aio_volume.filename",
        )?;

        // List pages over one kind only.
        c.malloc
            .create_malloc_volume(create_malloc("m2", malloc(512, 2048)))
            .await?;
        let first = c
            .malloc
            .list_malloc_volumes(opi::ListMallocVolumesRequest {
                page_size: 1,
                page_token: String::new(),
            })
            .await?
            .into_inner();
        ensure!(
            first.malloc_volumes.len() == 1
                && first.malloc_volumes[0].name == "mallocVolumes/m1"
                && !first.next_page_token.is_empty(),
            "{first:?}"
        );
        let second = c
            .malloc
            .list_malloc_volumes(opi::ListMallocVolumesRequest {
                page_size: 1,
                page_token: first.next_page_token,
            })
            .await?
            .into_inner();
        ensure!(
            second.malloc_volumes.len() == 1
                && second.malloc_volumes[0].name == "mallocVolumes/m2"
                && second.next_page_token.is_empty(),
            "{second:?}"
        );
        let aios = c
            .aio
            .list_aio_volumes(opi::ListAioVolumesRequest::default())
            .await?
            .into_inner();
        ensure!(
            aios.aio_volumes.len() == 1 && aios.aio_volumes[0].name == "aioVolumes/a1",
            "{aios:?}"
        );

        // Update: the block count grows, as dpu.v1 shows; the block size
        // cannot change.
        let mut grown = m1.clone();
        grown.blocks_count = 4096;
        let up = c
            .malloc
            .update_malloc_volume(opi::UpdateMallocVolumeRequest {
                malloc_volume: Some(grown.clone()),
                update_mask: Some(FieldMask {
                    paths: vec!["blocks_count".into()],
                }),
                allow_missing: false,
            })
            .await?
            .into_inner();
        ensure!(up == grown, "{up:?} != {grown:?}");
        let v = c
            .dpu
            .get_volume(pb::GetVolumeRequest {
                name: "volumes/m1".into(),
            })
            .await?
            .into_inner();
        ensure!(v.size_bytes == 4096 * 512, "dpu.v1 after the resize: {v:?}");
        let mut resized = grown.clone();
        resized.block_size = 4096;
        refused(
            c.malloc
                .update_malloc_volume(opi::UpdateMallocVolumeRequest {
                    malloc_volume: Some(resized),
                    update_mask: Some(FieldMask {
                        paths: vec!["block_size".into()],
                    }),
                    allow_missing: false,
                })
                .await,
            Code::InvalidArgument,
            "malloc_volume.block_size",
        )?;
        refused(
            c.malloc
                .update_malloc_volume(opi::UpdateMallocVolumeRequest {
                    malloc_volume: Some(grown.clone()),
                    update_mask: Some(FieldMask {
                        paths: vec!["colour".into()],
                    }),
                    allow_missing: false,
                })
                .await,
            Code::InvalidArgument,
            "update_mask",
        )?;
        // allow_missing creates.
        let n2 = c
            .null
            .update_null_volume(opi::UpdateNullVolumeRequest {
                null_volume: Some(opi::NullVolume {
                    name: "nullVolumes/n2".into(),
                    block_size: 512,
                    blocks_count: 16,
                    ..Default::default()
                }),
                update_mask: None,
                allow_missing: true,
            })
            .await?
            .into_inner();
        ensure!(
            n2.name == "nullVolumes/n2" && n2.blocks_count == 16,
            "{n2:?}"
        );

        // Stats: nothing served it, all zero.
        let stats = c
            .malloc
            .stats_malloc_volume(opi::StatsMallocVolumeRequest {
                name: "mallocVolumes/m1".into(),
            })
            .await?
            .into_inner()
            .stats
            .context("no stats")?;
        ensure!(stats == opi::VolumeStats::default(), "{stats:?}");
        refused(
            c.malloc
                .stats_malloc_volume(opi::StatsMallocVolumeRequest {
                    name: "mallocVolumes/nope".into(),
                })
                .await,
            Code::NotFound,
            "mallocVolumes/nope",
        )?;

        // dpu.v1 sees what OPI made, and OPI what dpu.v1 made.
        let all = c
            .dpu
            .list_volumes(pb::ListVolumesRequest::default())
            .await?
            .into_inner();
        let names: Vec<&str> = all.volumes.iter().map(|v| v.name.as_str()).collect();
        for want in ["volumes/a1", "volumes/m1", "volumes/m2", "volumes/n2"] {
            ensure!(names.contains(&want), "{want} not in {names:?}");
        }
        ensure!(names.len() == 5, "{names:?}");
        let a = c
            .dpu
            .get_volume(pb::GetVolumeRequest {
                name: "volumes/a1".into(),
            })
            .await?
            .into_inner();
        ensure!(
            matches!(&a.backend, Some(pb::volume::Backend::File(f)) if f.path == image_path)
                && a.block_size == 4096
                && a.size_bytes == 64 * 4096
                && a.uuid == a1.uuid,
            "{a:?}"
        );
        c.dpu
            .create_volume(pb::CreateVolumeRequest {
                volume_id: "d1".into(),
                volume: Some(pb::Volume {
                    backend: Some(pb::volume::Backend::Ram(pb::RamBackend {
                        size_bytes: 1 << 20,
                    })),
                    block_size: 4096,
                    ..Default::default()
                }),
            })
            .await?;
        let d1 = c
            .malloc
            .get_malloc_volume(get_malloc("mallocVolumes/d1"))
            .await?
            .into_inner();
        ensure!(d1.block_size == 4096 && d1.blocks_count == 256, "{d1:?}");

        // Delete: allow_missing, another kind's name deleting nothing,
        // the volume gone after.
        c.malloc
            .delete_malloc_volume(opi::DeleteMallocVolumeRequest {
                name: "mallocVolumes/nope".into(),
                allow_missing: true,
            })
            .await?;
        refused(
            c.malloc
                .delete_malloc_volume(opi::DeleteMallocVolumeRequest {
                    name: "mallocVolumes/nope".into(),
                    allow_missing: false,
                })
                .await,
            Code::NotFound,
            "mallocVolumes/nope",
        )?;
        c.null
            .delete_null_volume(opi::DeleteNullVolumeRequest {
                name: "nullVolumes/d1".into(),
                allow_missing: true,
            })
            .await?;
        c.malloc
            .get_malloc_volume(get_malloc("mallocVolumes/d1"))
            .await?;
        c.malloc
            .delete_malloc_volume(opi::DeleteMallocVolumeRequest {
                name: "mallocVolumes/d1".into(),
                allow_missing: false,
            })
            .await?;
        refused(
            c.dpu
                .get_volume(pb::GetVolumeRequest {
                    name: "volumes/d1".into(),
                })
                .await,
            Code::NotFound,
            "volumes/d1",
        )?;

        // A namespace made on m2 through dpu.v1 holds it.
        c.dpu
            .create_subsystem(pb::CreateSubsystemRequest {
                subsystem_id: "s1".into(),
                subsystem: Some(pb::Subsystem {
                    nqn: "nqn.2024-01.io.example:opi-volume".into(),
                    allow_any_host: true,
                    ..Default::default()
                }),
            })
            .await?;
        let ns = c
            .dpu
            .create_namespace(pb::CreateNamespaceRequest {
                parent: "subsystems/s1".into(),
                namespace: Some(pb::Namespace {
                    backend: Some(pb::namespace::Backend::Volume("m2".into())),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        refused(
            c.malloc
                .delete_malloc_volume(opi::DeleteMallocVolumeRequest {
                    name: "mallocVolumes/m2".into(),
                    allow_missing: true,
                })
                .await,
            Code::FailedPrecondition,
            &ns.name,
        )?;
        let stats = c
            .malloc
            .stats_malloc_volume(opi::StatsMallocVolumeRequest {
                name: "mallocVolumes/m2".into(),
            })
            .await?
            .into_inner();
        ensure!(stats.stats.is_some(), "{stats:?}");
        Ok(n.name)
    })?;

    // OPI's volume calls are counted by method and code.
    let m = svc.http_get("/metrics")?.1;
    for want in [
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.MallocVolumeService/CreateMallocVolume\",code=\"Ok\"}",
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.MallocVolumeService/CreateMallocVolume\",code=\"InvalidArgument\"}",
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.NullVolumeService/UpdateNullVolume\",code=\"Ok\"}",
        "dpu_grpc_requests_total{method=\"/opi_api.storage.v1.AioVolumeService/CreateAioVolume\",code=\"Ok\"}",
    ] {
        ensure!(m.contains(want), "{want} is not on /metrics");
    }

    // Stored once: after a restart OPI still has it all, and the
    // namespace still holds m2.
    svc.restart()?;
    with_clients(&svc, |mut c| async move {
        let m1 = c
            .malloc
            .get_malloc_volume(get_malloc("mallocVolumes/m1"))
            .await?
            .into_inner();
        ensure!(m1.blocks_count == 4096, "after restart: {m1:?}");
        let a1 = c
            .aio
            .get_aio_volume(opi::GetAioVolumeRequest {
                name: "aioVolumes/a1".into(),
            })
            .await?
            .into_inner();
        ensure!(a1.blocks_count == 64, "after restart: {a1:?}");
        let nulls = c
            .null
            .list_null_volumes(opi::ListNullVolumesRequest::default())
            .await?
            .into_inner();
        let names: Vec<&str> = nulls.null_volumes.iter().map(|v| v.name.as_str()).collect();
        ensure!(
            names.len() == 2
                && names.contains(&made_null.as_str())
                && names.contains(&"nullVolumes/n2"),
            "after restart: {names:?}"
        );
        refused(
            c.malloc
                .delete_malloc_volume(opi::DeleteMallocVolumeRequest {
                    name: "mallocVolumes/m2".into(),
                    allow_missing: false,
                })
                .await,
            Code::FailedPrecondition,
            "volumes/m2",
        )?;
        c.aio
            .delete_aio_volume(opi::DeleteAioVolumeRequest {
                name: "aioVolumes/a1".into(),
                allow_missing: false,
            })
            .await?;
        refused(
            c.aio
                .get_aio_volume(opi::GetAioVolumeRequest {
                    name: "aioVolumes/a1".into(),
                })
                .await,
            Code::NotFound,
            "aioVolumes/a1",
        )?;
        Ok(())
    })
}

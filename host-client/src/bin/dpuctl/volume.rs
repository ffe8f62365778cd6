//! `dpuctl volume`: the volumes that namespaces are made on by naming
//! them (`dpuctl namespace create SUBSYSTEM --volume ID`); its
//! subcommands and flags, and their handler.

use clap::{ArgGroup, Subcommand};
use dpu_client::{parse_size, pb, volume_name, DpuClient};

use crate::common::{all_pages, deleted, json, Paging, Shown};
use crate::{render, Failure};

#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Creates a volume backed by RAM, a file, a block device or a null
    /// store. A RAM volume keeps its contents from one namespace made on
    /// it to the next, until the volume is deleted.
    #[command(group(ArgGroup::new("backend").required(true)))]
    Create {
        /// Volume ID (or volumes/ID).
        id: String,
        /// Memory-backed, of this size (e.g. 256M).
        #[arg(long, group = "backend", value_name = "SIZE", value_parser = parse_size)]
        ram: Option<u64>,
        /// File-backed, at this absolute path (created, if missing, when a
        /// namespace first serves the volume).
        #[arg(long, group = "backend", value_name = "PATH")]
        file: Option<String>,
        /// Size of a file backend (default: the existing file's size).
        #[arg(
            long,
            value_name = "SIZE",
            value_parser = parse_size,
            requires = "file",
            conflicts_with_all = ["ram", "block_device", "null"]
        )]
        size: Option<u64>,
        /// Block-device-backed, at this path (its size is the device's).
        #[arg(long, group = "backend", value_name = "PATH")]
        block_device: Option<String>,
        /// A null store of this size: reads return zeros, writes are
        /// dropped (benchmarks).
        #[arg(long, group = "backend", value_name = "SIZE", value_parser = parse_size)]
        null: Option<u64>,
        /// Logical block size, 512 or 4096 (default 512); a namespace made
        /// on the volume has it.
        #[arg(long, value_name = "BYTES", value_parser = block_size)]
        block_size: Option<u32>,
        /// Volume UUID (generated if absent).
        #[arg(long)]
        uuid: Option<String>,
    },
    /// Shows a volume, and the namespace made on it.
    Get {
        /// Volume ID (or volumes/ID).
        id: String,
    },
    /// Lists volumes.
    List(Paging),
    /// Resizes a RAM, null or file volume; the namespace made on it
    /// follows, and its hosts are told.
    Resize {
        /// Volume ID (or volumes/ID).
        id: String,
        /// New size (e.g. 1G).
        #[arg(value_name = "SIZE", value_parser = parse_size)]
        size: u64,
    },
    /// Deletes a volume, and a RAM volume's contents; refused while a
    /// namespace is made on it.
    Delete {
        /// Volume ID (or volumes/ID).
        id: String,
    },
}

/// A logical block size: 512 or 4096 bytes.
fn block_size(s: &str) -> Result<u32, String> {
    match s.trim() {
        "512" => Ok(512),
        "4096" => Ok(4096),
        _ => Err(format!("{s:?} is not a block size (512 or 4096)")),
    }
}

/// `dpuctl volume ...`.
pub async fn execute(c: &DpuClient, cmd: &VolumeCmd) -> Result<Shown, Failure> {
    let one = |v: pb::Volume| Shown {
        json: json(&v),
        text: render::volumes(std::slice::from_ref(&v)),
    };
    Ok(match cmd {
        VolumeCmd::Create {
            id,
            ram,
            file,
            size,
            block_device,
            null,
            block_size,
            uuid,
        } => {
            let backend = match (ram, file, block_device, null) {
                (Some(size_bytes), ..) => pb::volume::Backend::Ram(pb::RamBackend {
                    size_bytes: *size_bytes,
                }),
                (_, Some(path), ..) => pb::volume::Backend::File(pb::FileBackend {
                    path: path.clone(),
                    size_bytes: size.unwrap_or(0),
                }),
                (_, _, Some(path), _) => {
                    pb::volume::Backend::BlockDevice(pb::BlockDeviceBackend { path: path.clone() })
                }
                (_, _, _, Some(size_bytes)) => pb::volume::Backend::Null(pb::NullBackend {
                    size_bytes: *size_bytes,
                }),
                _ => {
                    return Err(Failure::Input(
                        "give one of --ram SIZE, --file PATH, --block-device PATH, --null SIZE"
                            .into(),
                    ))
                }
            };
            let v = pb::Volume {
                backend: Some(backend),
                block_size: block_size.unwrap_or(0),
                uuid: uuid.clone().unwrap_or_default(),
                ..Default::default()
            };
            one(c
                .create_volume(pb::CreateVolumeRequest {
                    volume_id: volume_id(id).to_string(),
                    volume: Some(v),
                })
                .await?)
        }
        VolumeCmd::Get { id } => one(c
            .get_volume(pb::GetVolumeRequest {
                name: volume_name(id),
            })
            .await?),
        VolumeCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_volumes(pb::ListVolumesRequest {
                        page_size: *page_size,
                        page_token,
                    })
                    .await?;
                Ok((r.volumes, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::volumes(&all),
            }
        }
        VolumeCmd::Resize { id, size } => one(c
            .resize_volume(pb::ResizeVolumeRequest {
                name: volume_name(id),
                size_bytes: *size,
            })
            .await?),
        VolumeCmd::Delete { id } => {
            c.delete_volume(pb::DeleteVolumeRequest {
                name: volume_name(id),
            })
            .await?;
            deleted(volume_name(id))
        }
    })
}

/// The bare ID of a volume given as `v1` or `volumes/v1`.
fn volume_id(id: &str) -> &str {
    id.strip_prefix("volumes/").unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_and_ids() {
        assert_eq!(block_size("512"), Ok(512));
        assert_eq!(block_size("4096"), Ok(4096));
        for bad in ["0", "1024", "4K", ""] {
            assert!(block_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(volume_id("volumes/v1"), "v1");
        assert_eq!(volume_id("v1"), "v1");
    }
}

//! Volume transitions: making, resizing and deleting the volumes that
//! namespaces are made on, and the checks a namespace on a volume makes.

use super::{cap, ram_refusal, Limits};
use crate::error::{ControlError, Result};
use crate::model::{volume_name, Backend, Namespace, State, Volume};

impl State {
    /// The volume with `id`, or NOT_FOUND.
    pub fn volume(&self, id: &str) -> Result<&Volume> {
        self.volumes
            .get(id)
            .ok_or_else(|| ControlError::NotFound(volume_name(id)))
    }

    /// Creates a volume; its UUID is generated unless `given_uuid`. RAM
    /// volumes count against the RAM limit as RAM namespaces do.
    pub fn create_volume(
        &mut self,
        limits: Limits,
        mut v: Volume,
        given_uuid: bool,
    ) -> Result<&Volume> {
        if self.volumes.contains_key(&v.id) {
            return Err(ControlError::AlreadyExists(format!(
                "{} already exists",
                volume_name(&v.id)
            )));
        }
        let n = self.index.volumes() + 1;
        cap("limits.max_volumes", limits.volumes, n, || {
            format!("{n} volumes")
        })?;
        match &v.backend {
            Backend::Ram { size_bytes } => self.check_ram(limits, None, *size_bytes)?,
            Backend::File { path, .. } | Backend::BlockDevice { path } => {
                if let Some(user) = self.index.path_user(path) {
                    return Err(ControlError::AlreadyExists(format!(
                        "{path} already backs {user}"
                    )));
                }
            }
            Backend::Null { .. } => {}
            Backend::Rbd { .. } | Backend::Remote(_) | Backend::Volume { .. } => {
                return Err(ControlError::invalid(
                    "volume",
                    "a volume is RAM, a file, a block device or a null store",
                ))
            }
        }
        if !given_uuid {
            v.uuid = super::storage::random_uuid();
        }
        self.index.add_volume(&v);
        let id = v.id.clone();
        Ok(self.volumes.entry(id).or_insert(v))
    }

    /// Resizes a RAM, null or file volume, as
    /// [`State::resize_namespace`] does a namespace: a file the service
    /// did not create is never made smaller.
    pub fn resize_volume(&mut self, limits: Limits, id: &str, size: u64) -> Result<&Volume> {
        let v = self.volume(id)?;
        if size == 0 || !size.is_multiple_of(u64::from(v.block_size)) {
            return Err(ControlError::invalid(
                "size_bytes",
                format!(
                    "{size} is not a non-zero multiple of the block size {}",
                    v.block_size
                ),
            ));
        }
        match v.backend {
            Backend::Ram { size_bytes } => {
                let held = self.index.ram_bytes().saturating_sub(size_bytes);
                let total = held.saturating_add(size);
                if total > limits.ram_bytes {
                    return Err(ram_refusal(total, limits));
                }
            }
            Backend::File {
                ref path,
                size_bytes,
                created: false,
            } if size < size_bytes => {
                return Err(ControlError::FailedPrecondition(format!(
                    "size_bytes: the service did not create {path}; it never makes it smaller than {size_bytes} bytes"
                )))
            }
            Backend::File { .. } | Backend::Null { .. } => {}
            _ => {
                return Err(ControlError::FailedPrecondition(
                    "a block-device volume takes its size from the device".into(),
                ))
            }
        }
        let mut v = v.clone();
        match &mut v.backend {
            Backend::Ram { size_bytes }
            | Backend::File { size_bytes, .. }
            | Backend::Null { size_bytes } => *size_bytes = size,
            _ => {}
        }
        let old = self.volumes.insert(id.to_string(), v);
        if let Some(old) = old {
            self.index.remove_volume(&old);
        }
        let State { volumes, index, .. } = self;
        let v = volumes
            .get(id)
            .ok_or_else(|| ControlError::NotFound(volume_name(id)))?;
        index.add_volume(v);
        Ok(v)
    }

    /// Deletes a volume; FAILED_PRECONDITION naming the namespace made on
    /// it while there is one.
    pub fn delete_volume(&mut self, id: &str) -> Result<()> {
        self.volume(id)?;
        if let Some(user) = self.index.volume_user(id) {
            return Err(ControlError::FailedPrecondition(format!(
                "{user} is made on {}: delete it first",
                volume_name(id)
            )));
        }
        if let Some(v) = self.volumes.remove(id) {
            self.index.remove_volume(&v);
        }
        Ok(())
    }

    /// Checks `ns`, a namespace to make on a volume, and gives it the
    /// volume's block size when it asks for none (0): the volume must
    /// exist and carry no other namespace, and a block size asked for
    /// must be the volume's.
    pub(super) fn check_volume(&self, ns: &mut Namespace) -> Result<()> {
        let Backend::Volume { id } = &ns.backend else {
            if ns.block_size == 0 {
                ns.block_size = 512;
            }
            return Ok(());
        };
        let v = self.volumes.get(id).ok_or_else(|| {
            ControlError::FailedPrecondition(format!(
                "namespace.volume: {} does not exist",
                volume_name(id)
            ))
        })?;
        if let Some(user) = self.index.volume_user(id) {
            return Err(ControlError::FailedPrecondition(format!(
                "namespace.volume: {user} is made on {} already",
                volume_name(id)
            )));
        }
        match ns.block_size {
            0 => ns.block_size = v.block_size,
            b if b != v.block_size => {
                return Err(ControlError::invalid(
                    "namespace.block_size",
                    format!(
                        "{b} differs from the block size of {} ({}); give 0 or it",
                        volume_name(id),
                        v.block_size
                    ),
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::subsystem;

    fn ram(id: &str, size_bytes: u64) -> Volume {
        Volume {
            id: id.into(),
            backend: Backend::Ram { size_bytes },
            block_size: 512,
            uuid: [0; 16],
        }
    }

    fn on(volume: &str, block_size: u32) -> Namespace {
        Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 0,
            backend: Backend::Volume { id: volume.into() },
            block_size,
            uuid: [0; 16],
            nguid: [0; 16],
            qos: Default::default(),
        }
    }

    fn code(e: ControlError) -> tonic::Code {
        tonic::Status::from(e).code()
    }

    #[test]
    fn a_volume_carries_one_namespace_and_outlives_it() {
        let lim = Limits::with_ram(1 << 20);
        let mut s = State::default();
        s.create_subsystem(lim, subsystem("a", "nqn.2024-01.io.example:a", true, 4))
            .unwrap();
        s.create_volume(lim, ram("v1", 8192), false).unwrap();
        assert_ne!(s.volume("v1").unwrap().uuid, [0; 16], "generated");
        let e = s.create_volume(lim, ram("v1", 512), false).unwrap_err();
        assert_eq!(code(e), tonic::Code::AlreadyExists);

        // A namespace asking for no block size takes the volume's; one
        // asking for another is refused, naming the field.
        let e = s
            .create_namespace(lim, "a", on("v1", 4096), false, false)
            .unwrap_err();
        assert!(e.to_string().contains("namespace.block_size"), "{e}");
        let n = s
            .create_namespace(lim, "a", on("v1", 0), false, false)
            .unwrap();
        assert_eq!((n.nsid, n.block_size), (1, 512));
        assert_eq!(s.index.volume_user("v1"), Some("subsystems/a/namespaces/1"));
        // One namespace at a time; a missing volume is named.
        let e = s
            .create_namespace(lim, "a", on("v1", 0), false, false)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("subsystems/a/namespaces/1 is made on volumes/v1"),
            "{e}"
        );
        let e = s
            .create_namespace(lim, "a", on("v9", 0), false, false)
            .unwrap_err();
        assert!(e.to_string().contains("volumes/v9 does not exist"), "{e}");
        // The namespace's size is the volume's.
        let e = s.resize_namespace(lim, "a", 1, 16384).unwrap_err();
        assert!(e.to_string().contains("ResizeVolume"), "{e}");

        // Not deleted under its namespace; deleted once it is gone.
        let e = s.delete_volume("v1").unwrap_err();
        assert_eq!(code(e), tonic::Code::FailedPrecondition);
        s.resize_volume(lim, "v1", 16384).unwrap();
        s.delete_namespace("a", 1).unwrap();
        assert_eq!(s.index.volume_user("v1"), None);
        assert!(s.index_drift().is_none());
        s.delete_volume("v1").unwrap();
        assert_eq!(
            code(s.delete_volume("v1").unwrap_err()),
            tonic::Code::NotFound
        );
        assert!(s.index_drift().is_none());
    }

    #[test]
    fn ram_volumes_and_namespaces_share_the_ram_limit() {
        let lim = Limits::with_ram(16384);
        let mut s = State::default();
        s.create_subsystem(lim, subsystem("a", "nqn.2024-01.io.example:a", true, 4))
            .unwrap();
        s.create_volume(lim, ram("v1", 8192), false).unwrap();
        let e = s.create_volume(lim, ram("v2", 16384), false).unwrap_err();
        assert!(e.to_string().contains("storage.ram_limit"), "{e}");
        let mut ns = on("x", 512);
        ns.backend = Backend::Ram { size_bytes: 16384 };
        let e = s.create_namespace(lim, "a", ns, false, false).unwrap_err();
        assert!(e.to_string().contains("storage.ram_limit"), "{e}");
        let e = s.resize_volume(lim, "v1", 32768).unwrap_err();
        assert!(e.to_string().contains("storage.ram_limit"), "{e}");
        s.resize_volume(lim, "v1", 16384).unwrap();
        // Null volumes hold no memory.
        let null = Volume {
            backend: Backend::Null {
                size_bytes: 1 << 40,
            },
            ..ram("n1", 0)
        };
        s.create_volume(lim, null, false).unwrap();
        assert_eq!(s.index.ram_bytes(), 16384);
    }

    #[test]
    fn a_path_backs_one_volume_or_namespace() {
        let lim = Limits::with_ram(0);
        let mut s = State::default();
        let file = |id: &str| Volume {
            backend: Backend::File {
                path: "/srv/a.img".into(),
                size_bytes: 4096,
                created: true,
            },
            ..ram(id, 0)
        };
        s.create_volume(lim, file("f1"), false).unwrap();
        let e = s.create_volume(lim, file("f2"), false).unwrap_err();
        assert!(e.to_string().contains("already backs volumes/f1"), "{e}");
        s.create_subsystem(lim, subsystem("a", "nqn.2024-01.io.example:a", true, 4))
            .unwrap();
        let mut ns = on("x", 512);
        ns.backend = file("f3").backend;
        let e = s.create_namespace(lim, "a", ns, false, false).unwrap_err();
        assert!(e.to_string().contains("already backs volumes/f1"), "{e}");
        // Volumes of other kinds are not made.
        let mut rbd = ram("r1", 0);
        rbd.backend = Backend::Volume { id: "f1".into() };
        assert_eq!(
            code(s.create_volume(lim, rbd, false).unwrap_err()),
            tonic::Code::InvalidArgument
        );
        let mut cap = lim;
        cap.volumes = 1;
        let e = s.create_volume(cap, ram("v9", 0), false).unwrap_err();
        assert!(e.to_string().contains("limits.max_volumes"), "{e}");
    }
}

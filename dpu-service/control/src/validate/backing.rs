//! A namespace's file or block device against the service's
//! [`BackingPolicy`] (`storage.file_dirs`, `storage.block_devices`) and
//! against the namespaces the state holds.
//!
//! Unlike the rest of [`crate::validate`], this looks at the filesystem:
//! whether the path leads out of its directory through a link, whether
//! the file exists (and so whether the service creates it), which file or
//! device it is. Run it off the async runtime's threads. The target
//! checks again when it opens the backend; that check is the one that
//! holds, this one answers the caller with the rule its request breaks.

use std::path::Path;

use dpu_os::backing::{BackingError, BackingPolicy, Identity};

use crate::error::{ControlError, Result};
use crate::model::{namespace_name, volume_name, Backend, Namespace, State};

/// The error for `field` (a path) that `policy` refused.
fn refusal(field: &str, e: BackingError) -> ControlError {
    match e {
        BackingError::Malformed(m) => ControlError::invalid(field, m),
        BackingError::Refused(m) => ControlError::denied(field, m),
        BackingError::Io { path, source } => ControlError::FailedPrecondition(format!(
            "{field}: cannot look at {}: {source}",
            path.display()
        )),
    }
}

/// What backs `b`, if it is a file or device that exists and the policy
/// allows.
fn identity(policy: &BackingPolicy, b: &Backend) -> Option<Identity> {
    match b {
        Backend::File { path, .. } => policy
            .inspect_file(Path::new(path))
            .ok()
            .flatten()
            .map(|f| f.identity),
        Backend::BlockDevice { path } => policy.inspect_block_device(Path::new(path)).ok(),
        Backend::Ram { .. }
        | Backend::Rbd { .. }
        | Backend::Remote(_)
        | Backend::Null { .. }
        | Backend::Volume { .. } => None,
    }
}

/// Checks the file or block device of `ns`, a namespace to create
/// (`field` names it in the request), against `policy` and against the
/// namespaces and volumes of `state`, and answers it with
/// [`Backend::File::created`](Backend::File) set: true when the file does
/// not exist yet (then a size is required to create it).
///
/// # Errors
/// `INVALID_ARGUMENT` for a malformed path, or a size the file cannot
/// take; `PERMISSION_DENIED` naming the rule for a path the policy does
/// not allow (outside `storage.file_dirs`, through a symbolic link, not a
/// device of `storage.block_devices`, a mounted device);
/// `ALREADY_EXISTS` when the file or device backs another namespace or
/// volume, under whatever path; `FAILED_PRECONDITION` when the path
/// cannot be looked at.
pub fn backing(
    field: &str,
    policy: &BackingPolicy,
    state: &State,
    mut ns: Namespace,
) -> Result<Namespace> {
    store(field, policy, state, &mut ns.backend)?;
    Ok(ns)
}

/// [`backing`] for the store of a volume or namespace, `b`.
pub fn store(field: &str, policy: &BackingPolicy, state: &State, b: &mut Backend) -> Result<()> {
    let (found, path_field, path) = match b {
        Backend::Ram { .. }
        | Backend::Rbd { .. }
        | Backend::Remote(_)
        | Backend::Null { .. }
        | Backend::Volume { .. } => return Ok(()),
        Backend::File {
            path,
            size_bytes,
            created,
        } => {
            let at = format!("{field}.file.path");
            let found = policy
                .inspect_file(Path::new(path))
                .map_err(|e| refusal(&at, e))?;
            match found {
                None if *size_bytes == 0 => {
                    return Err(ControlError::invalid(
                        format!("{field}.file.size_bytes"),
                        format!("{path} does not exist; give a size to create it"),
                    ))
                }
                Some(f) if *size_bytes != 0 && *size_bytes < f.len => {
                    return Err(ControlError::invalid(
                        format!("{field}.file.size_bytes"),
                        format!(
                            "{size_bytes} is less than the {} bytes of {path}; the service never \
                             truncates a file it did not create: give 0 (the file's size) or more",
                            f.len
                        ),
                    ))
                }
                _ => {}
            }
            *created = found.is_none();
            (found.map(|f| f.identity), at, path.clone())
        }
        Backend::BlockDevice { path } => {
            let at = format!("{field}.block_device.path");
            let found = match policy.inspect_block_device(Path::new(path)) {
                Ok(id) => Some(id),
                // The target reports a missing device when it opens it.
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(refusal(&at, e)),
            };
            (found, at, path.clone())
        }
    };
    let Some(id) = found else {
        return Ok(());
    };
    let taken = |user: String| {
        ControlError::AlreadyExists(format!(
            "{path_field}: {path} is the file or device that backs {user}"
        ))
    };
    for (sid, s) in &state.subsystems {
        for o in s.namespaces.values() {
            if identity(policy, &o.backend) == Some(id) {
                return Err(taken(namespace_name(sid, o.nsid)));
            }
        }
    }
    for v in state.volumes.values() {
        if identity(policy, &v.backend) == Some(id) {
            return Err(taken(volume_name(&v.id)));
        }
    }
    Ok(())
}

/// Checks that a resize to `size` bytes does not make a file that the
/// service did not create smaller than it is (the state knows only the
/// size it was given, 0 for the file's own).
///
/// # Errors
/// `FAILED_PRECONDITION` when it would; as [`backing`] when the file
/// cannot be looked at.
pub fn resize(policy: &BackingPolicy, b: &Backend, size: u64) -> Result<()> {
    let Backend::File {
        path,
        created: false,
        ..
    } = b
    else {
        return Ok(());
    };
    let found = policy
        .inspect_file(Path::new(path))
        .map_err(|e| refusal("name", e))?;
    match found {
        Some(f) if size < f.len => Err(ControlError::FailedPrecondition(format!(
            "size_bytes: the service did not create {path}; it never makes it smaller than its {} bytes",
            f.len
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{Subsystem, Timestamp};

    fn file(path: &Path, size_bytes: u64) -> Namespace {
        Namespace {
            namespace_id: String::new(),
            eui64: None,
            nsid: 1,
            backend: Backend::File {
                path: path.display().to_string(),
                size_bytes,
                created: false,
            },
            block_size: 512,
            uuid: [0; 16],
            nguid: [0; 16],
            qos: Default::default(),
        }
    }

    fn with(ns: Namespace) -> State {
        let mut s = State::default();
        s.subsystems.insert(
            "a".into(),
            Subsystem {
                id: "a".into(),
                nqn: "nqn.2024-01.io.example:a".into(),
                serial_number: "s".into(),
                model_number: "m".into(),
                allow_any_host: false,
                allowed_hosts: Default::default(),
                max_namespaces: 8,
                create_time: Timestamp::now(),
                namespaces: BTreeMap::from([(ns.nsid, ns)]),
                listeners: BTreeMap::new(),
                auth_requirement: Default::default(),
                host_auth: BTreeMap::new(),
                host_qos: Default::default(),
                tls_requirement: Default::default(),
                host_tls: Default::default(),
            },
        );
        s
    }

    fn field_and_code(e: ControlError) -> (String, tonic::Code) {
        let code = e.code();
        match e {
            ControlError::InvalidArgument { field, .. }
            | ControlError::PermissionDenied { field, .. } => (field, code),
            other => (other.to_string(), code),
        }
    }

    #[test]
    fn files() {
        let dir = tempfile::tempdir().unwrap();
        let policy = BackingPolicy::new(vec![dir.path().into()], vec![], None).unwrap();
        let empty = State::default();
        let new = dir.path().join("new.img");
        let ns = backing("namespace", &policy, &empty, file(&new, 4096)).unwrap();
        assert!(matches!(ns.backend, Backend::File { created: true, .. }));
        assert_eq!(
            field_and_code(backing("namespace", &policy, &empty, file(&new, 0)).unwrap_err()),
            (
                "namespace.file.size_bytes".into(),
                tonic::Code::InvalidArgument
            )
        );
        std::fs::write(&new, vec![0; 8192]).unwrap();
        let ns = backing("namespace", &policy, &empty, file(&new, 0)).unwrap();
        assert!(matches!(ns.backend, Backend::File { created: false, .. }));
        assert_eq!(
            field_and_code(backing("namespace", &policy, &empty, file(&new, 4096)).unwrap_err()),
            (
                "namespace.file.size_bytes".into(),
                tonic::Code::InvalidArgument
            )
        );
        for denied in [Path::new("/etc/shadow"), &dir.path().join("link")] {
            if denied.ends_with("link") {
                std::os::unix::fs::symlink("/etc/passwd", denied).unwrap();
            }
            assert_eq!(
                field_and_code(backing("namespace", &policy, &empty, file(denied, 0)).unwrap_err()),
                ("namespace.file.path".into(), tonic::Code::PermissionDenied),
                "{}",
                denied.display()
            );
        }
        let dotdot = dir.path().join("../x.img");
        assert_eq!(
            field_and_code(backing("namespace", &policy, &empty, file(&dotdot, 1)).unwrap_err()),
            ("namespace.file.path".into(), tonic::Code::InvalidArgument)
        );
        // The same file under another spelling is still the same file.
        let state = with(file(&new, 0));
        let again = format!("{}//new.img", dir.path().display());
        let e = backing("namespace", &policy, &state, file(Path::new(&again), 0)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
        assert!(e.to_string().contains("subsystems/a/namespaces/1"), "{e}");
        // Never made smaller than it is.
        resize(&policy, &file(&new, 0).backend, 16384).unwrap();
        let e = resize(&policy, &file(&new, 0).backend, 4096).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    }

    #[test]
    fn devices() {
        let policy = BackingPolicy::new(vec![], vec!["/dev/nvme*n1".into()], None).unwrap();
        let dev = |p: &str| Namespace {
            backend: Backend::BlockDevice { path: p.into() },
            ..file(Path::new("/"), 0)
        };
        let e = backing("namespace", &policy, &State::default(), dev("/dev/sda")).unwrap_err();
        assert_eq!(
            field_and_code(e),
            (
                "namespace.block_device.path".into(),
                tonic::Code::PermissionDenied
            )
        );
        // Allowed but missing: the target reports it when it opens it.
        backing(
            "namespace",
            &policy,
            &State::default(),
            dev("/dev/nvme99n1"),
        )
        .unwrap();
    }
}

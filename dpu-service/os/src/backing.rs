//! Where namespaces' backing files and block devices may live, and how
//! they are opened there.
//!
//! A file- or device-backed namespace is a path that a gRPC client chose,
//! opened read-write by a service that runs as root. Left alone, an
//! allowed client could export `/etc/shadow`, write into `/etc/cron.d` or
//! truncate the service's own state file. A [`BackingPolicy`] confines
//! those paths:
//!
//! - **Files** lie beneath one of the configured directories
//!   (`storage.file_dirs`). The path is resolved with `openat2` relative to
//!   the directory, with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS`: no `..` and no symbolic link, planted before
//!   or after the check, leads out of it, and checking and opening are one
//!   system call. A file must be a regular file with no other hard link
//!   (a second link could be a file outside the directories).
//! - **The state directory** is never one of them, nor lies beneath one:
//!   only its `volumes` subdirectory (the default file directory) may be
//!   configured ([`BackingPolicy::new`] refuses anything else).
//! - **Block devices** match one of the configured paths or globs
//!   (`storage.block_devices`, `*` and `?` within one path component),
//!   are block devices (a symbolic link such as `/dev/disk/by-id/...` is
//!   followed, to a block device only) and are not mounted: neither the
//!   device nor one of its partitions appears in `/proc/self/mountinfo`.
//!   The target opens them with `O_EXCL`, the kernel's exclusive claim, so
//!   a device in use (mounted, an LVM or RAID member) is refused there too
//!   and cannot be mounted while it is served.
//!
//! The control plane runs the `inspect_*` checks when it validates a
//! request, to answer with the rule a path breaks; the target opens with
//! the `open_*` calls, which check again and are what holds. Neither
//! needs `unsafe`: `openat2` comes from rustix.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Name of the default file directory inside the state directory.
pub const VOLUMES_DIR: &str = "volumes";

/// Why a backing path is not taken.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// The path itself is malformed: relative, with a `..` component, a
    /// NUL byte or too long.
    #[error("{0}")]
    Malformed(String),
    /// The policy does not allow the path (outside the file directories,
    /// through a symbolic link, not an allowed device, mounted, ...).
    #[error("{0}")]
    Refused(String),
    /// The path is allowed, but the system call on it failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

impl BackingError {
    /// True when the path, or a directory on it, does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

impl From<BackingError> for io::Error {
    fn from(e: BackingError) -> Self {
        match e {
            BackingError::Malformed(m) => io::Error::new(io::ErrorKind::InvalidInput, m),
            BackingError::Refused(m) => io::Error::new(io::ErrorKind::PermissionDenied, m),
            // Kept as it is: callers tell errors apart by their code
            // (`EINVAL` for a filesystem without `O_DIRECT`).
            BackingError::Io { source, .. } => source,
        }
    }
}

/// What names one backing store, whatever path reaches it: two namespaces
/// never share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// A regular file: its filesystem's device and its inode.
    File {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
    },
    /// A block device: its device number (`st_rdev`), shared by every
    /// device node of it.
    Device(u64),
}

impl Identity {
    /// The identity of what `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        if meta.file_type().is_block_device() {
            Self::Device(meta.rdev())
        } else {
            Self::File {
                dev: meta.dev(),
                ino: meta.ino(),
            }
        }
    }
}

/// An existing regular file the policy allows, as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FoundFile {
    /// What it is.
    pub identity: Identity,
    /// Its size in bytes.
    pub len: u64,
}

/// How the target opens a backing store: always read-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenHow {
    /// Create a missing file (mode 0600); never for a device.
    pub create: bool,
    /// Bypass the page cache (`O_DIRECT`).
    pub direct: bool,
}

/// Where file and block-device backends may live. The default allows
/// nothing: no file, no device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackingPolicy {
    file_dirs: Vec<PathBuf>,
    block_devices: Vec<String>,
}

/// Longest path accepted, in bytes (`PATH_MAX`).
const MAX_PATH: usize = 4096;

impl BackingPolicy {
    /// A policy allowing files beneath `file_dirs` and the devices that
    /// `block_devices` (paths or globs) match. `state_dir`, the service's
    /// own state, must not be one of the directories, lie beneath one, or
    /// hold one, but for its `volumes` subdirectory and what lies beneath
    /// that.
    ///
    /// # Errors
    /// `(index, why)` for the first directory (`index` into `file_dirs`)
    /// or pattern (`file_dirs.len()` plus its index into `block_devices`)
    /// that is not absolute, has a `.` or `..`
    /// component, or reaches the state directory.
    pub fn new(
        file_dirs: Vec<PathBuf>,
        block_devices: Vec<String>,
        state_dir: Option<&Path>,
    ) -> Result<Self, (usize, String)> {
        for (i, d) in file_dirs.iter().enumerate() {
            clean_absolute(d).map_err(|e| (i, e))?;
            let Some(state) = state_dir else { continue };
            // As written and with links resolved, where they exist: a
            // link to the state directory is the state directory.
            let (sa, da) = (std::path::absolute(state).unwrap_or_default(), d.clone());
            let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            for (s, d) in [(sa.clone(), da.clone()), (canon(&sa), canon(&da))] {
                let volumes = s.join(VOLUMES_DIR);
                if !d.starts_with(&volumes) && (d.starts_with(&s) || s.starts_with(&d)) {
                    return Err((
                        i,
                        format!(
                            "{} reaches the state directory {} (state.dir); only {} may hold namespaces' files there",
                            d.display(),
                            state.display(),
                            volumes.display()
                        ),
                    ));
                }
            }
        }
        for (i, g) in block_devices.iter().enumerate() {
            let at = file_dirs.len() + i;
            if g.is_empty() {
                return Err((at, "an empty pattern matches no device".into()));
            }
            clean_absolute(Path::new(g)).map_err(|e| (at, e))?;
        }
        Ok(Self {
            file_dirs,
            block_devices,
        })
    }

    /// The directories file backends may lie beneath.
    pub fn file_dirs(&self) -> &[PathBuf] {
        &self.file_dirs
    }

    /// The paths and globs block devices must match.
    pub fn block_devices(&self) -> &[String] {
        &self.block_devices
    }

    /// The allowed directory `path` lies beneath, and the rest of the
    /// path relative to it.
    fn beneath<'a>(&'a self, path: &'a Path) -> Result<(&'a Path, &'a Path), BackingError> {
        clean_absolute(path).map_err(BackingError::Malformed)?;
        self.file_dirs
            .iter()
            .find_map(|d| {
                let rest = path.strip_prefix(d).ok()?;
                (rest.components().next().is_some()).then_some((d.as_path(), rest))
            })
            .ok_or_else(|| {
                BackingError::Refused(format!(
                    "{} is not beneath a directory of storage.file_dirs ({})",
                    path.display(),
                    list(self.file_dirs.iter().map(|d| d.display().to_string()))
                ))
            })
    }

    /// Opens `path` beneath its allowed directory with `flags`, following
    /// no symbolic link, and checks it is a regular file with one link.
    fn open_beneath(
        &self,
        path: &Path,
        flags: OFlags,
        mode: Mode,
    ) -> Result<(File, std::fs::Metadata), BackingError> {
        let (dir, rest) = self.beneath(path)?;
        let io = |source: io::Error| BackingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let dirfd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(e.into()))?;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let mut walk = false;
        let fd = loop {
            let opened = if walk {
                open_walking(&dirfd, rest, flags, mode)
            } else {
                rustix::fs::openat2(&dirfd, rest, flags | OFlags::CLOEXEC, mode, resolve)
            };
            match opened {
                // No openat2 (a kernel before 5.6, an emulator): the same
                // rules one component at a time.
                Err(Errno::NOSYS) if !walk => walk = true,
                Err(Errno::INTR | Errno::AGAIN) => continue,
                Err(Errno::LOOP) => {
                    return Err(BackingError::Refused(format!(
                        "{}: a symbolic link on the path; links are not followed beneath {}",
                        path.display(),
                        dir.display()
                    )))
                }
                Err(Errno::XDEV) => {
                    return Err(BackingError::Refused(format!(
                        "{} leads out of {}",
                        path.display(),
                        dir.display()
                    )))
                }
                Err(e) => return Err(io(e.into())),
                Ok(fd) => break fd,
            }
        };
        let file = File::from(fd);
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() {
            return Err(BackingError::Refused(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        if meta.nlink() > 1 {
            return Err(BackingError::Refused(format!(
                "{} has {} hard links; a file backend must have one (another link could lie outside storage.file_dirs)",
                path.display(),
                meta.nlink()
            )));
        }
        Ok((file, meta))
    }

    /// Checks a file backend's path without opening it for I/O: `None`
    /// when the file (or a directory on its path) does not exist, which
    /// the policy allows (the target creates the file, or reports the
    /// missing directory).
    ///
    /// # Errors
    /// [`BackingError::Malformed`] or [`BackingError::Refused`] when the
    /// policy does not allow it; [`BackingError::Io`] when it cannot be
    /// looked at.
    pub fn inspect_file(&self, path: &Path) -> Result<Option<FoundFile>, BackingError> {
        match self.open_beneath(path, OFlags::PATH, Mode::empty()) {
            Ok((_, meta)) => Ok(Some(FoundFile {
                identity: Identity::of(&meta),
                len: meta.len(),
            })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens a file backend read-write, as [`BackingPolicy::inspect_file`]
    /// checks it.
    ///
    /// # Errors
    /// As [`BackingPolicy::inspect_file`], and when the file is missing
    /// without `how.create`.
    pub fn open_file(&self, path: &Path, how: OpenHow) -> Result<File, BackingError> {
        let (mut flags, mut mode) = (OFlags::RDWR | OFlags::NOCTTY, Mode::empty());
        if how.create {
            // openat2 takes a mode only with O_CREAT.
            flags |= OFlags::CREATE;
            mode = Mode::from_raw_mode(0o600);
        }
        if how.direct {
            flags |= OFlags::DIRECT;
        }
        self.open_beneath(path, flags, mode).map(|(f, _)| f)
    }

    /// The configured pattern `path` matches.
    fn device_allowed(&self, path: &Path) -> Result<(), BackingError> {
        clean_absolute(path).map_err(BackingError::Malformed)?;
        let s = path.to_str().unwrap_or("");
        if self.block_devices.iter().any(|g| glob_match(g, s)) {
            return Ok(());
        }
        Err(BackingError::Refused(if self.block_devices.is_empty() {
            format!(
                "{} is not allowed: storage.block_devices allows no device",
                path.display()
            )
        } else {
            format!(
                "{} matches no entry of storage.block_devices ({})",
                path.display(),
                list(self.block_devices.iter().cloned())
            )
        }))
    }

    /// Checks that `meta` is a block device's and that `mountinfo`
    /// mounts neither it nor a partition of it.
    fn device_free(
        path: &Path,
        meta: &std::fs::Metadata,
        mountinfo: &str,
    ) -> Result<Identity, BackingError> {
        if !meta.file_type().is_block_device() {
            return Err(BackingError::Refused(format!(
                "{} is not a block device",
                path.display()
            )));
        }
        let rdev = meta.rdev();
        let mut devs = vec![(rustix::fs::major(rdev), rustix::fs::minor(rdev))];
        devs.extend(partitions(devs[0]));
        let names = [
            path.to_path_buf(),
            std::fs::canonicalize(path).unwrap_or_default(),
        ];
        if let Some(at) = mounted(mountinfo, &devs, &names) {
            return Err(BackingError::Refused(format!(
                "{} is mounted (on {at}); a mounted device is never served",
                path.display()
            )));
        }
        Ok(Identity::Device(rdev))
    }

    /// Checks a block-device backend's path: it matches
    /// `storage.block_devices`, is a block device, and is not mounted.
    ///
    /// # Errors
    /// [`BackingError::Malformed`] or [`BackingError::Refused`] when the
    /// policy does not allow it; [`BackingError::Io`] when it cannot be
    /// looked at.
    pub fn inspect_block_device(&self, path: &Path) -> Result<Identity, BackingError> {
        self.device_allowed(path)?;
        let io = |source| BackingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(io)?;
        Self::device_free(path, &meta, &mountinfo)
    }

    /// Opens a block-device backend read-write and exclusively
    /// (`O_EXCL`: refused while the kernel has the device in use), as
    /// [`BackingPolicy::inspect_block_device`] checks it.
    ///
    /// # Errors
    /// As [`BackingPolicy::inspect_block_device`]; a device in use is
    /// [`BackingError::Refused`].
    pub fn open_block_device(&self, path: &Path, direct: bool) -> Result<File, BackingError> {
        self.device_allowed(path)?;
        let io = |source| BackingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut flags = OFlags::RDWR | OFlags::EXCL | OFlags::NOCTTY | OFlags::CLOEXEC;
        if direct {
            flags |= OFlags::DIRECT;
        }
        let fd = match rustix::fs::open(path, flags, Mode::empty()) {
            Err(Errno::BUSY) => {
                return Err(BackingError::Refused(format!(
                    "{} is in use (mounted, or claimed by another driver)",
                    path.display()
                )))
            }
            r => r.map_err(|e| io(e.into()))?,
        };
        let file = File::from(fd);
        let meta = file.metadata().map_err(io)?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(io)?;
        Self::device_free(path, &meta, &mountinfo)?;
        Ok(file)
    }
}

/// Opens `rest` (relative, only normal components) beneath `dir` one
/// component at a time without following a symbolic link anywhere, as
/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` does: every
/// directory on the way is opened with `O_NOFOLLOW`, so a link there (or
/// one swapped in meanwhile) fails the open; a link is reported as
/// `ELOOP`, a component that is not a plain name as `EXDEV`.
fn open_walking(
    dir: &rustix::fd::OwnedFd,
    rest: &Path,
    flags: OFlags,
    mode: Mode,
) -> Result<rustix::fd::OwnedFd, Errno> {
    use rustix::fd::AsFd;
    let names: Vec<_> = rest.components().collect();
    let mut at: Option<rustix::fd::OwnedFd> = None;
    for (i, c) in names.iter().enumerate() {
        let Component::Normal(name) = c else {
            return Err(Errno::XDEV);
        };
        let here = at.as_ref().map_or(dir.as_fd(), |f| f.as_fd());
        let link =
            rustix::fs::statat(here, *name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).map(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
            });
        match link {
            Ok(true) => return Err(Errno::LOOP),
            Ok(false) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
        if i + 1 == names.len() {
            return rustix::fs::openat(
                here,
                *name,
                flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            );
        }
        let next = rustix::fs::openat(
            here,
            *name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        at = Some(next);
    }
    Err(Errno::NOENT)
}

/// Checks that `p` is absolute, at most `PATH_MAX` bytes, without NUL,
/// and has no `.` or `..` component.
fn clean_absolute(p: &Path) -> Result<(), String> {
    let s = p.as_os_str().as_encoded_bytes();
    if !p.is_absolute() || s.contains(&0) || s.len() > MAX_PATH {
        return Err(format!("{:?} is not an absolute path", p.display()));
    }
    // `components` drops interior `.`; look at the bytes for those.
    let dot = s.split(|b| *b == b'/').any(|c| c == b"." || c == b"..");
    if dot || p.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{} has a '.' or '..' component; give the path without them",
            p.display()
        ));
    }
    Ok(())
}

/// `items` joined for a message, or "none".
fn list(items: impl Iterator<Item = String>) -> String {
    let v: Vec<String> = items.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// True when `s` matches `pattern`: `*` stands for any run of characters
/// and `?` for one, neither crossing a `/`; everything else matches
/// itself.
pub fn glob_match(pattern: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    // Backtracking over the last `*` only: linear enough for paths.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, si));
                pi += 1;
            }
            Some('?') if s[si] != '/' => {
                pi += 1;
                si += 1;
            }
            Some(c) if *c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                // The star takes one more character, never a '/'.
                Some((sp, ss)) if s[ss] != '/' => {
                    star = Some((sp, ss + 1));
                    pi = sp + 1;
                    si = ss + 1;
                }
                _ => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The `major:minor` numbers of the partitions of block device `dev`,
/// from sysfs (none where sysfs is missing).
fn partitions((major, minor): (u32, u32)) -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir(format!("/sys/dev/block/{major}:{minor}")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("partition"))
                .ok()
                .map(|_| e)
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("dev")).ok())
        .filter_map(|d| parse_dev(d.trim()))
        .collect()
}

/// Parses `major:minor`.
fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Where `mountinfo` (the text of `/proc/self/mountinfo`) mounts one of
/// the devices `devs` (`major:minor`), or a filesystem whose source is one
/// of `names`; `None` when it mounts none of them.
pub fn mounted(mountinfo: &str, devs: &[(u32, u32)], names: &[PathBuf]) -> Option<String> {
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(dev), Some(point)) = (fields.get(2), fields.get(4)) else {
            continue;
        };
        let source = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|i| fields.get(i + 2));
        let by_dev = parse_dev(dev).is_some_and(|d| devs.contains(&d));
        let by_name = source.is_some_and(|s| {
            names
                .iter()
                .any(|n| !n.as_os_str().is_empty() && unescape(s) == n.to_string_lossy())
        });
        if by_dev || by_name {
            return Some(unescape(point));
        }
    }
    None
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match oct {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(dir: &Path) -> BackingPolicy {
        BackingPolicy::new(vec![dir.to_path_buf()], vec!["/dev/nvme*n1".into()], None).unwrap()
    }

    fn refused(r: Result<impl std::fmt::Debug, BackingError>) -> String {
        match r {
            Err(BackingError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn files_beneath_an_allowed_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        let f = dir.path().join("a.img");
        assert_eq!(p.inspect_file(&f).unwrap(), None, "missing: may be created");
        let file = p
            .open_file(
                &f,
                OpenHow {
                    create: true,
                    direct: false,
                },
            )
            .unwrap();
        file.set_len(4096).unwrap();
        let found = p.inspect_file(&f).unwrap().unwrap();
        assert_eq!(found.len, 4096);
        assert_eq!(found.identity, Identity::of(&file.metadata().unwrap()));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(file.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        // A missing directory on the way is for the opener to report.
        assert_eq!(p.inspect_file(&dir.path().join("no/x.img")).unwrap(), None);
        assert!(p
            .open_file(&dir.path().join("no/x.img"), OpenHow::default())
            .unwrap_err()
            .is_not_found());
        // Not a regular file.
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        refused(p.inspect_file(&dir.path().join("sub")));
    }

    #[test]
    fn absolute_paths_outside_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        for outside in ["/etc/shadow", "/etc/cron.d/x"] {
            let m = refused(p.inspect_file(Path::new(outside)));
            assert!(m.contains("storage.file_dirs"), "{m}");
        }
        // The directory itself is not a file beneath it.
        refused(p.inspect_file(dir.path()));
        // A sibling whose name starts like the directory's.
        let sibling = format!("{}x/a.img", dir.path().display());
        refused(p.inspect_file(Path::new(&sibling)));
        assert!(matches!(
            p.inspect_file(Path::new("rel/a.img")),
            Err(BackingError::Malformed(_))
        ));
    }

    #[test]
    fn dot_dot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        for bad in ["../../etc/shadow", "./a.img", "sub/../a.img"] {
            let path = dir.path().join(bad);
            assert!(
                matches!(p.inspect_file(&path), Err(BackingError::Malformed(_))),
                "{bad}"
            );
            assert!(p.open_file(&path, OpenHow::default()).is_err());
        }
    }

    /// The walk used where `openat2` is missing keeps the same rules.
    #[test]
    fn the_component_walk_follows_no_link_and_leaves_no_directory() {
        let dir = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let open = |rest: &str, flags| {
            open_walking(&fd, Path::new(rest), flags, Mode::from_raw_mode(0o600))
        };
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/real.img"), b"x").unwrap();
        assert!(open("sub/real.img", OFlags::RDWR).is_ok());
        assert!(open("sub/new.img", OFlags::RDWR | OFlags::CREATE).is_ok());
        assert!(dir.path().join("sub/new.img").exists());
        assert_eq!(
            open("nosuch/x.img", OFlags::RDWR).unwrap_err(),
            Errno::NOENT
        );
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("sub/link.img")).unwrap();
        assert_eq!(open("sub/link.img", OFlags::RDWR).unwrap_err(), Errno::LOOP);
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        assert_eq!(open("etc/shadow", OFlags::RDONLY).unwrap_err(), Errno::LOOP);
        assert_eq!(
            open("sub/../etc/passwd", OFlags::RDONLY).unwrap_err(),
            Errno::XDEV
        );
        // A dangling link is not created through either.
        std::os::unix::fs::symlink("/tmp/made-by-a-link", dir.path().join("dangling")).unwrap();
        assert_eq!(
            open("dangling", OFlags::RDWR | OFlags::CREATE).unwrap_err(),
            Errno::LOOP
        );
        assert!(!Path::new("/tmp/made-by-a-link").exists());
    }

    #[test]
    fn symlinks_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy(dir.path());
        let link = dir.path().join("passwd.img");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        let m = refused(p.inspect_file(&link));
        assert!(m.contains("symbolic link"), "{m}");
        refused(p.open_file(&link, OpenHow::default()));
        // Nor a link inside, nor a linked directory on the way.
        std::fs::write(dir.path().join("real.img"), b"x").unwrap();
        std::os::unix::fs::symlink("real.img", dir.path().join("alias.img")).unwrap();
        refused(p.inspect_file(&dir.path().join("alias.img")));
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        refused(p.inspect_file(&dir.path().join("etc/shadow")));
        refused(p.open_file(
            &dir.path().join("etc/cron.d/x"),
            OpenHow {
                create: true,
                direct: false,
            },
        ));
        assert!(!Path::new("/etc/cron.d/x").exists());
        // A hard link is another way out.
        std::fs::hard_link(dir.path().join("real.img"), dir.path().join("twin.img")).unwrap();
        let m = refused(p.inspect_file(&dir.path().join("real.img")));
        assert!(m.contains("hard links"), "{m}");
    }

    #[test]
    fn the_state_directory_is_never_a_file_directory() {
        let state = Path::new("/var/lib/dpu-service");
        let new = |d: &str| BackingPolicy::new(vec![d.into()], vec![], Some(state));
        new("/var/lib/dpu-service/volumes").unwrap();
        new("/var/lib/dpu-service/volumes/fast").unwrap();
        new("/srv/volumes").unwrap();
        new("/var/lib/dpu-service-other").unwrap();
        for bad in [
            "/var/lib/dpu-service",
            "/var/lib/dpu-service/",
            "/var/lib/dpu-service/state",
            "/var/lib",
            "/",
        ] {
            let (i, why) = new(bad).unwrap_err();
            assert_eq!(i, 0);
            assert!(why.contains("state directory"), "{bad}: {why}");
        }
        for bad in ["relative", "/srv/../var/lib/dpu-service", "/srv/./x"] {
            assert!(new(bad).is_err(), "{bad}");
        }
        let (i, _) =
            BackingPolicy::new(vec!["/srv".into()], vec!["dev/sda".into()], None).unwrap_err();
        assert_eq!(i, 1, "devices are numbered after the directories");
    }

    #[test]
    fn device_globs() {
        assert!(glob_match("/dev/nvme*n1", "/dev/nvme0n1"));
        assert!(glob_match("/dev/nvme*n1", "/dev/nvme12n1"));
        assert!(!glob_match("/dev/nvme*n1", "/dev/nvme0n1p1"));
        assert!(!glob_match("/dev/nvme*n1", "/dev/nvme0n2"));
        assert!(glob_match("/dev/sd?", "/dev/sdb"));
        assert!(!glob_match("/dev/sd?", "/dev/sdb1"));
        assert!(glob_match("/dev/loop7", "/dev/loop7"));
        assert!(!glob_match("/dev/loop7", "/dev/loop70"));
        // Neither crosses a '/'.
        assert!(!glob_match("/dev/*", "/dev/disk/by-id/x"));
        assert!(!glob_match("/dev/sd?x", "/dev/sd/x"));
        assert!(glob_match(
            "/dev/disk/by-id/nvme-*",
            "/dev/disk/by-id/nvme-A_1"
        ));

        let p = policy(Path::new("/srv"));
        let m = refused(p.inspect_block_device(Path::new("/dev/sda")));
        assert!(m.contains("storage.block_devices"), "{m}");
        assert!(matches!(
            p.inspect_block_device(Path::new("/dev/../etc/nvme0n1")),
            Err(BackingError::Malformed(_))
        ));
        let none = BackingPolicy::default();
        let m = refused(none.inspect_block_device(Path::new("/dev/nvme0n1")));
        assert!(m.contains("allows no device"), "{m}");
    }

    #[test]
    fn a_regular_file_is_not_a_block_device() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("fake");
        std::fs::write(&f, b"").unwrap();
        let p =
            BackingPolicy::new(vec![], vec![format!("{}/*", dir.path().display())], None).unwrap();
        let m = refused(p.inspect_block_device(&f));
        assert!(m.contains("not a block device"), "{m}");
        refused(p.open_block_device(&f, false));
    }

    const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
24 22 8:17 / /mnt/data\\040disk rw,relatime shared:30 - xfs /dev/sdb1 rw
25 22 0:45 / /srv/pool rw shared:40 - btrfs /dev/mapper/pool rw
26 22 0:46 /x /home rw - zfs tank/home rw
";

    #[test]
    fn mounted_devices_are_found_in_mountinfo() {
        let none: &[PathBuf] = &[];
        assert_eq!(
            mounted(MOUNTINFO, &[(8, 17)], none).as_deref(),
            Some("/mnt/data disk")
        );
        assert_eq!(
            mounted(MOUNTINFO, &[(259, 0), (259, 1), (259, 2)], none).as_deref(),
            Some("/"),
            "a partition of the device is mounted"
        );
        assert_eq!(mounted(MOUNTINFO, &[(259, 0), (259, 1)], none), None);
        assert_eq!(mounted(MOUNTINFO, &[(8, 16)], none), None);
        // btrfs shows an anonymous device number: the source names it.
        assert_eq!(
            mounted(MOUNTINFO, &[(253, 0)], &["/dev/mapper/pool".into()]).as_deref(),
            Some("/srv/pool")
        );
        assert_eq!(
            mounted(
                MOUNTINFO,
                &[(253, 0)],
                &["/dev/mapper/other".into(), PathBuf::new()]
            ),
            None
        );
        assert_eq!(mounted("garbage\n\n1 2\n", &[(8, 17)], none), None);
    }
}

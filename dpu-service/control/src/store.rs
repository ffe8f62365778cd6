//! The persisted state store.
//!
//! Every accepted change runs on a copy of the state, is written to disk
//! (temporary file, fsync, rename, fsync of the directory) and only then
//! becomes the current state and is published to subscribers (the data
//! plane and the NVMe-oF target). A crash at any point leaves either the
//! old or the new state on disk, never a mix, and a change is acknowledged
//! to the client only after it is durable.
//!
//! Each published state carries a generation, counted from the state
//! loaded at start (generation 0). Subscribers may skip states (they see
//! the newest one) but every state contains the changes of all earlier
//! generations, so a consumer that has applied generation `g` has applied
//! every change published up to `g`; [`crate::apply`] builds on that.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{ControlError, Result};
use crate::model::State;

/// Name of the state file inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// Version of the state file format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Why the state could not be loaded at start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The state directory or file could not be read or created.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The state file is not valid; it is left untouched for inspection.
    #[error("{path}: not a valid state file: {reason}")]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Serialize)]
struct FileOut<'a> {
    format: u32,
    state: &'a State,
}

/// A state as the store published it.
#[derive(Debug, Clone)]
pub struct Published {
    /// Its place in the sequence of published states: the state loaded at
    /// start is 0, each accepted change adds one.
    pub generation: u64,
    /// The state.
    pub state: Arc<State>,
}

/// A change the store accepted: the states before and after it, and the
/// generation the new state was published as.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The generation of `after`.
    pub generation: u64,
    /// The state the change was made on.
    pub before: Arc<State>,
    /// The state the change made.
    pub after: Arc<State>,
}

#[derive(Deserialize)]
struct FileIn {
    format: u32,
    state: State,
}

/// The state store: the current state, where it is persisted, and its subscribers.
#[derive(Debug)]
struct Store {
    file: Option<PathBuf>,
    tx: watch::Sender<Published>,
}

impl Store {
    fn persist(&self, state: &State) -> std::io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(&FileOut {
            format: FORMAT_VERSION,
            state,
        })?;
        replace_file(file, |f| f.write_all(&bytes))
    }
}

/// Replaces `file` with what `write` writes: into a temporary file beside
/// it, synced, then renamed over `file`, then the directory synced. When
/// writing, syncing or renaming fails (`ENOSPC`, `EIO`), the temporary
/// file is removed, so a full disk is not left fuller, and `file` is as
/// it was.
fn replace_file(
    file: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = file.with_extension("json.tmp");
    let mut f = fs::File::create(&tmp)?;
    let written = write(&mut f).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, file)) {
        if let Err(rm) = fs::remove_file(&tmp) {
            tracing::warn!(path = %tmp.display(), error = %rm, "removing the temporary state file failed");
        }
        return Err(e);
    }
    if let Some(dir) = file.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A cloneable handle to the state store.
///
/// Reads ([`StateHandle::snapshot`]) never wait for a writer; writes
/// ([`StateHandle::mutate`]) are serialized and run off the async executor.
#[derive(Debug, Clone)]
pub struct StateHandle {
    store: Arc<Mutex<Store>>,
    rx: watch::Receiver<Published>,
}

impl StateHandle {
    /// Opens the store in `dir` (created if missing), loading its state
    /// file if there is one. `None` keeps the state in memory only.
    ///
    /// # Errors
    /// [`LoadError`] if the directory cannot be created or the state file
    /// cannot be read or parsed. A corrupt file is never overwritten.
    pub fn open(dir: Option<&Path>) -> std::result::Result<Self, LoadError> {
        let (file, state) = match dir {
            None => (None, State::default()),
            Some(dir) => {
                fs::create_dir_all(dir).map_err(|source| LoadError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
                let file = dir.join(STATE_FILE);
                (Some(file.clone()), load(&file)?)
            }
        };
        let (tx, rx) = watch::channel(Published {
            generation: 0,
            state: Arc::new(state),
        });
        Ok(Self {
            store: Arc::new(Mutex::new(Store { file, tx })),
            rx,
        })
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<State> {
        self.rx.borrow().state.clone()
    }

    /// The current state and its generation.
    pub fn published(&self) -> Published {
        self.rx.borrow().clone()
    }

    /// A receiver that sees every new state after it is persisted (the
    /// newest one, when several were published since it last looked).
    pub fn subscribe(&self) -> watch::Receiver<Published> {
        self.rx.clone()
    }

    /// Applies `change` to a copy of the state, persists the result and
    /// publishes it. If `change` fails, or persisting fails, nothing changes.
    ///
    /// # Errors
    /// The error of `change`, or [`ControlError::Storage`] if the new state
    /// could not be written.
    pub fn mutate_blocking<T>(&self, change: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        self.commit(change).map(|(out, _)| out)
    }

    /// [`StateHandle::mutate_blocking`] that also answers what it committed.
    fn commit<T>(&self, change: impl FnOnce(&mut State) -> Result<T>) -> Result<(T, Committed)> {
        let store = self
            .store
            .lock()
            .map_err(|_| ControlError::Storage("store lock poisoned by an earlier panic".into()))?;
        let (before, generation) = {
            let cur = store.tx.borrow();
            (cur.state.clone(), cur.generation + 1)
        };
        let mut next = State::clone(&before);
        let out = change(&mut next)?;
        store.persist(&next).map_err(|e| {
            tracing::error!(error = %e, "persisting state failed; change refused");
            ControlError::Storage(e.to_string())
        })?;
        let after = Arc::new(next);
        store.tx.send_replace(Published {
            generation,
            state: after.clone(),
        });
        Ok((
            out,
            Committed {
                generation,
                before,
                after,
            },
        ))
    }

    /// [`StateHandle::mutate_blocking`] on a blocking thread, for async callers.
    ///
    /// # Errors
    /// As [`StateHandle::mutate_blocking`].
    pub async fn mutate<T, F>(&self, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut State) -> Result<T> + Send + 'static,
    {
        self.mutate_committed(change).await.map(|(out, _)| out)
    }

    /// [`StateHandle::mutate`] that also answers what it committed: the
    /// generation, to wait for a consumer to apply it
    /// ([`crate::apply::Applied::wait`]), and the states before and after,
    /// to undo the change should the consumer fail to
    /// ([`crate::model::State::revert`]).
    ///
    /// # Errors
    /// As [`StateHandle::mutate_blocking`].
    pub async fn mutate_committed<T, F>(&self, change: F) -> Result<(T, Committed)>
    where
        T: Send + 'static,
        F: FnOnce(&mut State) -> Result<T> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.commit(change))
            .await
            .map_err(|e| ControlError::Storage(format!("state update task failed: {e}")))?
    }
}

fn load(file: &Path) -> std::result::Result<State, LoadError> {
    let bytes = match fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(source) => {
            return Err(LoadError::Io {
                path: file.to_path_buf(),
                source,
            })
        }
    };
    let corrupt = |reason: String| LoadError::Corrupt {
        path: file.to_path_buf(),
        reason,
    };
    let parsed: FileIn = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if parsed.format != FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {} (this build reads {FORMAT_VERSION})",
            parsed.format
        )));
    }
    Ok(parsed.state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, RuleSet, Tenant, Timestamp};
    use crate::state::Limits;

    fn add_tenant(h: &StateHandle, id: &str) -> Result<()> {
        let t = Tenant {
            id: id.into(),
            display_name: format!("tenant {id}"),
            attachments: vec![],
            default_policy: Action::Deny,
            create_time: Timestamp::now(),
            rules: RuleSet::default(),
        };
        h.mutate_blocking(|s| s.create_tenant(Limits::with_ram(0), &Default::default(), t))
    }

    #[test]
    fn round_trip_through_disk() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        add_tenant(&h, "b").unwrap();
        let before = h.snapshot();
        drop(h);
        let h2 = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*h2.snapshot(), *before);
        assert!(!dir.path().join("state.json.tmp").exists());
    }

    #[test]
    fn refused_change_is_not_applied_or_written() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        let on_disk = fs::read(dir.path().join(STATE_FILE)).unwrap();
        assert!(matches!(
            add_tenant(&h, "a"),
            Err(ControlError::AlreadyExists(_))
        ));
        assert_eq!(fs::read(dir.path().join(STATE_FILE)).unwrap(), on_disk);
        assert_eq!(h.snapshot().tenants.len(), 1);
    }

    #[test]
    fn subscribers_see_published_states() {
        let h = StateHandle::open(None).unwrap();
        let mut rx = h.subscribe();
        assert_eq!(rx.borrow().generation, 0);
        add_tenant(&h, "a").unwrap();
        assert!(rx.has_changed().unwrap());
        let p = rx.borrow_and_update().clone();
        assert!(p.state.tenants.contains_key("a"));
        assert_eq!(p.generation, 1);
        // A refused change publishes nothing and uses no generation.
        assert!(add_tenant(&h, "a").is_err());
        assert!(!rx.has_changed().unwrap());
        add_tenant(&h, "b").unwrap();
        assert_eq!(h.published().generation, 2);
        assert!(Arc::ptr_eq(&h.published().state, &h.snapshot()));
    }

    #[test]
    fn failed_persist_refuses_the_change() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        // A directory where the temp file should go makes the write fail.
        fs::create_dir(dir.path().join("state.json.tmp")).unwrap();
        assert!(matches!(add_tenant(&h, "b"), Err(ControlError::Storage(_))));
        assert!(!h.snapshot().tenants.contains_key("b"));
        fs::remove_dir(dir.path().join("state.json.tmp")).unwrap();
        add_tenant(&h, "b").unwrap();
    }

    #[test]
    fn corrupt_or_foreign_files_are_refused_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(STATE_FILE);
        fs::write(&file, b"{not json").unwrap();
        assert!(matches!(
            StateHandle::open(Some(dir.path())),
            Err(LoadError::Corrupt { .. })
        ));
        assert_eq!(fs::read(&file).unwrap(), b"{not json");
        fs::write(
            &file,
            br#"{"format": 99, "state": {"tenants": {}, "subsystems": {}, "id_seq": 0}}"#,
        )
        .unwrap();
        let err = StateHandle::open(Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains("format version 99"), "{err}");
    }

    /// A write that fails part-way (as on a full disk) leaves neither a
    /// temporary file nor a changed state file behind.
    #[test]
    fn failed_write_removes_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(STATE_FILE);
        fs::write(&file, b"old").unwrap();
        let e = replace_file(&file, |f| {
            f.write_all(b"half of the new st")?;
            Err(std::io::Error::from_raw_os_error(28))
        })
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28), "{e}");
        assert!(!dir.path().join("state.json.tmp").exists());
        assert_eq!(fs::read(&file).unwrap(), b"old");
        replace_file(&file, |f| f.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"new");
        assert!(!dir.path().join("state.json.tmp").exists());
    }

    /// The same on a real full file system: a 64 KiB tmpfs, which needs
    /// root to mount (the test says so and passes vacuously without it;
    /// the injected failure above runs everywhere).
    #[test]
    fn enospc_on_a_full_tmpfs_removes_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("cannot mount a tmpfs (not root?); skipped");
            return;
        }
        let unmount = |p: &Path| {
            let _ = std::process::Command::new("umount").arg(p).status();
        };
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        let on_disk = fs::read(dir.path().join(STATE_FILE)).unwrap();
        // A display name fills nothing; many tenants fill 64 KiB.
        let mut refused = None;
        for i in 0..10_000 {
            if let Err(e) = add_tenant(&h, &format!("t{i}")) {
                refused = Some(e);
                break;
            }
        }
        let listing: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let on_disk_now = fs::read(dir.path().join(STATE_FILE)).unwrap();
        unmount(dir.path());
        assert!(
            matches!(refused, Some(ControlError::Storage(ref m)) if m.contains("No space")),
            "{refused:?}"
        );
        assert_eq!(listing, [std::ffi::OsString::from(STATE_FILE)]);
        assert!(on_disk_now.len() >= on_disk.len());
        let stored: FileIn = serde_json::from_slice(&on_disk_now).unwrap();
        assert_eq!(
            stored.state,
            *h.snapshot(),
            "the file holds the last accepted state"
        );
    }
}

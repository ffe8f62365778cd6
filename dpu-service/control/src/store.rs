//! The persisted state store.
//!
//! Every accepted change runs on a copy of the state, is made durable and
//! only then becomes the current state and is published to subscribers
//! (the data plane and the NVMe-oF target). A change is acknowledged to the
//! client only after it is durable, and a crash at any point leaves the
//! state of the last durable change on disk, never a mix.
//!
//! # On disk
//!
//! The state directory holds two files, both created with mode 0600:
//!
//! - `state.json`, the snapshot: `{"format": 2, "seq": S, "state": {...}}`,
//!   the whole state after change number `S`. It is only ever replaced
//!   whole: written to `state.json.tmp`, fsynced, renamed over
//!   `state.json`, and the directory fsynced. The temporary file is
//!   removed when any of that fails.
//! - `state.journal`, the changes since: records of a 12-byte header
//!   (payload length, CRC-32C of the payload, CRC-32C of those 8 bytes,
//!   all little-endian) and a JSON payload `{"seq": N, "ops": [...]}`
//!   saying what change `N` did: a tenant's rules as a splice (rules kept
//!   at the front and the back, rules put between), a tenant's other
//!   fields, a subsystem whole, a deletion, the ID counter. A change
//!   appends one record and fsyncs it, so its cost on disk grows with the
//!   change, not with the state: one rule added among 160,000 writes one
//!   rule.
//!
//! When the journal would grow past the larger of [`JOURNAL_MIN_BYTES`]
//! and the snapshot's size, the change is written as a new snapshot
//! instead (with its `seq`) and the journal is emptied: the journal stays
//! bounded, and the snapshots cost on average at most as much per change
//! as the records they replace. A crash between the snapshot and the
//! emptying leaves records the snapshot already holds; loading skips
//! records whose `seq` is not above the snapshot's.
//!
//! Loading reads the snapshot and replays the records after it, which must
//! follow it with no gap. Only the last record can be torn by a crash (a
//! record is appended only after the previous one is whole on disk): a
//! header or payload cut short, a last record whose checksum fails, or
//! zeros where a header should be are ignored with a warning, and the
//! next change overwrites them. A record damaged anywhere else, a gap in
//! the sequence or a record that does not fit the state stops the load
//! with the offset and the reason; nothing is overwritten.
//!
//! A `state.json` of format 1 (the whole state, rewritten on every change,
//! as earlier versions wrote it) loads as is; the first change writes it
//! again as format 2. Earlier versions refuse format 2 instead of
//! ignoring the journal.
//!
//! Each published state carries a generation, counted from the state
//! loaded at start (generation 0). Subscribers may skip states (they see
//! the newest one) but every state contains the changes of all earlier
//! generations, so a consumer that has applied generation `g` has applied
//! every change published up to `g`; [`crate::apply`] builds on that.

mod change;
mod journal;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{ControlError, Result};
use crate::model::State;

/// Name of the snapshot file inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// Name of the journal file inside the state directory.
pub const JOURNAL_FILE: &str = "state.journal";
/// Version of the snapshot format this build writes; it also reads 1.
pub const FORMAT_VERSION: u32 = 2;
/// The journal may grow to this size, or to the snapshot's if that is
/// larger, before a change is written as a snapshot instead.
pub const JOURNAL_MIN_BYTES: u64 = 4 << 20;

const TMP_FILE: &str = "state.json.tmp";

/// How the store makes a change durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// Append the change to the journal, and fold the journal into a new
    /// snapshot when it has grown (see the module documentation).
    #[default]
    Journal,
    /// Write the whole state as a new snapshot on every change, as format 1
    /// did: a cost that grows with the state. Kept to measure the journal
    /// against.
    Rewrite,
}

/// Why the state could not be loaded at start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The state directory or a state file could not be read or created.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A state file is not valid; it is left untouched for inspection.
    #[error("{path}: not a valid state file: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Serialize)]
struct FileOut<'a> {
    format: u32,
    seq: u64,
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
    #[serde(default)]
    seq: u64,
    state: State,
}

/// The state store: the current state, where it is persisted, and its subscribers.
#[derive(Debug)]
struct Store {
    disk: Option<Disk>,
    tx: watch::Sender<Published>,
}

/// The files of a state directory, and what the store knows of them.
#[derive(Debug)]
struct Disk {
    dir: PathBuf,
    mode: Persistence,
    /// The journal may grow to this size or the snapshot's, whichever is larger.
    journal_min: u64,
    /// Number of the last durable change.
    seq: u64,
    /// Size of `state.json`.
    snapshot_len: u64,
    /// Format of `state.json`; 0 when there is none. Anything but
    /// [`FORMAT_VERSION`] makes the next change write a snapshot.
    snapshot_format: u32,
    /// The journal, opened at the first write.
    journal: Option<fs::File>,
    /// Where the journal's last whole record ends.
    journal_len: u64,
    /// The journal file may hold bytes past `journal_len` (a torn tail, a
    /// failed append): cut them before appending.
    journal_dirty: bool,
    /// Why no change can be made durable any more, after a failure that
    /// left the files in a state the store cannot account for.
    broken: Option<String>,
    /// Test hook: the next append writes this many bytes and fails.
    #[cfg(test)]
    fail_append_after: Option<usize>,
}

impl Disk {
    /// Makes the change from `before` to `after` durable as change `seq + 1`.
    fn persist(&mut self, before: &State, after: &State) -> std::io::Result<()> {
        if let Some(why) = &self.broken {
            return Err(std::io::Error::other(why.clone()));
        }
        let ops = change::diff(before, after);
        if ops.is_empty() {
            // Nothing differs: the state on disk is already this one.
            return Ok(());
        }
        let seq = self.seq + 1;
        let record = match self.mode {
            Persistence::Journal if self.snapshot_format == FORMAT_VERSION => {
                journal::encode(&journal::Entry { seq, ops }).ok()
            }
            _ => None,
        };
        let limit = self.journal_min.max(self.snapshot_len);
        match record {
            Some(rec) if self.journal_len + rec.len() as u64 <= limit => self.append(&rec)?,
            _ => self.write_snapshot(after, seq)?,
        }
        self.seq = seq;
        Ok(())
    }

    /// The journal file, opened (and created, durably) at the first call.
    fn journal(&mut self) -> std::io::Result<&fs::File> {
        if self.journal.is_none() {
            let path = self.dir.join(JOURNAL_FILE);
            let existed = path.exists();
            let f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)?;
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
            if !existed {
                if let Err(e) = sync_dir(&self.dir) {
                    // Created but maybe not durably: the next call starts over.
                    let _ = fs::remove_file(&path);
                    return Err(e);
                }
            }
            self.journal = Some(f);
        }
        Ok(self.journal.as_ref().expect("opened above"))
    }

    /// Appends one record and fsyncs it. On failure the journal is cut
    /// back to its last whole record, so a refused change never comes
    /// back at the next start; if even that fails, the store refuses every
    /// later change.
    fn append(&mut self, rec: &[u8]) -> std::io::Result<()> {
        let at = self.journal_len;
        let dirty = self.journal_dirty;
        #[cfg(test)]
        let fail = self.fail_append_after.take();
        let f = self.journal()?;
        let res = (|| {
            if dirty {
                f.set_len(at)?;
            }
            #[cfg(test)]
            if let Some(n) = fail {
                f.write_all_at(&rec[..n.min(rec.len())], at)?;
                return Err(std::io::Error::from_raw_os_error(28));
            }
            f.write_all_at(rec, at)?;
            f.sync_data()
        })();
        match res {
            Ok(()) => {
                self.journal_dirty = false;
                self.journal_len = at + rec.len() as u64;
                Ok(())
            }
            Err(e) => {
                match f.set_len(at).and_then(|()| f.sync_data()) {
                    Ok(()) => self.journal_dirty = false,
                    Err(e2) => {
                        self.journal_dirty = true;
                        self.broken = Some(format!(
                            "{}: a failed append ({e}) could not be undone ({e2}); restart the service",
                            self.dir.join(JOURNAL_FILE).display()
                        ));
                    }
                }
                Err(e)
            }
        }
    }

    /// Writes `state` as the snapshot of change `seq` and empties the journal.
    fn write_snapshot(&mut self, state: &State, seq: u64) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&FileOut {
            format: FORMAT_VERSION,
            seq,
            state,
        })?;
        // Opened first, so that no failure can come between the snapshot
        // and emptying the journal but the emptying itself.
        self.journal()?;
        replace_file(&self.dir.join(STATE_FILE), |f| f.write_all(&bytes))?;
        if let Err(e) = sync_dir(&self.dir) {
            // The new snapshot may or may not survive a crash; which one
            // the disk holds is unknown, so nothing more is written.
            self.broken = Some(format!(
                "{}: syncing after a new snapshot failed ({e}); restart the service",
                self.dir.display()
            ));
            return Err(e);
        }
        self.snapshot_len = bytes.len() as u64;
        self.snapshot_format = FORMAT_VERSION;
        // The snapshot holds every record; a crash before the journal is
        // empty leaves records that loading skips by their `seq`.
        if self.journal_len == 0 && !self.journal_dirty {
            return Ok(());
        }
        let f = self.journal.as_ref().expect("opened above");
        match f.set_len(0).and_then(|()| f.sync_data()) {
            Ok(()) => {
                self.journal_len = 0;
                self.journal_dirty = false;
            }
            Err(e) => {
                // The records stay and stay valid (all at or below `seq`);
                // the next append goes after them.
                tracing::warn!(error = %e, "emptying the journal after a snapshot failed");
                self.journal_dirty = true;
            }
        }
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Replaces `file` with what `write` writes: into a temporary file beside
/// it (mode 0600), synced, then renamed over `file`. When writing, syncing
/// or renaming fails (`ENOSPC`, `EIO`), the temporary file is removed, so
/// a full disk is not left fuller, and `file` is as it was. The caller
/// syncs the directory.
fn replace_file(
    file: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = file.with_file_name(TMP_FILE);
    let written = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
        write(&mut f)?;
        f.sync_all()
    })();
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, file)) {
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(rm) if rm.kind() == std::io::ErrorKind::NotFound => {}
            Err(rm) => tracing::warn!(
                path = %tmp.display(),
                error = %rm,
                "removing the temporary state file failed"
            ),
        }
        return Err(e);
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
    /// files if there are any; [`Persistence::Journal`]. `None` keeps the
    /// state in memory only. Opening writes nothing.
    ///
    /// # Errors
    /// [`LoadError`] if the directory cannot be created or a state file
    /// cannot be read or is damaged (other than a torn last journal
    /// record). A corrupt file is never overwritten.
    pub fn open(dir: Option<&Path>) -> std::result::Result<Self, LoadError> {
        Self::open_with(dir, Persistence::Journal)
    }

    /// [`StateHandle::open`] with the given way of persisting changes.
    ///
    /// # Errors
    /// As [`StateHandle::open`].
    pub fn open_with(
        dir: Option<&Path>,
        mode: Persistence,
    ) -> std::result::Result<Self, LoadError> {
        let (disk, state) = match dir {
            None => (None, State::default()),
            Some(dir) => {
                fs::create_dir_all(dir).map_err(|source| LoadError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
                let (disk, state) = load(dir, mode)?;
                (Some(disk), state)
            }
        };
        let (tx, rx) = watch::channel(Published {
            generation: 0,
            state: Arc::new(state),
        });
        Ok(Self {
            store: Arc::new(Mutex::new(Store { disk, tx })),
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
    /// The copy shares all of the state until `change` changes a part of
    /// it ([`crate::model::Map`]), so it costs what the change costs.
    ///
    /// # Errors
    /// The error of `change`, or [`ControlError::Storage`] if the new state
    /// could not be written.
    pub fn mutate_blocking<T>(&self, change: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        self.commit(change).map(|(out, _)| out)
    }

    /// [`StateHandle::mutate_blocking`] that also answers what it committed.
    fn commit<T>(&self, change: impl FnOnce(&mut State) -> Result<T>) -> Result<(T, Committed)> {
        let mut store = self
            .store
            .lock()
            .map_err(|_| ControlError::Storage("store lock poisoned by an earlier panic".into()))?;
        let (before, generation) = {
            let cur = store.tx.borrow();
            (cur.state.clone(), cur.generation + 1)
        };
        let mut next = State::clone(&before);
        let out = change(&mut next)?;
        let persisted = match &mut store.disk {
            Some(disk) => disk.persist(&before, &next),
            None => Ok(()),
        };
        persisted.map_err(|e| {
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

    /// Test hook: runs `f` on the store's files.
    #[cfg(test)]
    fn with_disk<T>(&self, f: impl FnOnce(&mut Disk) -> T) -> T {
        let mut store = self.store.lock().unwrap();
        f(store.disk.as_mut().expect("a store on disk"))
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

/// Reads the snapshot and replays the journal of `dir`.
fn load(dir: &Path, mode: Persistence) -> std::result::Result<(Disk, State), LoadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    let read = |path: &Path| match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    };
    let file = dir.join(STATE_FILE);
    let corrupt = |path: &Path, reason: String| LoadError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let (mut state, snap_seq, snapshot_format, snapshot_len) = match read(&file)? {
        None => (State::default(), 0, 0, 0),
        Some(bytes) => {
            let parsed: FileIn =
                serde_json::from_slice(&bytes).map_err(|e| corrupt(&file, e.to_string()))?;
            if !(1..=FORMAT_VERSION).contains(&parsed.format) {
                return Err(corrupt(
                    &file,
                    format!(
                        "format version {} (this build reads 1 to {FORMAT_VERSION})",
                        parsed.format
                    ),
                ));
            }
            let seq = if parsed.format == 1 { 0 } else { parsed.seq };
            (parsed.state, seq, parsed.format, bytes.len() as u64)
        }
    };
    let jpath = dir.join(JOURNAL_FILE);
    let jbytes = read(&jpath)?.unwrap_or_default();
    let mut disk = Disk {
        dir: dir.to_path_buf(),
        mode,
        journal_min: JOURNAL_MIN_BYTES,
        seq: snap_seq,
        snapshot_len,
        snapshot_format,
        journal: None,
        journal_len: 0,
        journal_dirty: !jbytes.is_empty(),
        broken: None,
        #[cfg(test)]
        fail_append_after: None,
    };
    if jbytes.is_empty() {
        return Ok((disk, state));
    }
    if snapshot_format == 0 {
        return Err(corrupt(
            &jpath,
            format!("a journal without its snapshot {STATE_FILE}; restore the snapshot"),
        ));
    }
    if snapshot_format < 2 {
        // Format 1 knows no journal: this one was left by a later version
        // before an earlier one rewrote the state. The next change writes
        // a snapshot and empties it.
        tracing::warn!(
            journal = %jpath.display(),
            "ignoring a journal beside a format-1 state file"
        );
        return Ok((disk, state));
    }
    let journal = journal::read(&jbytes).map_err(|r| corrupt(&jpath, r))?;
    for (i, entry) in journal.entries.into_iter().enumerate() {
        if entry.seq <= snap_seq {
            continue;
        }
        if entry.seq != disk.seq + 1 {
            return Err(corrupt(
                &jpath,
                format!(
                    "record {i} is change {}, expected {}: changes are missing",
                    entry.seq,
                    disk.seq + 1
                ),
            ));
        }
        change::apply(&mut state, entry.ops)
            .map_err(|r| corrupt(&jpath, format!("record {i} (change {}): {r}", entry.seq)))?;
        disk.seq = entry.seq;
    }
    // The replay changed the maps directly.
    state.reindex();
    if let Some(torn) = journal.torn {
        tracing::warn!(
            journal = %jpath.display(),
            "ignoring a torn last record ({torn}), a change that was never acknowledged"
        );
    }
    disk.journal_len = journal.valid_len;
    disk.journal_dirty = journal.valid_len < jbytes.len() as u64;
    Ok((disk, state))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use dpu_rand::Rng;

    use super::*;
    use crate::model::{Action, Rule, RuleSet, Subsystem, Tenant, Timestamp};
    use crate::state::Limits;

    fn tenant(id: &str) -> Tenant {
        Tenant {
            id: id.into(),
            display_name: format!("tenant {id}"),
            attachments: vec![],
            default_policy: Action::Deny,
            create_time: Timestamp::now(),
            rules: RuleSet::default(),
            storage_qos: Default::default(),
            vlan_id: 0,
            no_offload: false,
        }
    }

    fn add_tenant(h: &StateHandle, id: &str) -> Result<()> {
        h.mutate_blocking(|s| s.create_tenant(Limits::with_ram(0), &Default::default(), tenant(id)))
    }

    fn rule(id: &str, priority: u32) -> Rule {
        Rule {
            id: id.into(),
            priority,
            src: None,
            dst: None,
            src_ports: None,
            dst_ports: Some(crate::model::PortRange {
                first: 80,
                last: 80 + (priority % 1000) as u16,
            }),
            protocol: Some(6),
            icmp_type: None,
            icmp_code: None,
            action: Action::Allow,
            stateful: priority.is_multiple_of(3),
            description: format!("rule {priority}"),
            rate_limit: None,
        }
    }

    fn subsystem(id: &str, hosts: u32) -> Subsystem {
        Subsystem {
            id: id.into(),
            nqn: format!("nqn.2024-01.test:{id}"),
            serial_number: "SN".into(),
            model_number: "MN".into(),
            allow_any_host: false,
            allowed_hosts: (0..hosts).map(|h| format!("nqn.host:{h}")).collect(),
            max_namespaces: 32,
            create_time: Timestamp::now(),
            namespaces: (1..=hosts % 3)
                .map(|nsid| {
                    let ns = crate::model::Namespace {
                        namespace_id: String::new(),
                        eui64: None,
                        nsid,
                        backend: crate::model::Backend::Ram { size_bytes: 4096 },
                        block_size: 512,
                        uuid: [nsid as u8; 16],
                        nguid: [1; 16],
                        qos: crate::model::QosLimits {
                            iops: u64::from(nsid) * 1_000,
                            ..Default::default()
                        },
                    };
                    (nsid, ns)
                })
                .collect(),
            listeners: BTreeMap::new(),
            auth_requirement: Default::default(),
            host_auth: BTreeMap::new(),
            host_qos: (0..hosts.min(2))
                .map(|h| {
                    let q = crate::model::QosLimits {
                        read_bandwidth: u64::from(h + 1) << 20,
                        ..Default::default()
                    };
                    (format!("nqn.host:{h}"), q)
                })
                .collect(),
            tls_requirement: Default::default(),
            host_tls: BTreeMap::new(),
        }
    }

    fn journal_len(dir: &Path) -> u64 {
        fs::metadata(dir.join(JOURNAL_FILE)).map_or(0, |m| m.len())
    }

    fn snapshot_seq(dir: &Path) -> u64 {
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join(STATE_FILE)).unwrap()).unwrap();
        v["seq"].as_u64().unwrap()
    }

    /// One random change of any kind the journal records, made directly on
    /// the state (the store records whatever a change did).
    fn random_change(s: &mut State, rng: &mut Rng, n: u64) {
        let ids: Vec<String> = s.tenants.keys().cloned().collect();
        let pick = |rng: &mut Rng| rng.pick(&ids).clone();
        match rng.below(12) {
            _ if ids.is_empty() => {
                s.tenants.insert(format!("t{n}"), tenant(&format!("t{n}")));
            }
            0 => {
                s.tenants.insert(format!("t{n}"), tenant(&format!("t{n}")));
            }
            1 if ids.len() > 2 => {
                s.tenants.remove(&pick(rng));
            }
            2 => {
                let t = s.tenants.get_mut(&pick(rng)).unwrap();
                t.display_name = format!("renamed {n}");
                t.default_policy = Action::Allow;
            }
            3 => {
                let t = s.tenants.get_mut(&pick(rng)).unwrap();
                let rules = (0..rng.below(20))
                    .map(|i| rule(&format!("r{n}-{i}"), i as u32 * 10))
                    .collect();
                t.rules = RuleSet {
                    version: t.rules.version + 1,
                    rules: Arc::new(rules),
                };
            }
            4 => {
                // Same rules, new version (what a no-op replace does).
                let t = s.tenants.get_mut(&pick(rng)).unwrap();
                t.rules.version += 1;
            }
            5 => {
                let id = format!("s{}", rng.below(4));
                let sub = subsystem(&id, rng.below(5) as u32);
                s.subsystems.insert(id, sub);
            }
            6 => {
                let id = format!("s{}", rng.below(4));
                s.subsystems.remove(&id);
            }
            7 => s.id_seq += 1 + rng.below(3),
            8 if !s.tenants.is_empty() => {
                let t = s.tenants.get_mut(&pick(rng)).unwrap();
                let mut rules = t.rules.rules.as_ref().clone();
                if !rules.is_empty() {
                    rules.remove(rng.index(rules.len()));
                }
                t.rules = RuleSet {
                    version: t.rules.version + 1,
                    rules: Arc::new(rules),
                };
            }
            _ => {
                let t = s.tenants.get_mut(&pick(rng)).unwrap();
                let mut rules = t.rules.rules.as_ref().clone();
                let at = rng.index(rules.len() + 1);
                rules.insert(at, rule(&format!("r{n}"), n as u32));
                if rng.below(4) == 0 && rules.len() > 1 {
                    let j = rng.index(rules.len());
                    rules[j].description = format!("changed {n}");
                }
                t.rules = RuleSet {
                    version: t.rules.version + 1,
                    rules: Arc::new(rules),
                };
            }
        }
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
        assert!(!dir.path().join(TMP_FILE).exists());
    }

    /// A state written before QoS loads with no limits; limits set since
    /// are persisted and read back.
    #[test]
    fn qos_limits_persist_and_old_states_load_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = State::default();
        let mut sub = subsystem("s", 1);
        sub.host_qos.clear();
        for ns in sub.namespaces.values_mut() {
            ns.qos = Default::default();
        }
        old.subsystems.insert("s".into(), sub);
        let text = serde_json::json!({"format": 1, "state": old}).to_string();
        assert!(!text.contains("qos"), "{text}");
        fs::write(dir.path().join(STATE_FILE), &text).unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*h.snapshot(), old);
        let q = crate::model::QosLimits {
            write_iops: 500,
            ..Default::default()
        };
        h.mutate_blocking(|s| {
            s.set_namespace_qos("s", 1, q)?;
            s.set_host_qos("s", "nqn.host:0", q).map(drop)
        })
        .unwrap();
        drop(h);
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        let sub = &reopened.snapshot().subsystems["s"];
        assert_eq!(sub.namespaces[&1].qos, q);
        assert_eq!(sub.host_qos["nqn.host:0"], q);
    }

    /// A state written before the secure channel loads without it; keys,
    /// requirements and secure channels set since persist through the
    /// journal and the snapshot, and the key shows in no `Debug` output
    /// of the state (only the private state files hold it, as they hold
    /// DH-HMAC-CHAP secrets).
    #[test]
    fn tls_settings_persist_and_old_states_load_without_them() {
        const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let dir = tempfile::tempdir().unwrap();
        let mut old = State::default();
        old.subsystems.insert("s".into(), subsystem("s", 1));
        let text = serde_json::json!({"format": 1, "state": old}).to_string();
        assert!(!text.contains("tls") && !text.contains("secure"), "{text}");
        fs::write(dir.path().join(STATE_FILE), &text).unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*h.snapshot(), old);
        h.mutate_blocking(|s| {
            let (k, _) = crate::model::PskText::parse(PSK).unwrap();
            let k = k.with_v0_derivation(crate::model::TlsDerivation::Compat);
            s.set_host_tls_key("s", "nqn.host:0", k)?;
            s.update_subsystem(
                Limits::with_ram(1 << 20),
                "s",
                crate::state::SubsystemUpdate {
                    tls_requirement: Some(crate::model::TlsRequirement::Required),
                    ..Default::default()
                },
            )?;
            s.create_listener(
                Limits::with_ram(1 << 20),
                "s",
                crate::model::Listener {
                    id: "l".into(),
                    transport: crate::model::Transport::Tcp,
                    address: "127.0.0.1".parse().unwrap(),
                    port: 4420,
                    tenant: None,
                    mac: None,
                    secure_channel: crate::model::SecureChannel::Allowed,
                },
            )
            .map(drop)
        })
        .unwrap();
        let journal = fs::read_to_string(dir.path().join(JOURNAL_FILE)).unwrap_or_default();
        let on_disk = journal + &fs::read_to_string(dir.path().join(STATE_FILE)).unwrap();
        assert!(
            on_disk.contains(PSK),
            "the private state files keep the key"
        );
        drop(h);
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        let state = reopened.snapshot();
        let sub = &state.subsystems["s"];
        assert_eq!(sub.host_tls["nqn.host:0"].hash_code(), 1);
        assert_eq!(
            sub.host_tls["nqn.host:0"].v0_derivation(),
            crate::model::TlsDerivation::Compat
        );
        assert_eq!(sub.tls_requirement, crate::model::TlsRequirement::Required);
        assert_eq!(
            sub.listeners["l"].secure_channel,
            crate::model::SecureChannel::Allowed
        );
        let dbg = format!("{state:?}");
        assert!(!dbg.contains(&PSK[16..40]), "{dbg}");
    }

    #[test]
    fn random_changes_replay_to_the_same_state() {
        for (seed, mode) in [
            (1u64, Persistence::Journal),
            (2, Persistence::Journal),
            (3, Persistence::Rewrite),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let h = StateHandle::open_with(Some(dir.path()), mode).unwrap();
            let mut rng = Rng::new(seed);
            for n in 0..300 {
                let r = rng.next_u64();
                h.mutate_blocking(move |s| {
                    random_change(s, &mut Rng::new(r), n);
                    Ok(())
                })
                .unwrap();
                if n % 50 == 49 {
                    let reopened = StateHandle::open_with(Some(dir.path()), mode).unwrap();
                    assert_eq!(
                        *reopened.snapshot(),
                        *h.snapshot(),
                        "seed {seed}, change {n}"
                    );
                    // The snapshot and the replayed journal are indexed.
                    assert!(
                        reopened.snapshot().index_drift().is_none(),
                        "seed {seed}, change {n}"
                    );
                }
            }
            let (snap, journal) = (snapshot_seq(dir.path()), journal_len(dir.path()));
            match mode {
                // The first change wrote the snapshot; the rest is journal.
                Persistence::Journal => assert!(snap == 1 && journal > 0, "{snap} {journal}"),
                Persistence::Rewrite => assert!(snap >= 250 && journal == 0, "{snap} {journal}"),
            }
        }
    }

    #[test]
    fn one_rule_among_many_costs_one_rule() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "big").unwrap();
        h.mutate_blocking(|s| {
            let rules = (0..10_000).map(|i| (None, rule("", i * 2))).collect();
            s.replace_rules(Limits::with_ram(0), "big", rules, None)
        })
        .unwrap();
        let snapshot = fs::read(dir.path().join(STATE_FILE)).unwrap();
        let before = journal_len(dir.path());
        h.mutate_blocking(|s| s.add_rule(Limits::with_ram(0), "big", rule("new", 5_001), None))
            .unwrap();
        let record = journal_len(dir.path()) - before;
        assert!(record < 600, "one rule took {record} bytes");
        h.mutate_blocking(|s| s.delete_rule("big", "new", None))
            .unwrap();
        assert!(journal_len(dir.path()) - before - record < 300);
        assert_eq!(fs::read(dir.path().join(STATE_FILE)).unwrap(), snapshot);
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *h.snapshot());
    }

    /// The journal cut at every byte of its last record, as a crash in the
    /// middle of the append leaves it, loads as the state before that
    /// change; and the next change overwrites the torn bytes.
    #[test]
    fn a_torn_last_record_loads_as_the_state_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        add_tenant(&h, "b").unwrap();
        h.mutate_blocking(|s| s.add_rule(Limits::with_ram(0), "a", rule("r1", 10), None))
            .unwrap();
        let before = h.snapshot();
        let whole_before = journal_len(dir.path());
        h.mutate_blocking(|s| s.add_rule(Limits::with_ram(0), "a", rule("r2", 20), None))
            .unwrap();
        let after = h.snapshot();
        drop(h);
        let journal = fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
        assert!(whole_before > 0 && (journal.len() as u64) > whole_before);
        for cut in whole_before..=journal.len() as u64 {
            let copy = tempfile::tempdir().unwrap();
            fs::copy(dir.path().join(STATE_FILE), copy.path().join(STATE_FILE)).unwrap();
            fs::write(copy.path().join(JOURNAL_FILE), &journal[..cut as usize]).unwrap();
            let h = StateHandle::open(Some(copy.path())).unwrap();
            let whole = cut == journal.len() as u64;
            assert_eq!(
                *h.snapshot(),
                if whole {
                    (*after).clone()
                } else {
                    (*before).clone()
                },
                "cut at {cut}"
            );
            // The next change goes where the torn record began.
            add_tenant(&h, "c").unwrap();
            let expected = h.snapshot();
            drop(h);
            let h = StateHandle::open(Some(copy.path())).unwrap();
            assert_eq!(*h.snapshot(), *expected, "cut at {cut}, then a change");
        }
    }

    #[test]
    fn damage_before_the_last_record_stops_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        let start = journal_len(dir.path());
        for i in 0..3 {
            h.mutate_blocking(move |s| {
                s.add_rule(Limits::with_ram(0), "a", rule(&format!("r{i}"), i), None)
            })
            .unwrap();
        }
        drop(h);
        let path = dir.path().join(JOURNAL_FILE);
        let good = fs::read(&path).unwrap();
        let rec = good.len() / 3;
        assert_eq!(start, 0);

        // A flipped bit in the first record.
        let mut bad = good.clone();
        bad[rec / 2] ^= 0x10;
        fs::write(&path, &bad).unwrap();
        let err = StateHandle::open(Some(dir.path())).unwrap_err();
        assert!(matches!(err, LoadError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("offset 0"), "{err}");
        assert_eq!(fs::read(&path).unwrap(), bad, "left for inspection");

        // The middle record missing: a gap in the sequence.
        let first = u32::from_le_bytes(good[0..4].try_into().unwrap()) as usize + 12;
        let second = u32::from_le_bytes(good[first..first + 4].try_into().unwrap()) as usize + 12;
        let mut gap = good[..first].to_vec();
        gap.extend_from_slice(&good[first + second..]);
        fs::write(&path, &gap).unwrap();
        let err = StateHandle::open(Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains("changes are missing"), "{err}");

        // A record that does not fit the state: the snapshot lost a tenant.
        fs::write(&path, &good).unwrap();
        fs::write(
            dir.path().join(STATE_FILE),
            br#"{"format": 2, "seq": 1, "state": {"tenants": {}, "subsystems": {}, "id_seq": 0}}"#,
        )
        .unwrap();
        let err = StateHandle::open(Some(dir.path())).unwrap_err().to_string();
        assert!(
            err.contains("tenants/a changed but does not exist"),
            "{err}"
        );

        // A journal whose snapshot is gone.
        fs::remove_file(dir.path().join(STATE_FILE)).unwrap();
        let err = StateHandle::open(Some(dir.path())).unwrap_err().to_string();
        assert!(err.contains("without its snapshot"), "{err}");
    }

    #[test]
    fn the_journal_is_folded_into_snapshots_and_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        h.with_disk(|d| d.journal_min = 4096);
        add_tenant(&h, "a").unwrap();
        let mut snapshots = BTreeSet::new();
        let mut most = 0;
        for i in 0..200 {
            // Kept before each change: what a crash between the new
            // snapshot and emptying the journal leaves.
            let old_journal = fs::read(dir.path().join(JOURNAL_FILE)).unwrap_or_default();
            h.mutate_blocking(move |s| {
                s.add_rule(Limits::with_ram(0), "a", rule(&format!("r{i}"), i), None)
            })
            .unwrap();
            snapshots.insert(snapshot_seq(dir.path()));
            let snapshot = fs::metadata(dir.path().join(STATE_FILE)).unwrap().len();
            let journal = journal_len(dir.path());
            assert!(journal <= 4096.max(snapshot), "{journal} > {snapshot}");
            most = most.max(journal);
            if journal == 0 && i > 0 {
                let copy = tempfile::tempdir().unwrap();
                fs::copy(dir.path().join(STATE_FILE), copy.path().join(STATE_FILE)).unwrap();
                fs::write(copy.path().join(JOURNAL_FILE), &old_journal).unwrap();
                let h2 = StateHandle::open(Some(copy.path())).unwrap();
                assert_eq!(*h2.snapshot(), *h.snapshot(), "stale records are skipped");
                add_tenant(&h2, "after").unwrap();
                let expected = h2.snapshot();
                drop(h2);
                let h2 = StateHandle::open(Some(copy.path())).unwrap();
                assert_eq!(*h2.snapshot(), *expected, "appended after stale records");
            }
        }
        assert!(snapshots.len() > 3, "{snapshots:?}");
        assert!(most > 1000, "the journal was used ({most} bytes at most)");
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *h.snapshot());
    }

    #[test]
    fn a_format_1_file_is_migrated_at_the_first_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = State::default();
        old.tenants.insert("old".into(), tenant("old"));
        old.id_seq = 7;
        let text = serde_json::json!({"format": 1, "state": old}).to_string();
        fs::write(dir.path().join(STATE_FILE), &text).unwrap();
        // A journal left by a later version before this file was rewritten
        // by an earlier one: stale, ignored.
        fs::write(dir.path().join(JOURNAL_FILE), b"stale bytes").unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*h.snapshot(), old);
        assert_eq!(
            fs::read_to_string(dir.path().join(STATE_FILE)).unwrap(),
            text
        );
        add_tenant(&h, "new").unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(STATE_FILE)).unwrap()).unwrap();
        assert_eq!(v["format"], 2);
        assert_eq!(journal_len(dir.path()), 0);
        add_tenant(&h, "newer").unwrap();
        assert!(journal_len(dir.path()) > 0);
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *h.snapshot());
        assert_eq!(reopened.snapshot().tenants.len(), 3);
    }

    #[test]
    fn state_files_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        add_tenant(&h, "b").unwrap();
        for f in [STATE_FILE, JOURNAL_FILE] {
            let mode = fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }

    #[test]
    fn refused_change_is_not_applied_or_written() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        add_tenant(&h, "b").unwrap();
        let on_disk = fs::read(dir.path().join(STATE_FILE)).unwrap();
        let journal = fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
        assert!(matches!(
            add_tenant(&h, "a"),
            Err(ControlError::AlreadyExists(_))
        ));
        assert_eq!(fs::read(dir.path().join(STATE_FILE)).unwrap(), on_disk);
        assert_eq!(fs::read(dir.path().join(JOURNAL_FILE)).unwrap(), journal);
        assert_eq!(h.snapshot().tenants.len(), 2);
        // A change that changes nothing writes nothing.
        h.mutate_blocking(|_| Ok(())).unwrap();
        assert_eq!(fs::read(dir.path().join(JOURNAL_FILE)).unwrap(), journal);
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
    fn failed_snapshot_refuses_the_change() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open_with(Some(dir.path()), Persistence::Rewrite).unwrap();
        add_tenant(&h, "a").unwrap();
        // A directory where the temp file should go makes the write fail.
        fs::create_dir(dir.path().join(TMP_FILE)).unwrap();
        assert!(matches!(add_tenant(&h, "b"), Err(ControlError::Storage(_))));
        assert!(!h.snapshot().tenants.contains_key("b"));
        fs::remove_dir(dir.path().join(TMP_FILE)).unwrap();
        add_tenant(&h, "b").unwrap();
        assert!(!dir.path().join(TMP_FILE).exists());
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *h.snapshot());
    }

    /// An append that fails after writing part of its record (a full disk)
    /// refuses the change and takes the part back: the change is not there
    /// after a restart, and the next change lands whole.
    #[test]
    fn failed_append_refuses_the_change_and_leaves_no_trace() {
        let dir = tempfile::tempdir().unwrap();
        let h = StateHandle::open(Some(dir.path())).unwrap();
        add_tenant(&h, "a").unwrap();
        add_tenant(&h, "b").unwrap();
        let journal = fs::read(dir.path().join(JOURNAL_FILE)).unwrap();
        for part in [0, 5, 12, 40] {
            h.with_disk(|d| d.fail_append_after = Some(part));
            let err = add_tenant(&h, "c").unwrap_err();
            assert!(matches!(err, ControlError::Storage(_)), "{err}");
            assert!(!h.snapshot().tenants.contains_key("c"));
            assert_eq!(fs::read(dir.path().join(JOURNAL_FILE)).unwrap(), journal);
            let reopened = StateHandle::open(Some(dir.path())).unwrap();
            assert_eq!(*reopened.snapshot(), *h.snapshot());
        }
        add_tenant(&h, "c").unwrap();
        let reopened = StateHandle::open(Some(dir.path())).unwrap();
        assert_eq!(*reopened.snapshot(), *h.snapshot());
        assert!(reopened.snapshot().tenants.contains_key("c"));
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
        assert!(!dir.path().join(TMP_FILE).exists());
        assert_eq!(fs::read(&file).unwrap(), b"old");
        replace_file(&file, |f| f.write_all(b"new")).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"new");
        assert!(!dir.path().join(TMP_FILE).exists());
    }

    /// The same on a real full file system: a 64 KiB tmpfs, which needs
    /// root to mount (the test says so and passes vacuously without it;
    /// the injected failures above run everywhere). Journal appends fill
    /// it; the one that does not fit is cut back, and a snapshot that does
    /// not fit leaves no temporary file.
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
        let mut refused = None;
        for i in 0..10_000 {
            if let Err(e) = add_tenant(&h, &format!("t{i}")) {
                refused = Some(e);
                break;
            }
        }
        let journal_full = journal_len(dir.path());
        // A snapshot of what fits no longer fits beside the journal.
        let snapshot = h.with_disk(|d| {
            let state = (*h.snapshot()).clone();
            d.write_snapshot(&state, d.seq)
        });
        let mut listing: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        listing.sort();
        let reopened = StateHandle::open(Some(dir.path())).map(|r| r.snapshot());
        unmount(dir.path());
        assert!(
            matches!(refused, Some(ControlError::Storage(ref m)) if m.contains("No space")),
            "{refused:?}"
        );
        assert!(journal_full > 0);
        assert_eq!(
            snapshot.map_err(|e| e.raw_os_error()).unwrap_err(),
            Some(28)
        );
        assert_eq!(
            listing,
            [
                std::ffi::OsString::from(JOURNAL_FILE),
                std::ffi::OsString::from(STATE_FILE)
            ]
        );
        assert_eq!(
            *reopened.unwrap(),
            *h.snapshot(),
            "the files hold the last accepted state"
        );
    }
}

//! The switch's connection and fragment tables across a restart: written
//! to `<state.dir>/switch-tables` once the workers have stopped, read back
//! (and removed) before the new workers start.
//!
//! The file is removed as soon as it is read, good or bad: after a
//! `kill -9` there is no file, and the tables are lost, rather than
//! replaced by those of an older stop. Without a state directory nothing
//! is kept.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use dpu_dataplane::switch::{RestoreReport, SavedTables, SwitchHandle};

/// The file's name in the state directory.
pub const FILE: &str = "switch-tables";

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads the tables a previous process saved in `dir`, if any, into
/// `switch` for the workers about to start (`workers` of them, which
/// bounds what a file may hold), and removes the file. A file refused as
/// a whole is logged and counted; the service starts either way.
pub fn restore(switch: &SwitchHandle, dir: Option<&Path>, workers: usize) {
    let Some(dir) = dir else { return };
    let path = dir.join(FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!("no switch tables saved: connections start untracked");
            return;
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open the saved switch tables");
            switch.refused_saved_tables();
            return;
        }
    };
    let entries = switch.table_capacity().saturating_mul(workers.max(1));
    let limit = SavedTables::max_len(entries);
    let mut bytes = Vec::new();
    let read = file
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())
        .and_then(|n| {
            if n > limit {
                Err(format!(
                    "larger than the {limit} bytes the tables could fill"
                ))
            } else {
                Ok(())
            }
        })
        .and_then(|()| SavedTables::decode(&bytes, entries).map_err(|e| e.to_string()));
    if let Err(e) = std::fs::remove_file(&path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove the saved switch tables");
    }
    match read {
        Ok(saved) => {
            let r = switch.restore(&saved, unix_now());
            log_report(&r, unix_now().saturating_sub(saved.saved_unix));
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "saved switch tables refused; connections start untracked");
            switch.refused_saved_tables();
        }
    }
}

fn log_report(r: &RestoreReport, age_secs: u64) {
    tracing::info!(
        age_secs,
        connections = r.conns.restored,
        connections_expired = r.conns.expired,
        connections_without_tenant = r.conns.no_tenant,
        connections_invalid = r.conns.invalid,
        fragments = r.frags.restored,
        fragments_expired = r.frags.expired,
        fragments_without_tenant = r.frags.no_tenant,
        fragments_invalid = r.frags.invalid,
        "switch tables restored"
    );
}

/// Writes what `switch`'s stopped workers left in their tables to `dir`
/// (through a temporary file, synced, renamed into place).
pub fn save(switch: &SwitchHandle, dir: Option<&Path>) {
    let started = Instant::now();
    let saved = switch.saved_tables();
    let Some(dir) = dir else {
        if !saved.conns.is_empty() {
            tracing::info!(
                connections = saved.conns.len(),
                "no state directory: the switch's tables are not kept"
            );
        }
        return;
    };
    let bytes = saved.encode();
    let (tmp, path) = (dir.join(format!("{FILE}.tmp")), dir.join(FILE));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    match written {
        Ok(()) => tracing::info!(
            connections = saved.conns.len(),
            fragments = saved.frags.len(),
            bytes = bytes.len(),
            ms = started.elapsed().as_millis() as u64,
            "switch tables saved"
        ),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(path = %path.display(), error = %e, "cannot save the switch tables; they are lost");
        }
    }
}

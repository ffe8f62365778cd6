//! Replays the committed fuzz inputs as plain tests: for each target, the
//! empty input (libFuzzer's first), then every file under
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` (where the
//! folder exists) through `dpu_fuzz::<target>::run`. A panic fails the
//! target's test, naming the files that panicked; so does a seeds folder
//! without a seed in it.

#![forbid(unsafe_code)]

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The files under `dir`, at any depth (none if it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            assert!(!d.exists(), "cannot read {}", d.display());
            continue;
        };
        for e in entries {
            let path = e.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Runs `run` on the empty input and on each committed input of `target`.
fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let seeds = root.join("seeds").join(target);
    let mut inputs = files(&seeds);
    assert!(
        !seeds.exists() || !inputs.is_empty(),
        "{target}: no seed in {}",
        seeds.display()
    );
    inputs.extend(files(&root.join("regressions").join(target)));

    let mut failed = Vec::new();
    let empty = panic::catch_unwind(|| run(&[]));
    if empty.is_err() {
        failed.push("the empty input".to_string());
    }
    for path in &inputs {
        let data = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("{target}: {} ({} bytes)", path.display(), data.len());
        if panic::catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: panicked on {} of {} inputs: {}",
        failed.len(),
        inputs.len() + 1,
        failed.join(", ")
    );
}

macro_rules! targets {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay(stringify!($target), dpu_fuzz::$target::run);
            }
        )*
    };
}

targets!(
    pdu,
    connection,
    handshake,
    auth,
    host,
    parse,
    switch,
    isolation,
    rules,
    saved_tables,
    rule_proto,
    opi_proto,
    storage_proto,
    frames,
    tls
);

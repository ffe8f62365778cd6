//! SPDK for the integration tests that run it: its tree and the
//! hugepages it needs. Each test binary that uses it says `mod spdk;`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The SPDK tree: `SPDK_DIR`, else the last line `tests/spdk.sh` prints
/// (it builds SPDK once per machine when the shared tool is there).
pub fn spdk_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SPDK_DIR") {
        return d.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/spdk.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("running tests/spdk.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "no SPDK: tests/spdk.sh failed ({}); set SPDK_DIR to a built SPDK tree",
        out.status
    );
    let dir = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    assert!(
        dir.join("build/bin/nvmf_tgt").is_file(),
        "no SPDK: {} has no build/bin/nvmf_tgt",
        dir.display()
    );
    dir
}

/// Makes sure SPDK finds 2 MiB hugepages: reserves 512 more (as root)
/// when fewer than 256 are free, mounts hugetlbfs when it is not.
pub fn hugepages() {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let free: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if free < 256 {
        let total: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::write("/proc/sys/vm/nr_hugepages", (total + 512).to_string())
            .expect("reserving hugepages for SPDK (run as root)");
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    if !mounts
        .lines()
        .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
    {
        std::fs::create_dir_all("/dev/hugepages").unwrap();
        let st = Command::new("mount")
            .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
            .status()
            .unwrap();
        assert!(st.success(), "cannot mount hugetlbfs at /dev/hugepages");
    }
}

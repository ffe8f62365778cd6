//! A real single-node Ceph cluster for tests and benchmarks: one monitor,
//! one OSD, cephx and an `rbd` pool, as plain processes in a private
//! directory, brought up by the `ceph-up.sh` tool (from `$CEPH_TOOLS`, or
//! `tools/ceph/` of the `shared/` folder beside the repository) and
//! stopped when the [`TestCluster`] drops. Nothing is skipped: a machine
//! without the tool or Ceph's packages fails the test that asks for one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::ClusterConfig;

/// A running cluster; dropped, it is stopped and its directory removed.
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    tools: PathBuf,
    /// The monitor addresses (`mon_host`).
    pub mon_host: String,
    /// `client.admin`'s cephx key.
    pub admin_key: String,
}

/// Where `ceph-up.sh` and `ceph-down.sh` are.
pub fn tools() -> PathBuf {
    if let Some(d) = std::env::var_os("CEPH_TOOLS") {
        return d.into();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for c in [
        repo.join("../shared/tools/ceph"),
        PathBuf::from("/work/shared/tools/ceph"),
    ] {
        if c.join("ceph-up.sh").is_file() {
            return c;
        }
    }
    panic!(
        "no ceph-up.sh: set CEPH_TOOLS to the folder holding ceph-up.sh and ceph-down.sh \
         (shared/tools/ceph beside the repository)"
    );
}

impl TestCluster {
    /// Brings a cluster up on free ports (memstore: its data lives in
    /// the OSD's memory; `bluestore` keeps it across an OSD restart).
    ///
    /// The ports are taken below the kernel's ephemeral range, so that
    /// sockets other tests open meanwhile (their ports chosen by the
    /// kernel) do not take them between the check and the bind; a port
    /// that is taken anyway makes another attempt, on other ports.
    pub fn start(bluestore: bool) -> Self {
        let tools = tools();
        let mut attempt = 0;
        let dir = loop {
            attempt += 1;
            let dir = std::env::temp_dir().join(format!(
                "dpu-ceph-{}-{:x}",
                std::process::id(),
                rand_suffix()
            ));
            let out = Command::new("bash")
                .arg(tools.join("ceph-up.sh"))
                .arg(&dir)
                .env("CEPH_MON_PORT", mon_port().to_string())
                .env(
                    "CEPH_STORE",
                    if bluestore { "bluestore" } else { "memstore" },
                )
                .env("CEPH_STORE_SIZE", (2u64 << 30).to_string())
                .output()
                .expect("run ceph-up.sh");
            if out.status.success() {
                break dir;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            let _ = Command::new("bash")
                .arg(tools.join("ceph-down.sh"))
                .arg(&dir)
                .arg("--purge")
                .status();
            assert!(
                attempt < 4 && err.contains("in use"),
                "ceph-up.sh {} failed (attempt {attempt}):\n{err}",
                dir.display()
            );
        };
        let conf = std::fs::read_to_string(dir.join("ceph.conf")).expect("ceph.conf");
        let keyring = std::fs::read_to_string(dir.join("keyring")).expect("keyring");
        let mon_host = value(&conf, "mon host").expect("mon host in ceph.conf");
        let admin_key = value(&keyring, "key").expect("key in the keyring");
        Self {
            dir,
            tools,
            mon_host,
            admin_key,
        }
    }

    /// The cluster's directory (`ceph.conf`, `keyring`, logs, pid files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How to connect as `client.admin`, with the given operation timeout.
    pub fn config(&self, op_timeout: Duration) -> ClusterConfig {
        ClusterConfig {
            mon_host: self.mon_host.clone(),
            user: "admin".into(),
            key: Some(self.admin_key.clone()),
            op_timeout,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// The OSD's process id.
    pub fn osd_pid(&self) -> i32 {
        let p = std::fs::read_to_string(self.dir.join("run/osd.0.pid")).expect("osd pid file");
        p.trim().parse().expect("osd pid")
    }

    /// Freezes the OSD (SIGSTOP): it holds every operation and answers
    /// nothing, as a hung OSD does, until [`TestCluster::thaw_osd`].
    pub fn freeze_osd(&self) {
        self.signal_osd("-STOP");
    }

    /// Lets a frozen OSD go on (SIGCONT).
    pub fn thaw_osd(&self) {
        self.signal_osd("-CONT");
    }

    fn signal_osd(&self, sig: &str) {
        let pid = self.osd_pid().to_string();
        let st = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill {sig} {pid}");
    }

    /// Kills the OSD at once (SIGKILL), as a crash would, and waits for
    /// it to be gone.
    pub fn kill_osd(&self) {
        let pid = self.osd_pid();
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let t = std::time::Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists()
            && std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "OSD {pid} outlives SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the OSD again (with `bluestore`, it comes back with its
    /// data).
    pub fn start_osd(&self) {
        let conf = self.dir.join("ceph.conf");
        let st = Command::new("ceph-osd")
            .arg("-c")
            .arg(&conf)
            .args(["-i", "0"])
            .status()
            .expect("run ceph-osd");
        assert!(st.success(), "ceph-osd did not start");
    }

    /// Runs Ceph's `rbd` tool against this cluster; its stdout.
    pub fn rbd(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new("rbd")
            .args(args)
            .env("CEPH_CONF", self.dir.join("ceph.conf"))
            .output()
            .expect("run rbd (Debian: ceph-common)");
        assert!(
            out.status.success(),
            "rbd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(self.tools.join("ceph-down.sh"))
            .arg(&self.dir)
            .arg("--purge")
            .status();
    }
}

/// A monitor port for a new cluster: its msgr2 port, msgr1 one above,
/// and the OSD's range 100 to 199 above, all below the kernel's
/// ephemeral ports and not answering now.
fn mon_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let span = low.saturating_sub(10_000 + 200).max(1000);
    let busy = |p: u32| std::net::TcpStream::connect(("127.0.0.1", p as u16)).is_ok();
    loop {
        let p = 10_000 + (rand_suffix() as u32 % span);
        if !busy(p) && !busy(p + 1) {
            return p as u16;
        }
    }
}

/// The value of `key = value` in an ini-style file.
fn value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// Distinguishes clusters of one process.
fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos().into());
    t ^ (NEXT.fetch_add(1, Ordering::Relaxed) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_ports_stay_below_the_ephemeral_range() {
        let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let ports: std::collections::BTreeSet<u16> = (0..200).map(|_| mon_port()).collect();
        assert!(ports.len() > 100, "ports spread: {}", ports.len());
        for p in ports {
            assert!(p >= 10_000 && u32::from(p) + 200 <= low.max(11_200), "{p}");
        }
    }
}

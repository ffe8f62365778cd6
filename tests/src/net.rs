//! Network namespaces for traffic tests: hosts behind the switch's ports.
//! Everything made here is removed when its value drops. Needs root.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// Runs `ip args..`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        bail!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A network namespace, deleted on drop; the interfaces moved into it are
/// deleted first, in case they outlive what made them.
pub struct Netns {
    /// The namespace's name (`ip netns`).
    pub name: String,
    ifs: Vec<String>,
}

impl Netns {
    /// Creates namespace `name` with its loopback up.
    pub fn new(name: String) -> Result<Netns> {
        ip(&["netns", "add", &name])?;
        let ns = Netns {
            name,
            ifs: Vec::new(),
        };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Moves interface `dev` from the root namespace in here, gives it
    /// `addrs` and sets it up.
    pub fn take(&mut self, dev: &str, addrs: &[&str]) -> Result<()> {
        ip(&["link", "set", dev, "netns", &self.name])?;
        self.ifs.push(dev.to_string());
        for a in addrs {
            ip(&["-n", &self.name, "addr", "add", a, "dev", dev])?;
        }
        ip(&["-n", &self.name, "link", "set", dev, "up"])
    }

    /// Runs `args` inside the namespace and waits for it.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        Ok(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()?)
    }

    /// True if two pings to `to` both get replies.
    pub fn ping(&self, to: &str) -> bool {
        self.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "1", to])
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for dev in &self.ifs {
            let _ = Command::new("ip")
                .args(["-n", &self.name, "link", "del", dev])
                .output();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Polls `check` every 100 ms for up to 10 s; fails naming `what`.
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        if Instant::now() >= deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The value of the Prometheus sample whose line starts with
/// `name_and_labels` in `body`, or 0 if there is none.
pub fn metric(body: &str, name_and_labels: &str) -> u64 {
    body.lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Turns checksum and segmentation offloads off on both ends of a veth
/// pair, `outer` here and `inner` in `ns`: a packet socket (the kernel
/// driver, DPDK's `net_af_packet`) sees frames as they are, so both ends
/// must compute checksums and segment themselves.
pub fn offloads_off(ns: &Netns, inner: &str, outer: &str) -> Result<()> {
    let offloads = ["tx", "off", "tso", "off", "gso", "off", "gro", "off"];
    let inside = ns.exec(&[&["ethtool", "-K", inner][..], &offloads].concat())?;
    let outside = Command::new("ethtool")
        .args(["-K", outer])
        .args(offloads)
        .output()?;
    for out in [inside, outside] {
        if !out.status.success() {
            bail!("ethtool -K: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}

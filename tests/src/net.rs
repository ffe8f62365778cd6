//! Network namespaces for traffic tests: hosts behind the switch's ports.
//! Everything made here is removed when its value drops. Needs root.

use std::process::{Child, Command, Output, Stdio};
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

/// A namespace holding one end of a veth pair; the other end, `port_if`,
/// stays in the root namespace for the service. Removed on drop.
pub struct Host {
    /// The veth end the service's port opens.
    pub port_if: String,
    /// The namespace.
    pub ns: Netns,
}

impl Host {
    /// A namespace with address `addr` (with its prefix) on one end of a
    /// new veth pair, the other end (named after `tag` and this process)
    /// up in the root namespace, offloads off on both.
    pub fn new(tag: &str, addr: &str) -> Result<Host> {
        let id = std::process::id();
        let port_if = format!("sw{tag}{id}");
        let peer = format!("{port_if}p");
        let ns = Netns::new(format!("sw{tag}{id}"))?;
        ip(&[
            "link", "add", &port_if, "type", "veth", "peer", "name", &peer,
        ])?;
        // From here on, dropping the host removes the pair.
        let mut h = Host { port_if, ns };
        ip(&["link", "set", &h.port_if, "up"])?;
        h.ns.take(&peer, &[addr])?;
        // The kernel would leave TCP checksums to the veth and hand out
        // 64 KiB segments.
        offloads_off(&h.ns, &peer, &h.port_if)?;
        Ok(h)
    }

    /// Runs `python3 -c script args..` in the namespace and waits.
    pub fn python(&self, script: &str, args: &[&str]) -> std::process::Output {
        self.ns
            .exec(&[&["python3", "-c", script][..], args].concat())
            .expect("running python3 in a namespace")
    }

    /// Starts `python3 -c script args..` in the namespace.
    pub fn spawn_python(&self, script: &str, args: &[&str]) -> Result<Child> {
        Ok(Command::new("ip")
            .args(["netns", "exec", &self.ns.name, "python3", "-c", script])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?)
    }

    /// Starts `python3 -c script args..` in the namespace, its output
    /// kept for `wait_with_output`.
    pub fn spawn_python_out(&self, script: &str, args: &[&str]) -> Result<Child> {
        Ok(Command::new("ip")
            .args(["netns", "exec", &self.ns.name, "python3", "-c", script])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?)
    }

    /// True if two pings to `to` both get replies.
    pub fn ping(&self, to: &str) -> bool {
        self.ns.ping(to)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.port_if])
            .output();
    }
}

/// A configuration with one DPDK port per host; `tag` keeps EAL files of
/// services running side by side apart.
pub fn config(tag: &str, hosts: &[(&str, &Host)]) -> String {
    let mut c = format!(
        r#"
[log]
level = "info"

[dataplane]
workers = 1
idle = "backoff"
lcores = "0"
no_huge = true
memory_mb = 256
mbufs = 4095
file_prefix = "e2e-switch-{tag}-{}"
"#,
        std::process::id()
    );
    for (i, (id, h)) in hosts.iter().enumerate() {
        c += &format!(
            "\n[[ports]]\nid = \"{id}\"\nrole = \"vf\"\ndriver = \"dpdk\"\ndevice = \"net_af_packet{i},iface={}\"\n",
            h.port_if
        );
    }
    c
}

/// Kills and reaps a child a test started.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Python program (`python3 -c ECHO_SERVER ADDR PORT`) that echoes
/// whatever any of its connections sends, many connections at once.
pub const ECHO_SERVER: &str = r#"
import selectors, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(256)
sel = selectors.DefaultSelector()
sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            c, _ = s.accept()
            sel.register(c, selectors.EVENT_READ)
            continue
        try:
            d = key.fileobj.recv(4096)
        except OSError:
            d = b""
        if d:
            key.fileobj.sendall(d)
        else:
            sel.unregister(key.fileobj)
            key.fileobj.close()
"#;

//! Test hosts for traffic tests: a network namespace joined to this one
//! by a veth pair, removed again on drop. Needs root.

#![allow(dead_code)]

use std::process::Command;

/// Runs `ip` with `args`; panics with its message if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A namespace with one end of a veth pair inside; the other end, named
/// `host_if`, stays here for DPDK. Removed on drop.
pub struct Host {
    /// The namespace.
    pub ns: String,
    /// The veth end that stays in this namespace, for the driver.
    pub host_if: String,
}

impl Host {
    /// Creates namespace and veth pair, with `addr` on the namespace end.
    pub fn new(tag: &str, addr: &str) -> Host {
        let id = std::process::id();
        let h = Host {
            ns: format!("dp{tag}{id}"),
            host_if: format!("dp{tag}{id}"),
        };
        let peer = format!("{}p", h.host_if);
        ip(&["netns", "add", &h.ns]);
        ip(&[
            "link", "add", &h.host_if, "type", "veth", "peer", "name", &peer,
        ]);
        ip(&["link", "set", &peer, "netns", &h.ns]);
        ip(&["link", "set", &h.host_if, "up"]);
        ip(&["-n", &h.ns, "addr", "add", addr, "dev", &peer]);
        ip(&["-n", &h.ns, "link", "set", &peer, "up"]);
        ip(&["-n", &h.ns, "link", "set", "lo", "up"]);
        h
    }

    /// True if three pings from this namespace to `to` all get replies.
    pub fn ping(&self, to: &str) -> bool {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.ns, "ping", "-c", "3", "-i", "0.2", "-W", "2", to,
            ])
            .output()
            .expect("running ping");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("No such file"),
            "ping is not installed: {err}"
        );
        out.status.success()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

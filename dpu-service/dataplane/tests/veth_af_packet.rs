//! Kernel traffic through the data plane: two network namespaces, each
//! joined by a veth pair to a DPDK net_af_packet port; a worker wires the
//! two ports together, and ping must cross it both ways. Needs root (it
//! creates namespaces); everything it creates is removed on exit.
#![cfg(feature = "dpdk")]

mod common;

use std::process::Command;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A namespace with one end of a veth pair inside; the other end, named
/// `host_if`, stays here for DPDK. Removed on drop.
struct Host {
    ns: String,
    host_if: String,
}

impl Host {
    fn new(tag: &str, addr: &str) -> Host {
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
    fn ping(&self, to: &str) -> bool {
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

#[test]
fn ping_crosses_the_worker_between_two_namespaces() {
    let a = Host::new("a", "10.201.0.1/24");
    let b = Host::new("b", "10.201.0.2/24");
    let rig = common::rig(
        "veth",
        vec![
            format!("net_af_packet0,iface={}", a.host_if),
            format!("net_af_packet1,iface={}", b.host_if),
        ],
    );
    let mut w = common::worker(&rig, &[(0, 1), (1, 0)]);

    // Without the worker the namespaces share no link at all; with it:
    assert!(a.ping("10.201.0.2"), "a cannot ping b through the worker");
    assert!(b.ping("10.201.0.1"), "b cannot ping a through the worker");
    w.stop();
    let t = w.totals();
    assert!(t.rx_packets[0] >= 6 && t.rx_packets[1] >= 6, "{t:?}");
    assert!(t.tx_packets[0] >= 6 && t.tx_packets[1] >= 6, "{t:?}");

    // Stopped workers forward nothing.
    assert!(
        !a.ping("10.201.0.2"),
        "traffic crossed with the workers stopped"
    );
    drop(w);
    let pool = rig.pool.clone();
    drop(rig);
    assert_eq!(pool.in_use(), 0, "every mbuf went back to the pool");
}

//! Kernel traffic through the data plane: two network namespaces, each
//! joined by a veth pair to a DPDK net_af_packet port; a worker wires the
//! two ports together, and ping must cross it both ways. Needs root (it
//! creates namespaces); everything it creates is removed on exit.
#![cfg(feature = "dpdk")]

mod common;
mod host;

use host::Host;

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

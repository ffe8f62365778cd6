//! Stopping the workers while traffic flows: net_pcap replays a capture
//! forever (`infinite_rx`) into port 0, the worker forwards it to net_null
//! on port 1 (whose generated packets it drops); the stop comes mid-stream. The worker stops within its bound,
//! every received packet is accounted for (sent or counted as dropped),
//! and once the ports close every mbuf is back in the pool.
#![cfg(feature = "dpdk")]

mod common;

use std::time::{Duration, Instant};

use dpu_dataplane::io::Driver;

#[test]
fn stopping_mid_stream_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let frames: Vec<Vec<u8>> = (0..64u8)
        .map(|i| {
            let mut f = vec![i; 60 + usize::from(i) * 11];
            f[..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2]);
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f
        })
        .collect();
    let input = dir.path().join("in.pcap");
    common::write_pcap(&input, &frames);
    let rig = common::rig(
        "midstream",
        vec![
            format!("net_pcap0,rx_pcap={},infinite_rx=1", input.display()),
            "net_null1".to_string(),
        ],
    );
    // Before any worker runs, net_pcap already holds the capture in mbufs.
    let held_by_port = rig.pool.in_use();
    let mut w = common::worker(&rig, &[(0, 1)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.totals().tx_packets[1] < 50_000 {
        assert!(Instant::now() < deadline, "forwarded only {:?}", w.totals());
        std::thread::sleep(Duration::from_millis(5));
    }
    let asked = Instant::now();
    w.stop();
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the worker took {took:?} to stop"
    );
    let t = w.totals();
    assert!(t.tx_packets[1] >= 50_000);
    assert_eq!(
        // net_null also receives (generated packets, which the
        // cross-connect does not map and drops).
        t.rx_packets.iter().sum::<u64>(),
        t.tx_packets.iter().sum::<u64>() + t.drops.iter().sum::<u64>(),
        "every received packet was sent or counted as dropped: {t:?}"
    );
    assert_eq!(
        rig.driver.stats(1).tx_packets,
        t.tx_packets[1],
        "the port agrees"
    );
    drop(w);
    // With the workers gone, only the port's own replay buffers are out.
    assert_eq!(
        rig.pool.in_use(),
        held_by_port,
        "a stopped worker holds no mbuf"
    );
    let pool = rig.pool.clone();
    drop(rig);
    assert_eq!(pool.in_use(), 0, "every mbuf went back to the pool");
}

//! Golden test through real DPDK: packets read by net_pcap on port 0 are
//! forwarded by a worker (cross-connect 0 -> 1) and written by net_pcap on
//! port 1; the output capture must equal the input, packet for packet.
#![cfg(feature = "dpdk")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use dpu_dataplane::io::Driver;

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).unwrap();
    assert!(b.len() >= 24, "{} is not a capture", path.display());
    // Microsecond (a1b2c3d4) or nanosecond (a1b23c4d) captures, either byte order.
    let magic = u32::from_le_bytes(b[..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("{}: unknown pcap magic {m:#x}", path.display()),
    };
    let u32_at = |o: usize| {
        let a: [u8; 4] = b[o..o + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let mut out = Vec::new();
    let mut o = 24;
    while o + 16 <= b.len() {
        let incl = u32_at(o + 8) as usize;
        out.push(b[o + 16..o + 16 + incl].to_vec());
        o += 16 + incl;
    }
    out
}

/// Ethernet frames of varied sizes and contents.
fn frames() -> Vec<Vec<u8>> {
    (0..500u32)
        .map(|i| {
            let len = 60 + (i as usize * 7) % 1400;
            let mut f = vec![0u8; len];
            f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
            f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            for (j, b) in f[14..].iter_mut().enumerate() {
                *b = (i as usize + j) as u8;
            }
            f
        })
        .collect()
}

#[test]
fn pcap_in_equals_pcap_out_and_nothing_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = frames();
    common::write_pcap(&d.join("in.pcap"), &input);
    common::write_pcap(&d.join("empty.pcap"), &[]);
    let vdev = |n: u32, rx: &str, tx: &str| {
        format!(
            "net_pcap{n},rx_pcap={},tx_pcap={}",
            d.join(rx).display(),
            d.join(tx).display()
        )
    };
    let rig = common::rig(
        "golden",
        vec![
            vdev(0, "in.pcap", "discard.pcap"),
            vdev(1, "empty.pcap", "out.pcap"),
        ],
    );
    let mut w = common::worker(&rig, &[(0, 1)]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.totals().tx_packets[1] < input.len() as u64 {
        assert!(Instant::now() < deadline, "forwarded only {:?}", w.totals());
        std::thread::sleep(Duration::from_millis(5));
    }
    w.stop();
    let t = w.totals();
    assert_eq!(t.rx_packets[0], input.len() as u64);
    assert_eq!(t.tx_packets[1], input.len() as u64);
    assert_eq!(
        t.rx_bytes[0],
        input.iter().map(|p| p.len() as u64).sum::<u64>()
    );
    assert_eq!(
        rig.driver.stats(1).tx_packets,
        input.len() as u64,
        "the port agrees"
    );
    drop(w);
    let pool = rig.pool.clone();
    drop(rig); // closes the ports: net_pcap flushes out.pcap
    assert_eq!(pool.in_use(), 0, "every mbuf went back to the pool");
    let output = read_pcap(&d.join("out.pcap"));
    assert_eq!(output.len(), input.len());
    assert!(output == input, "output capture differs from the input");
}

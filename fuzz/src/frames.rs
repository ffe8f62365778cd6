//! Fuzzes an endpoint's whole frame path: arbitrary Ethernet frames, and a
//! real host stack whose connections carry arbitrary bytes as NVMe/TCP,
//! whose frames are corrupted, dropped or reordered, with time jumping
//! ahead. smoltcp skips checksums under `cfg(fuzzing)`, so crafted frames
//! reach TCP. The endpoint must never panic, and never hold more
//! connections or socket buffers than its limits. Run with
//! `fuzz/run.sh frames` from the repository root.
//!
//! Input: one byte choosing the family (odd: an IPv6 endpoint and host,
//! with neighbour discovery; even: IPv4) and the listener's secure
//! channel (its next two bits: none, TLS allowed, TLS required; a key is
//! set for the harness's host, so bytes that start with a TLS record go
//! through the handshake), then a sequence of operations, one byte each
//! followed by its argument bytes (see `run`).

use std::time::Duration;

#[path = "../../dpu-service/endpoint/src/testing.rs"]
#[allow(dead_code)]
mod testing;

use dpu_endpoint::EndpointConfig;
use dpu_nvmeof::dpu_tls::ConfiguredPsk;
use dpu_nvmeof::SecureChannel;
use testing::{config, config6, target, target_at, Chaos, Pair, EP_IP, EP_IP6, HOSTNQN, NQN, PORT};

const MAX_CONNECTIONS: usize = 4;

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Some((&family, data)) = data.split_first() else {
        return;
    };
    let v6 = family & 1 == 1;
    let cfg = EndpointConfig {
        rx_buffer: 32 << 10,
        tx_buffer: 32 << 10,
        buffer_budget: 8 * (64 << 10),
        max_connections: MAX_CONNECTIONS,
        max_connections_per_address: 3,
        backlog: 2,
        write_timeout: Duration::from_secs(1),
        ..if v6 { config6(1500) } else { config(1500) }
    };
    let budget = cfg.buffer_budget;
    let (target, ep) = if v6 {
        (target_at(1 << 20, EP_IP6.into()), EP_IP6.into())
    } else {
        (target(1 << 20), EP_IP.into())
    };
    let channel = match family >> 1 & 3 {
        1 => SecureChannel::Allowed,
        2 => SecureChannel::Required,
        _ => SecureChannel::None,
    };
    target.set_secure_channel(std::net::SocketAddr::new(ep, PORT), channel);
    if let Ok(key) = ConfiguredPsk::new(&[0x5a; 32], None) {
        target.set_tls_key(NQN, HOSTNQN, Some(key));
    }
    let mut p = Pair::new(cfg, target);
    let mut hosts = Vec::new();
    let mut next_port = 40000u16;
    let mut it = data;
    let take = |n: usize, it: &mut &[u8]| -> Vec<u8> {
        let n = n.min(it.len());
        let (a, b) = it.split_at(n);
        *it = b;
        a.to_vec()
    };
    while let Some((&op, rest)) = it.split_first() {
        it = rest;
        let arg = take(1, &mut it).first().copied().unwrap_or(0);
        match op % 7 {
            // A raw frame to the endpoint.
            0 => {
                let frame = take(usize::from(arg) * 8, &mut it);
                p.ep.receive(&frame, p.now);
            }
            // Bytes on a host connection: NVMe/TCP PDUs or not.
            1 => {
                let bytes = take(usize::from(arg) * 4, &mut it);
                if let Some(&h) = hosts.get(usize::from(arg) % hosts.len().max(1)) {
                    let _ = p.socket(h).send_slice(&bytes);
                }
            }
            // Rounds of both stacks, the host reading what came.
            2 => {
                for _ in 0..=arg % 16 {
                    p.step();
                    for &h in &hosts {
                        let s = p.socket(h);
                        while s.can_recv() {
                            let _ = s.recv(|b| (b.len(), ()));
                        }
                    }
                }
            }
            // The host's next frames, one byte of them flipped.
            3 => {
                let t = smoltcp::time::Instant::from_micros(0);
                p.host.poll(t, &mut p.dev, &mut p.sockets);
                let mut frames = std::mem::take(&mut p.dev.tx);
                if let Some(f) = frames.first_mut() {
                    if !f.is_empty() {
                        let i = usize::from(arg) * 7 % f.len();
                        f[i] ^= arg | 1;
                    }
                }
                for f in frames {
                    p.ep.receive(&f, p.now);
                }
            }
            // A new host connection, or one aborted.
            4 => {
                if arg & 1 == 0 && hosts.len() < 8 {
                    hosts.push(p.open(next_port, 64 << 10));
                    next_port = next_port.wrapping_add(1).max(1024);
                } else if !hosts.is_empty() {
                    let h = hosts.swap_remove(usize::from(arg) % hosts.len());
                    p.socket(h).abort();
                }
            }
            // Loss and reordering from now on.
            5 => {
                p.to_ep = Chaos::new(u64::from(arg & 0x0f) * 20, u64::from(arg >> 4) * 40, 3);
                p.to_host = Chaos::new(u64::from(arg & 0x0f) * 20, u64::from(arg >> 4) * 40, 5);
            }
            // Time jumps ahead (timers: retransmission, PDU, write).
            _ => {
                p.now += Duration::from_millis(u64::from(arg) * 20);
                p.step();
            }
        }
        assert!(p.ep.open_connections() <= MAX_CONNECTIONS);
        assert!(p.ep.buffer_bytes() <= budget);
    }
    for _ in 0..8 {
        p.step();
    }
    assert!(p.ep.open_connections() <= MAX_CONNECTIONS);
}

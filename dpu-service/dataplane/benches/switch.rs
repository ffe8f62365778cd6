//! The switch pipeline alone, no packet I/O: one worker's `process` on
//! 64-byte UDP/IPv4 frames of 65,536 flows through a tenant with `--rules`
//! stateless rules (the last one matches), counters included; with
//! `--stateful` the matching rule is stateful, so after the first 65,536
//! packets every packet is a connection-table hit (`--conntrack-max N`
//! sizes the table, default the service's; `--flow-cache N` puts an
//! N-entry flow cache in front; `--rules 0`: no rules, the tenant's default
//! policy allows; `--fragments`: every datagram comes in two fragments,
//! the first one classified and recorded in the fragment table, the
//! second passing on that record). Frames go through `process_burst` in bursts
//! of 32, as a worker hands them over; `--single` passes them one by one
//! to `process` instead. Prints
//! nanoseconds and millions of packets per second on one core; under
//! `valgrind --tool=callgrind` the instruction count per packet is a
//! load-independent figure for comparing builds.
//!
//! ```text
//! cargo bench -p dpu-dataplane --bench switch -- --rules 1000 --packets 20000000
//! cargo bench -p dpu-dataplane --bench switch -- --rules 1000 --stateful
//! cargo bench -p dpu-dataplane --bench switch -- --rules 1000 --fragments
//! ```

use std::hint::black_box;
use std::time::Instant;

use dpu_dataplane::classify::{AclRule, Family};
use dpu_dataplane::io::memory::MemPacket;
use dpu_dataplane::switch::{Attach, SwitchConfig, SwitchHandle, SwitchRule, TenantConfig};
use dpu_dataplane::worker::{Pipeline, Verdict, BURST};

/// A 64-byte Ethernet/IPv4/UDP frame from 10.x.y.z:`sport` to 10.1.0.1:53.
fn frame(flow: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&50u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&(0x0a00_0000 | (flow & 0x00ff_ffff)).to_be_bytes());
    ip[16..20].copy_from_slice(&0x0a01_0001u32.to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&(1024 + (flow >> 8) as u16).to_be_bytes());
    udp[2..4].copy_from_slice(&53u16.to_be_bytes());
    udp[4..6].copy_from_slice(&30u16.to_be_bytes());
    f
}

/// Frame `flow` of the `--fragments` traffic: for even `flow`, the first
/// fragment of datagram `flow / 2` (as [`frame`] with MF set); for odd,
/// its second and last fragment (30 bytes at offset 24, no header).
fn fragment(flow: u32) -> Vec<u8> {
    let datagram = flow / 2;
    let mut f = frame(datagram);
    f[18..20].copy_from_slice(&(datagram as u16).to_be_bytes());
    let first = flow.is_multiple_of(2);
    let field: u16 = if first { 0x2000 } else { 3 };
    f[20..22].copy_from_slice(&field.to_be_bytes());
    if !first {
        f[34..42].fill(0);
    }
    f
}

fn main() {
    let mut rules = 1000usize;
    let mut packets = 20_000_000u64;
    let mut stateful = false;
    let mut single = false;
    let mut fragments = false;
    let mut flow_cache_entries = SwitchConfig::default().flow_cache_entries;
    let mut conntrack_max = SwitchConfig::default().conntrack_max;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rules" => rules = args.next().and_then(|v| v.parse().ok()).expect("--rules N"),
            "--packets" => {
                packets = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--packets N")
            }
            "--stateful" => stateful = true,
            "--single" => single = true,
            "--fragments" => fragments = true,
            "--flow-cache" => {
                flow_cache_entries = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--flow-cache N")
            }
            "--conntrack-max" => {
                conntrack_max = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--conntrack-max N")
            }
            _ => {}
        }
    }
    // Rules that match nothing of the traffic (other sources), then one
    // allowing it: every packet walks the classifier to its last rule.
    let mut list: Vec<SwitchRule> = (0..rules.saturating_sub(1))
        .map(|i| {
            let mut m = AclRule::any(i as u32, 0, Family::V4);
            m.src = AclRule::prefix_range(u128::from(0xc0a8_0000u32 | i as u32), 32, 32);
            m.dst_port = (80, 80);
            SwitchRule {
                id: format!("r{i}"),
                matches: m,
                allow: false,
                stateful: false,
                rate_limit: None,
            }
        })
        .collect();
    // With no rules at all the tenant's default policy passes everything.
    if rules > 0 {
        let mut last = AclRule::any(rules as u32, 0, Family::V4);
        last.dst_port = (53, 53);
        list.push(SwitchRule {
            id: "dns".into(),
            matches: last,
            allow: true,
            stateful,
            rate_limit: None,
        });
    }
    let h = SwitchHandle::new(&SwitchConfig {
        ports: 2,
        tenants: vec![TenantConfig {
            name: "bench".into(),
            attachments: vec![Attach::port(0, 0), Attach::port(1, 0)],
            default_allow: rules == 0,
            rules: list.into(),
            ..TenantConfig::default()
        }],
        conntrack_max,
        // A tenant's share at most the whole (the switch refuses more).
        conntrack_per_tenant: conntrack_max.min(SwitchConfig::default().conntrack_per_tenant),
        flow_cache_entries,
        // Every datagram of the traffic fits.
        fragments_per_tenant: SwitchConfig::default().fragments_max,
        ..SwitchConfig::default()
    })
    .expect("configuration compiles");
    let mut p = h.pipeline();
    let make = if fragments { fragment } else { frame };
    let mut frames: Vec<MemPacket> = (0..65_536).map(|f| MemPacket(make(f))).collect();
    let mut flood = Vec::new();
    p.turn();
    if fragments {
        // Every fragment passes: the first ones recorded, before the
        // clock starts.
        for f in &mut frames {
            let v = p.process(0, &mut f.0, &mut flood);
            assert!(!matches!(v, Verdict::Drop(_)), "{v:?}");
            flood.clear();
        }
    }
    if stateful {
        // Open every flow's connection before the clock starts.
        for f in &mut frames {
            black_box(p.process(0, &mut f.0, &mut flood));
            flood.clear();
        }
    }
    let mut burst = Vec::with_capacity(BURST);
    let packets = packets - packets % BURST as u64;
    let start = Instant::now();
    if single {
        for i in 0..packets {
            if i % BURST as u64 == 0 {
                p.turn();
            }
            let f = &mut frames[(i as usize) & 0xffff];
            black_box(p.process(0, &mut f.0, &mut flood));
            flood.clear();
        }
    } else {
        for b in 0..packets / BURST as u64 {
            p.turn();
            let first = (b as usize * BURST) & 0xffff;
            burst.extend(frames[first..first + BURST].iter_mut().map(std::mem::take));
            let mut back = frames[first..].iter_mut();
            p.process_burst(0, &mut burst, &mut flood, |pkt, v, _| {
                black_box(v);
                if let Some(slot) = back.next() {
                    *slot = pkt;
                }
            });
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let t = Instant::now();
    let counters = h.traffic();
    let read_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "switch pipeline, {rules} rules{}{}, {packets} packets: {:.1} ns/packet, {:.2} Mpps",
        if stateful { " (stateful)" } else { "" },
        if fragments { " (fragments)" } else { "" },
        secs * 1e9 / packets as f64,
        packets as f64 / secs / 1e6
    );
    println!(
        "counters of {} rules read in {read_ms:.2} ms",
        counters.rules.len()
    );
}

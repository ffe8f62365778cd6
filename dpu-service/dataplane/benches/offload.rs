//! Flow offload against none, side by side in one run: one worker's
//! switch pipeline (no packet I/O: frames handed to `process_burst` in
//! bursts of 32, as a worker hands them over) on `--flows` TCP
//! connections between two stations of a tenant whose rule allows them
//! statefully, first with no flow hardware, then with the model NIC in
//! front (the same code the daemon runs with `provider = "model"`).
//!
//! Two phases, each timed on its own:
//! - **setup**: every connection's handshake and first segment each way
//!   (SYN, SYN+ACK, ACK, ACK back), interleaved across connections: new
//!   connections a second through the worker, offers to the offload
//!   thread included;
//! - **steady**: `--packets` data segments round-robin over the
//!   connections, both directions, once every flow is in the model.
//!
//! For the steady phase it prints the nanoseconds per packet of the whole
//! burst call (with offload, that is the model's lookup, which a
//! BlueField's eSwitch does in hardware), and how many packets reached the
//! switch's own stages (its tenant counters): the worker's work per
//! delivered packet with hardware in front is the switch's cost per
//! packet it still sees, times the share it sees.
//!
//! ```text
//! cargo bench -p dpu-dataplane --bench offload -- --flows 4096 --packets 10000000
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use dpu_dataplane::io::memory::MemPacket;
use dpu_dataplane::offload::model::{ModelLimits, ModelNic};
use dpu_dataplane::offload::{
    FlowCounts, FlowId, FlowRule, OffloadConfig, OffloadLink, Offloader, Provider, Refusal,
};
use dpu_dataplane::switch::{Attach, SwitchHandle, SwitchPipeline};
use dpu_dataplane::worker::{Pipeline, BURST};

#[path = "common/web.rs"]
mod web;
use web::{tcp_frame, web_switch, ACK, PSH_ACK, SYN, SYN_ACK};

/// A 64-byte TCP/IPv4 frame of connection `flow`: from the client
/// (10.0.0.1, or 10.0.0.3 for the warm-up's, MAC :01, port 0) to the
/// server (10.0.0.2:80, MAC :02, port 1), or back.
fn frame(flow: u32, back: bool, flags: u8) -> Vec<u8> {
    frame_from(0x0a00_0001, flow, back, flags)
}

fn frame_from(client: u32, flow: u32, back: bool, flags: u8) -> Vec<u8> {
    tcp_frame(client, flow, back, flags, None)
}

fn handle(flows: usize) -> SwitchHandle {
    web_switch(2, vec![Attach::port(0, 0), Attach::port(1, 0)], flows)
}

/// Runs `frames` (input port, frame) through `p` in bursts of one port's
/// frames; returns the seconds it took.
fn run(p: &mut SwitchPipeline, frames: &mut [(usize, MemPacket)]) -> f64 {
    let mut flood = Vec::new();
    let mut burst = Vec::with_capacity(BURST);
    let start = Instant::now();
    for chunk in frames.chunks_mut(BURST) {
        p.turn();
        let port = chunk[0].0;
        burst.extend(chunk.iter_mut().map(|(_, f)| std::mem::take(f)));
        let mut back = chunk.iter_mut();
        p.process_burst(port, &mut burst, &mut flood, |pkt, v, _| {
            black_box(v);
            if let Some((_, slot)) = back.next() {
                *slot = pkt;
            }
        });
    }
    start.elapsed().as_secs_f64()
}

#[derive(Default)]
struct Figures {
    setup_secs: f64,
    steady_secs: f64,
    steady_packets: u64,
    switched: u64,
    offloaded: u64,
}

/// What runs in front of the switch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No offload.
    Off,
    /// The switch offers flows to the offload thread, whose hardware
    /// takes them and carries nothing: the worker's own cost of
    /// offloading, as on a BlueField, where the lookup is the eSwitch's.
    OffersOnly,
    /// The model NIC in front of the switch, on the worker's thread.
    Model,
}

/// Hardware that takes every rule and carries nothing: the offload
/// thread's side of offering, without the model's lanes.
struct Accepting(std::collections::HashSet<FlowId>);

impl Provider for Accepting {
    fn name(&self) -> &'static str {
        "accepting"
    }
    fn capacity(&self) -> usize {
        usize::MAX
    }
    fn insert(&mut self, id: FlowId, _: &FlowRule) -> Result<(), Refusal> {
        self.0.insert(id);
        Ok(())
    }
    fn remove(&mut self, id: FlowId) -> Result<(), String> {
        self.0.remove(&id);
        Ok(())
    }
    fn counts(&mut self, id: FlowId) -> Option<FlowCounts> {
        self.0.contains(&id).then(FlowCounts::default)
    }
    fn aged(&mut self, _: Instant, _: &mut Vec<FlowId>) {}
}

/// Rounds of the setup phase, each with connections from a client of its
/// own; one more before them, untimed, warms the tables.
const SETUP_ROUNDS: usize = 4;

fn measure(flows: usize, packets: u64, mode: Mode) -> Figures {
    // Room for every connection and flow of every round.
    let all = flows * (SETUP_ROUNDS + 2);
    let h = handle(all);
    let config = OffloadConfig {
        table: all * 2,
        per_tenant: all * 2,
        reserved: 0,
        insert_rate: u32::MAX,
        lane_queue: 65_536,
        poll: Duration::from_millis(200),
    };
    let idle = Duration::from_secs(600);
    let offloader = match mode {
        Mode::Off => None,
        Mode::OffersOnly => {
            let (o, lanes) =
                Offloader::start(Accepting(Default::default()), config, 1).expect("offload thread");
            h.attach_offload(OffloadLink::each(lanes, None, idle, 0));
            Some(o)
        }
        Mode::Model => {
            let limits = ModelLimits {
                table: all * 2,
                ..ModelLimits::default()
            };
            let (nic, models) = ModelNic::new(limits, 1);
            let (o, lanes) = Offloader::start(nic, config, 1).expect("offload thread");
            h.attach_offload(OffloadLink::each(lanes, Some(models), idle, 0));
            Some(o)
        }
    };
    let mut p = h.pipeline();
    p.turn();
    // Setup: each step for every flow before the next step, in bursts;
    // once untimed from another client, so that the tables' memory is
    // touched (and the offload thread's work done) before the clock runs.
    let handshakes = |client: u32| {
        let mut setup: Vec<(usize, MemPacket)> = Vec::with_capacity(flows * 4);
        for (back, flags) in [(false, SYN), (true, SYN_ACK), (false, ACK), (true, ACK)] {
            let port = usize::from(back);
            setup.extend(
                (0..flows as u32).map(|f| (port, MemPacket(frame_from(client, f, back, flags)))),
            );
        }
        setup
    };
    let settle = |p: &mut SwitchPipeline, rounds: usize| {
        if let Some(o) = &offloader {
            let end = Instant::now() + Duration::from_secs(60);
            while o.status().offloaded < (flows * 2 * rounds) as u64 && Instant::now() < end {
                p.turn();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    };
    run(&mut p, &mut handshakes(0x0a01_0000));
    settle(&mut p, 1);
    let mut setup_secs = 0.0;
    for r in 1..=SETUP_ROUNDS {
        let mut frames = handshakes(0x0a01_0000 + r as u32);
        setup_secs += run(&mut p, &mut frames);
        settle(&mut p, r + 1);
    }
    // The steady phase's connections.
    run(&mut p, &mut handshakes(0x0a00_0001));
    settle(&mut p, SETUP_ROUNDS + 2);
    if let Some(o) = offloader.as_ref().filter(|_| mode == Mode::Model) {
        // Until every direction is in the model (the worker turning).
        let end = Instant::now() + Duration::from_secs(60);
        while o.status().in_use < all * 2 && Instant::now() < end {
            p.turn();
            std::thread::sleep(Duration::from_micros(200));
        }
        for _ in 0..100 {
            p.turn();
        }
        assert_eq!(o.status().in_use, all * 2, "{:?}", o.status());
    }
    let before = h.traffic().tenants["bench"].rx_packets;
    // Steady: bursts of one direction, round-robin over the flows.
    let mut steady: Vec<(usize, MemPacket)> = (0..flows as u32 * 2)
        .flat_map(|i| {
            let back = (i / BURST as u32) % 2 == 1;
            let f = i % flows as u32;
            Some((usize::from(back), MemPacket(frame(f, back, PSH_ACK))))
        })
        .collect();
    let rounds = (packets / steady.len() as u64).max(1);
    let mut steady_secs = 0.0;
    for _ in 0..rounds {
        steady_secs += run(&mut p, &mut steady);
    }
    let steady_packets = rounds * steady.len() as u64;
    let switched = h.traffic().tenants["bench"].rx_packets - before;
    let offloaded = offloader
        .as_ref()
        .filter(|_| mode == Mode::Model)
        .map_or(0, |o| {
            // The model's counters are read every poll.
            std::thread::sleep(Duration::from_millis(500));
            o.status().tenants.iter().map(|t| t.carried.packets).sum()
        });
    Figures {
        setup_secs,
        steady_secs,
        steady_packets,
        switched,
        offloaded,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut flows = 4096usize;
    let mut packets = 10_000_000u64;
    let mut runs = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} N"))
        };
        match a.as_str() {
            "--flows" => flows = num("--flows") as usize,
            "--packets" => packets = num("--packets"),
            "--runs" => runs = num("--runs").max(1) as usize,
            _ => {}
        }
    }
    // The three modes in turn, `runs` times: medians of each figure.
    let mut all: [Vec<Figures>; 3] = Default::default();
    for _ in 0..runs {
        for (i, mode) in [Mode::Off, Mode::OffersOnly, Mode::Model]
            .into_iter()
            .enumerate()
        {
            all[i].push(measure(flows, packets, mode));
        }
    }
    let setup = |i: usize| {
        median(
            all[i]
                .iter()
                .map(|f| (flows * SETUP_ROUNDS) as f64 / f.setup_secs)
                .collect(),
        )
    };
    let ns = |i: usize| {
        median(
            all[i]
                .iter()
                .map(|f| f.steady_secs * 1e9 / f.steady_packets as f64)
                .collect(),
        )
    };
    let (off, model) = (&all[0][0], &all[2][0]);
    println!(
        "flows {flows}, {} setup rounds, steady packets {}, medians of {runs} runs",
        SETUP_ROUNDS, off.steady_packets
    );
    println!(
        "setup: {:.0} connections/s without offload; {:.0} offering them: {:.2}x; \
         {:.0} with the model in front too: {:.2}x",
        setup(0),
        setup(1),
        setup(1) / setup(0),
        setup(2),
        setup(2) / setup(0)
    );
    println!(
        "steady, without offload: {:.1} ns/packet, {} of {} packets through the switch",
        ns(0),
        off.switched,
        off.steady_packets
    );
    println!(
        "steady, with the model: {:.1} ns/packet in the model (hardware on a BlueField), \
         {} packets through the switch, {} carried by the model",
        ns(2),
        model.switched,
        model.offloaded
    );
    // The worker's work per delivered packet with hardware in front: the
    // switch's cost per packet, for the share of packets it still sees.
    let worker = ns(0) * model.switched as f64 / model.steady_packets as f64;
    println!(
        "worker per delivered packet: {:.1} ns without offload, {:.3} ns with the model in front",
        ns(0),
        worker
    );
}

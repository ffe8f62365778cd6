//! The isolation property of the switch (see `world.rs`): random
//! multi-tenant configurations, each compiled once, with many random
//! frames pushed through each, none of which may cross a tenant boundary,
//! leave a guarded attachment with a spoofed source, come in from an
//! unconfigured VTEP, or make a tenant forget a station because of what
//! another tenant sent.
//!
//! `ISOLATION_WORLDS` (configurations, default 32), `ISOLATION_FRAMES`
//! (frames per configuration, default 30,000) and `ISOLATION_SEED` (the
//! first configuration's seed, default 1) set the size of a run; a long
//! run is e.g. `ISOLATION_WORLDS=500 ISOLATION_FRAMES=20000 cargo test
//! --release -p dpu-dataplane --test isolation -- --nocapture`.

mod world;

use dpu_dataplane::switch::SwitchHandle;
use world::{Draw, Rng, Stats, World};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `worlds` random worlds from `ISOLATION_SEED` (default 1), each
/// compiled into a switch that `run` pushes its frames through; returns
/// the summed statistics and one line per world with violations.
fn each_world(
    worlds: u64,
    mut run: impl FnMut(&mut World, &mut Draw<Rng>, &SwitchHandle),
) -> (Stats, Vec<String>) {
    let seed = env("ISOLATION_SEED", 1);
    let mut total = Stats::default();
    let mut failures = Vec::new();
    for s in seed..seed + worlds {
        let mut rng = Rng::new(s);
        let mut d = Draw::new(&mut rng);
        let mut w = World::random(&mut d);
        let handle = match SwitchHandle::new(&w.cfg) {
            Ok(h) => h,
            Err(e) => panic!("seed {s}: the generated configuration does not compile: {e}"),
        };
        run(&mut w, &mut d, &handle);
        total += w.stats;
        if !w.violations.is_empty() {
            failures.push(format!(
                "seed {s}: {} violations, first: {}",
                w.stats.violations,
                w.violations.join("\n  ")
            ));
        }
    }
    (total, failures)
}

#[test]
fn no_frame_crosses_a_tenant_boundary() {
    let configs = env("ISOLATION_WORLDS", 32);
    let frames = env("ISOLATION_FRAMES", 30_000);
    let (total, failures) = each_world(configs, |w, d, handle| {
        w.run(&mut handle.pipeline(), d, frames);
    });
    println!(
        "isolation: {configs} configurations, {} frames ({} forwarded, {} flooded, {} dropped; \
         {} in VXLAN, {} with stacked tags or encapsulation, {} fragments, {} station probes), \
         {} violations",
        total.frames,
        total.forwarded,
        total.flooded,
        total.dropped,
        total.vxlan,
        total.stacked,
        total.fragments,
        total.probes,
        total.violations
    );
    assert!(
        total.forwarded > total.frames / 10 && total.flooded > 0 && total.probes > 0,
        "the stream hardly reached anyone: {total:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same property with flow hardware in front of the switch: the model
/// NIC, every stateless verdict offered at its flow's first packet and
/// established connections at their first segment after the handshake,
/// so that many frames are decided by hardware rules the switch made.
/// `ISOLATION_OFFLOAD_WORLDS` (default 4) configurations.
#[test]
fn no_frame_crosses_a_tenant_boundary_with_flow_hardware_in_front() {
    use dpu_dataplane::offload::model::{ModelLimits, ModelNic};
    use dpu_dataplane::offload::{OffloadConfig, OffloadLink, Offloader};
    use std::time::Duration;

    let worlds = env("ISOLATION_OFFLOAD_WORLDS", 4);
    let frames = env("ISOLATION_FRAMES", 30_000);
    let (mut carried, mut dropped, mut offloaded) = (0, 0, 0);
    let (_, failures) = each_world(worlds, |w, d, handle| {
        let (nic, models) = ModelNic::new(ModelLimits::default(), 1);
        let cfg = OffloadConfig {
            insert_rate: u32::MAX,
            poll: Duration::from_millis(5),
            ..OffloadConfig::default()
        };
        let (o, lanes) = Offloader::start(nic, cfg, 1).expect("offload thread");
        handle.attach_offload(OffloadLink::each(
            lanes,
            Some(models),
            Duration::from_secs(600),
            1,
        ));
        w.run_bursts(&mut handle.pipeline(), d, frames);
        // What the model did, once the counters were read.
        std::thread::sleep(Duration::from_millis(20));
        let st = o.status();
        offloaded += st.offloaded;
        for t in &st.tenants {
            carried += t.carried.packets;
            dropped += t.dropped.packets;
        }
        o.stop();
    });
    println!(
        "isolation with offload: {worlds} configurations, {offloaded} flows offloaded, \
         {carried} frames carried and {dropped} dropped by the model"
    );
    assert!(
        carried + dropped > 0 && offloaded > 0,
        "the model decided no frame: the test says nothing"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

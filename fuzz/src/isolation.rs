//! Fuzzes the isolation property of the switch (see
//! `dpu-service/dataplane/tests/isolation/world.rs`): the first eight
//! bytes seed a random multi-tenant configuration, the rest choose the
//! frames pushed through it (VXLAN from any underlay source, stacked
//! tags, fragments, spoofed and flooded source addresses). No frame may reach another tenant,
//! leave a guarded attachment with a spoofed source, come in from an
//! unconfigured VTEP, or make a tenant forget a station because of what
//! another tenant sent.
//!
//! Run with `fuzz/run.sh isolation` from the repository root.

#[path = "../../dpu-service/dataplane/tests/isolation/world.rs"]
mod world;

use dpu_dataplane::switch::SwitchHandle;
use world::{Bytes, Draw, Rng, World, FLOOD_FIRST};

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Some((seed, frames)) = data.split_first_chunk::<8>() else {
        return;
    };
    let mut rng = Rng::new(u64::from_le_bytes(*seed));
    let mut world = World::random(&mut Draw::new(&mut rng));
    let handle = SwitchHandle::new(&world.cfg).expect("generated configurations compile");
    let mut p = handle.pipeline();
    // Fuzzed inputs are short: skip the flood-first phase so that the
    // quiet tenant's stations speak from the start.
    world.stats.frames = FLOOD_FIRST;
    let mut bytes = Bytes(frames);
    world.run(&mut p, &mut Draw::new(&mut bytes), u64::MAX);
    assert!(
        world.violations.is_empty(),
        "{} violations:\n{}",
        world.stats.violations,
        world.violations.join("\n")
    );
}

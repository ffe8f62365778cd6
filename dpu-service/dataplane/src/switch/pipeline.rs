//! [`SwitchPipeline`], one worker's switch: its state, its turn (picking
//! up a new snapshot, clocks, ageing) and the burst loop that runs the
//! stages of [`inspect`](super::inspect), [`recall`](super::recall),
//! [`filter`](super::filter) and [`decide`](super::decide) over a burst,
//! classifying the keys of the frames that need rules together.

use std::sync::atomic::Ordering;

use crate::classify::Classifier;
use crate::conntrack::ConnKey;
use crate::io::Packet;
use crate::wire::{FlowKey, L3};
use crate::worker::{Egress, Pipeline, Verdict, BURST};
use dpu_os::cache::prefetch;

use super::frame::{Inspected, Seen};
use super::state::SwitchPipeline;

/// Connection slots a worker looks at per turn for expired connections.
const SWEEP_SLOTS: usize = 32;

impl SwitchPipeline {
    /// Stores this worker's connection counts in its shard's gauges.
    pub(super) fn store_gauges(&self) {
        let shard = &self.compiled.shards[self.shard];
        for (t, cells) in self.compiled.tenants.iter().zip(shard.tenants.iter()) {
            let n = u64::from(self.conns.tenant_len(t.uid));
            if cells.conntrack.load(Ordering::Relaxed) != n {
                cells.conntrack.store(n, Ordering::Relaxed);
            }
        }
    }

    /// What frame `x` needs before its turn: its tenant's rules for its
    /// key, unless the tenant has none or the connection table alone will
    /// decide it (a live connection checked against the current rules).
    /// `conn` is the frame's [`SwitchPipeline::conn_key`].
    fn need(&self, x: &Inspected, conn: Option<&ConnKey>) -> Need {
        let Seen::Switch {
            ti,
            l3: L3::Ip {
                later_fragment: false,
                ..
            },
            ..
        } = x.seen
        else {
            // A later fragment is decided by its datagram's first.
            return Need::Ready(None);
        };
        let t = &self.compiled.tenants[ti as usize];
        if t.order.is_empty() {
            // No rules: no rule matches.
            return Need::Ready(Some(None));
        }
        if let Some(ck) = conn {
            if self.conns.is_current(ck, self.now, self.generation) {
                return Need::Ready(None);
            }
        }
        Need::Rules(ti)
    }

    /// Classifies, ahead of the frames' turns, the keys of the frames of
    /// `seen` that their tenants' rules must decide, listed in `todo` as
    /// (frame index, tenant): all of them at once, whatever their
    /// tenant, so that their tree walks overlap. `tags[i]` gets frame
    /// `i`'s answer.
    fn classify_ahead(
        &mut self,
        seen: &[Inspected],
        todo: &[(u8, u32)],
        tags: &mut [Option<Option<u32>>],
    ) {
        let compiled = &*self.compiled;
        let Some(&(_, first)) = todo.first() else {
            return;
        };
        let mut keys = [FlowKey::default(); BURST];
        let mut at = [(0u8, 0u32); BURST];
        let mut classifiers = [&compiled.tenants[first as usize].classifier; BURST];
        let mut found = [None; BURST];
        let mut k = 0;
        // Cached tenants' keys: their sets first, every miss started at
        // once; then the answers.
        let mut sets = [None; BURST];
        let cached = todo
            .iter()
            .any(|&(_, ti)| compiled.tenants[ti as usize].cached);
        // (A resting cache counts the burst's keys off its rest, cached
        // tenants' or not: close enough.)
        if cached && self.cache.admit(todo.len()) {
            for (s, &(i, ti)) in sets.iter_mut().zip(todo) {
                let t = &compiled.tenants[ti as usize];
                if let (
                    true,
                    Seen::Switch {
                        l3: L3::Ip { ref key, .. },
                        ..
                    },
                ) = (t.cached, &seen[usize::from(i)].seen)
                {
                    *s = self.cache.set(t.uid, key);
                    if let Some(s) = *s {
                        self.cache.prefetch(s);
                    }
                }
            }
        }
        let (mut probed, mut hits) = (0, 0);
        for (j, &(i, ti)) in todo.iter().enumerate() {
            let set = sets[j];
            let t = &compiled.tenants[ti as usize];
            let Seen::Switch {
                l3: L3::Ip { key, .. },
                ..
            } = seen[usize::from(i)].seen
            else {
                continue;
            };
            if let Some(set) = set {
                probed += 1;
                if let Some(hit) = self.cache.get_in(set, t.uid, &key, self.generation) {
                    hits += 1;
                    tags[usize::from(i)] = Some(hit);
                    // What the frame's turn reads next (as for the
                    // classifier's answers below).
                    let cells = compiled.shards[self.shard].rules.get(ti as usize);
                    if let (Some(tag), Some(c)) = (hit, cells) {
                        if let (Some(a), Some(c)) =
                            (t.actions.get(tag as usize), c.get(tag as usize))
                        {
                            prefetch(a);
                            prefetch(c);
                        }
                    }
                    continue;
                }
            }
            keys[k] = key;
            at[k] = (i, ti);
            classifiers[k] = &t.classifier;
            sets[k] = set;
            k += 1;
        }
        if probed > 0 {
            self.cache.tally(probed, hits);
        }
        // Every tenant's keys walk their trees together.
        Classifier::lookup_multi(&classifiers[..k], &keys[..k], &mut found[..k]);
        // What the frames' turns read next, by tag: its misses start now,
        // all together.
        let cells = &compiled.shards[self.shard].rules;
        for (&(_, ti), &tag) in at[..k].iter().zip(&found[..k]) {
            let ti = ti as usize;
            if let (Some(tag), Some(t), Some(c)) = (tag, compiled.tenants.get(ti), cells.get(ti)) {
                if let (Some(a), Some(c)) = (t.actions.get(tag as usize), c.get(tag as usize)) {
                    prefetch(a);
                    prefetch(c);
                }
            }
        }
        for (((key, &(i, ti)), &tag), &set) in
            keys[..k].iter().zip(&at[..k]).zip(&found[..k]).zip(&sets)
        {
            if let Some(set) = set {
                let uid = compiled.tenants[ti as usize].uid;
                self.cache.put_in(set, uid, key, self.generation, tag);
            }
            tags[usize::from(i)] = Some(tag);
        }
    }

    /// Settles frame `x` (`pkt`, received on `port`) at its turn, as
    /// [`SwitchPipeline::settle`] with `tag` and `conn`, and hands it to
    /// `sink` with its verdict and a flood's outputs: the one way a frame
    /// of a burst leaves [`Pipeline::process_burst`] once decided.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn settle_into<P: Packet>(
        &mut self,
        port: usize,
        mut pkt: P,
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
        sink: &mut impl FnMut(P, &Verdict, &[Egress]),
    ) {
        flood.clear();
        let v = self.settle(port, pkt.data_mut(), x, tag, conn, flood);
        sink(pkt, &v, flood);
    }
}

/// What a frame of a burst needs before its turn.
#[derive(Debug, Clone, Copy)]
enum Need {
    /// Its tenant's (index) rules, for its key.
    Rules(u32),
    /// Nothing more: what [`SwitchPipeline::decide`] takes as its
    /// classification.
    Ready(Option<Option<u32>>),
}

/// The frames of a burst held for their turn, by index in the burst's
/// stage, with what each needs.
struct Waiting<P> {
    held: [Option<P>; BURST],
    /// Classifications known already ([`Need::Ready`]).
    tags: [Option<Option<u32>>; BURST],
    /// Frames whose tenant's rules must classify them: (index, tenant).
    todo: [(u8, u32); BURST],
    /// Entries of `todo`.
    n: usize,
    /// Frames held.
    staged: usize,
}

impl<P> Waiting<P> {
    fn new() -> Waiting<P> {
        Waiting {
            held: std::array::from_fn(|_| None),
            tags: [None; BURST],
            todo: [(0, 0); BURST],
            n: 0,
            staged: 0,
        }
    }

    /// Holds `pkt`, frame `i` of the stage, with what it needs.
    #[inline(always)]
    fn hold(&mut self, i: usize, pkt: P, need: Need) {
        let i = i % BURST;
        match need {
            Need::Ready(tag) => self.tags[i] = tag,
            Need::Rules(ti) => {
                self.todo[self.n % BURST] = (i as u8, ti);
                self.n += 1;
            }
        }
        self.held[i] = Some(pkt);
        self.staged += 1;
    }
}

impl Pipeline for SwitchPipeline {
    fn stopped(&mut self) {
        self.save_tables();
    }

    fn endpoints(&self) -> Option<&std::sync::Arc<crate::endpoint_queues::EndpointTable>> {
        self.compiled.endpoint_queues.as_ref()
    }

    fn turn(&mut self) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g != self.generation {
            let cur = self
                .shared
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.compiled = cur.clone();
            self.generation = self.shared.generation.load(Ordering::Acquire);
            drop(cur);
            self.shard = self.worker % self.compiled.shards.len().max(1);
            // Attachment indices belong to the old snapshot.
            self.macs.reset(self.compiled.mac_limits);
            self.memo.clear();
            self.compiled.share_tables(&mut self.conns, &mut self.frags);
            self.store_gauges();
            self.cells.taken.store(self.generation, Ordering::Release);
        }
        let elapsed = self.epoch.elapsed();
        self.now_us = elapsed.as_micros() as u64;
        let now = elapsed.as_secs();
        let tick = now != self.now;
        self.now = now;
        if tick || self.unix_now == 0 {
            // Whole seconds are all a rule's last hit keeps: the wall
            // clock is read once a second, not on every turn.
            self.unix_now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
        }
        if self.now >= self.last_sweep + 10 {
            self.last_sweep = self.now;
            self.conns.forget_carried(self.now);
            self.frags.forget_carried(self.now);
            let (now, ageing) = (self.now, self.compiled.mac_ageing.as_secs());
            self.macs.age(now, ageing);
            self.neighbours
                .retain(|_, (_, seen)| now.saturating_sub(*seen) < ageing);
        }
        if !self.conns.is_empty() {
            let tracking = &self.compiled.tracking;
            self.conns.sweep(self.now, SWEEP_SLOTS, |uid| {
                tracking.get(uid as usize).copied().unwrap_or(false)
            });
        }
        if !self.frags.is_empty() {
            // A removed tenant's datagrams age out like any.
            self.frags.sweep(self.now, SWEEP_SLOTS, |_| true);
        }
        if tick {
            self.store_gauges();
            self.cells.store_cache(self.cache.stats());
        }
        self.offload_turn();
    }

    fn process(&mut self, in_port: usize, packet: &mut [u8], flood: &mut Vec<Egress>) -> Verdict {
        let x = self.inspect(in_port, packet);
        let conn = self.conn_key(&x);
        self.decide(in_port, &x, None, conn, flood)
    }

    fn process_burst<P: Packet>(
        &mut self,
        in_port: usize,
        burst: &mut Vec<P>,
        flood: &mut Vec<Egress>,
        mut sink: impl FnMut(P, &Verdict, &[Egress]),
    ) {
        // Flow hardware (the model NIC) comes first: what it carries
        // never reaches the switch.
        if self.offload.is_some() {
            self.model_carry(in_port, burst, &mut sink);
        }
        // Frames are decided at once while none waits for the rules;
        // from the first that needs them on, they wait, and are decided
        // in order once their keys have been classified together.
        let mut seen = std::mem::take(&mut self.stage);
        let tracks = self.compiled.tracking.contains(&true);
        while !burst.is_empty() {
            let k = burst.len().min(BURST);
            seen.clear();
            let mut w = Waiting::new();
            if tracks {
                // Connections to look up: the whole burst is inspected
                // first, so that their table misses start together.
                for pkt in burst[..k].iter_mut() {
                    seen.push(self.inspect_or_recall(in_port, pkt.data_mut()));
                }
                for (i, x) in seen.iter().enumerate() {
                    let ck = self.conn_key(x);
                    if let Some(ck) = &ck {
                        self.conns.prefetch(ck);
                    }
                    self.conn_keys[i] = ck;
                }
                for (i, pkt) in burst.drain(..k).enumerate() {
                    let (x, ck) = (&seen[i], self.conn_keys[i]);
                    match self.need(x, ck.as_ref()) {
                        Need::Ready(tag) if w.staged == 0 => {
                            self.settle_into(in_port, pkt, x, tag, ck, flood, &mut sink);
                        }
                        need => w.hold(i, pkt, need),
                    }
                }
            } else {
                let memo = self.compiled.l2_memo;
                for mut pkt in burst.drain(..k) {
                    let x = if !memo {
                        self.inspect(in_port, pkt.data_mut())
                    } else if w.staged == 0 {
                        // A remembered decision holds now: taken at once.
                        if let Some(v) = self.recall(in_port, pkt.data()) {
                            sink(pkt, &v, &[]);
                            continue;
                        }
                        self.inspect(in_port, pkt.data_mut())
                    } else {
                        // Held: the decision must still hold at its turn.
                        self.inspect_or_recall(in_port, pkt.data_mut())
                    };
                    // No tenant tracks connections: no frame has a key.
                    match self.need(&x, None) {
                        Need::Ready(tag) if w.staged == 0 => {
                            self.settle_into(in_port, pkt, &x, tag, None, flood, &mut sink);
                        }
                        need => {
                            w.hold(seen.len(), pkt, need);
                            seen.push(x);
                        }
                    }
                }
            }
            if w.staged == 0 {
                continue;
            }
            self.classify_ahead(&seen, &w.todo[..w.n], &mut w.tags);
            for (i, ((x, &tag), pkt)) in seen.iter().zip(&w.tags).zip(&mut w.held).enumerate() {
                if let Some(pkt) = pkt.take() {
                    let ck = if tracks { self.conn_keys[i] } else { None };
                    self.settle_into(in_port, pkt, x, tag, ck, flood, &mut sink);
                }
            }
        }
        self.stage = seen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    /// A pipeline given whole bursts decides exactly what it decides
    /// frame by frame: verdicts, outputs, rewritten bytes and tenant
    /// counters, with connections opened, closed and refused inside a
    /// burst, fragments before and after their first, MAC learning (and
    /// its limits), VTEP neighbours and VXLAN from unnamed VTEPs,
    /// flow-cached tenants, tenants switched at the link layer (decided by
    /// header from memory) and bursts longer than [`BURST`].
    #[test]
    fn bursts_decide_like_frames_one_by_one() {
        use crate::conntrack::{ACK, FIN, RST, SYN};
        use crate::wire::tests::build::{arp, eth, ipv4, tcp};
        use crate::wire::ETH_IPV4;
        const VTEP: u32 = 0xc000_0201;
        const REMOTE: u32 = 0xc000_0202;
        const STRANGER: u32 = 0xc000_0263;
        let mut rng = dpu_rand::Rng::new(0xb0b5);
        let mut seen = std::collections::HashMap::<String, usize>::new();
        let mut recalled = [0; 2];
        for round in 0..60 {
            let ports = 4;
            // Some rounds: tenant 0 switches at the link layer; in half of
            // them no tenant tracks connections.
            let plain = round % 3 == 2;
            let stateless = round % 6 == 2;
            let mut tenants = Vec::new();
            for (ti, att) in [
                vec![(0, 10), (1, 0), (3, 10)],
                vec![(0, 20), (2, 0), (3, 20)],
            ]
            .into_iter()
            .enumerate()
            {
                let mut t = tenant(&format!("t{ti}"), &att, rng.below(3) == 0);
                t.attachments.push(Attach {
                    port: 0,
                    vlan: 0,
                    vni: 100 + ti as u32,
                });
                t.remote_vteps = vec![Vec::new(), Vec::new(), Vec::new(), vec![REMOTE]];
                let mut web = AclRule::any(10, 0, Family::V4);
                web.proto = (proto::TCP, proto::TCP);
                web.dst_port = (80, 80);
                web.src = AclRule::prefix_range(0x0a00_0000, 29, 32);
                let mut seven = AclRule::any(20, 0, Family::V4);
                seven.proto = (proto::UDP, proto::UDP);
                seven.dst_port = (7, 7);
                let mut dns = AclRule::any(30, 0, Family::V4);
                dns.proto = (proto::UDP, proto::UDP);
                dns.dst_port = (53, 53);
                let mut echo = AclRule::any(40, 0, Family::V4);
                echo.proto = (proto::ICMP, proto::ICMP);
                echo.src_port = (8, 8);
                for (id, m, allow, stateful) in [
                    ("web", web, true, rng.below(4) != 0),
                    ("seven", seven, false, false),
                    ("dns", dns, true, rng.below(2) == 0),
                    ("echo", echo, true, true),
                ] {
                    std::sync::Arc::make_mut(&mut t.rules).push(SwitchRule {
                        id: id.into(),
                        matches: m,
                        allow,
                        stateful,
                        rate_limit: None,
                    });
                }
                // Enough rules for the flow cache, in some rounds.
                if ti == 1 && round % 2 == 0 {
                    for i in 0..FLOW_CACHE_MIN_RULES as u32 {
                        let mut m = AclRule::any(100 + i, 0, Family::V4);
                        m.src = AclRule::prefix_range(u128::from(0xc0a8_0000 | i), 32, 32);
                        std::sync::Arc::make_mut(&mut t.rules).push(SwitchRule {
                            id: format!("f{i}"),
                            matches: m,
                            allow: false,
                            stateful: false,
                            rate_limit: None,
                        });
                    }
                }
                if plain && ti == 0 {
                    std::sync::Arc::make_mut(&mut t.rules).clear();
                    t.default_allow = true;
                }
                if stateless {
                    std::sync::Arc::make_mut(&mut t.rules)
                        .iter_mut()
                        .for_each(|r| r.stateful = false);
                }
                tenants.push(t);
            }
            let vteps = vtep_on_port_0(ports, VTEP);
            let config = SwitchConfig {
                ports,
                vteps,
                tenants,
                flow_cache_entries: 4096,
                // Sources beyond it are dropped, in some rounds.
                mac_per_attachment: if round % 4 == 1 { 3 } else { 1024 },
                ..SwitchConfig::default()
            };
            let (ha, hb) = (
                SwitchHandle::new(&config).unwrap(),
                SwitchHandle::new(&config).unwrap(),
            );
            let (mut one, mut burst) = (ha.pipeline(), hb.pipeline());
            one.turn();
            burst.turn();
            for turn in 0..40 {
                let port = rng.index(ports);
                let n = 1 + rng.below(2 * BURST as u64 + 8) as usize;
                let frames: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        let (a, z) = if plain && port % 2 == 1 && rng.below(4) != 0 {
                            // Two hosts of the link-layer tenant talking
                            // to two behind port 0: headers that repeat.
                            (11 + rng.below(2) as u8, 1 + rng.below(2) as u8)
                        } else {
                            (1 + rng.below(6) as u8, 1 + rng.below(6) as u8)
                        };
                        let ip = |h: u8| [10, 0, 0, h];
                        let dst = if rng.below(4) == 0 { BCAST } else { mac(z) };
                        let vlan = match port {
                            0 => *rng.pick(&[None, Some(10), Some(20)]),
                            3 => *rng.pick(&[Some(10), Some(10), Some(20)]),
                            _ => None,
                        };
                        let (sp, dp) = if rng.below(2) == 0 {
                            (40000, *rng.pick(&[80, 53, 7]))
                        } else {
                            (*rng.pick(&[80, 53, 7]), 40000)
                        };
                        let mut f = match rng.below(9) {
                            0..=3 => {
                                let flags = *rng.pick(&[SYN, SYN | ACK, ACK, RST, FIN | ACK]);
                                let mut f = eth(dst, mac(a), vlan, ETH_IPV4);
                                f.extend(ipv4(ip(a), ip(z), proto::TCP, &tcp(sp, dp, flags)));
                                f
                            }
                            4 | 5 => {
                                let mut f = build::udp4(mac(a), dst, vlan, ip(a), ip(z), sp, dp);
                                // Some are fragments of a few datagrams:
                                // firsts, and later ones before or after
                                // their first.
                                if rng.below(3) == 0 {
                                    let l3 = if vlan.is_some() { 18 } else { 14 };
                                    let id = rng.below(3) as u16;
                                    let field: u16 = *rng.pick(&[0x2000, 1]);
                                    f[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
                                    f[l3 + 6..l3 + 8].copy_from_slice(&field.to_be_bytes());
                                }
                                f
                            }
                            6 => {
                                let ty = *rng.pick(&[8, 0]);
                                let mut f = eth(dst, mac(a), vlan, ETH_IPV4);
                                f.extend(ipv4(
                                    ip(a),
                                    ip(z),
                                    proto::ICMP,
                                    &[ty, 0, 0, 0, 0, 7, 0, 1],
                                ));
                                f
                            }
                            7 => arp(
                                mac(a),
                                BCAST,
                                None,
                                1 + rng.below(2) as u16,
                                ip(a),
                                [192, 0, 2, 1],
                            ),
                            _ => {
                                let mut f = build::udp4(mac(a), dst, vlan, ip(a), ip(z), sp, dp);
                                f.truncate(rng.below(40) as usize);
                                f
                            }
                        };
                        if port == 0 && rng.below(3) == 0 {
                            let mut p = crate::io::memory::MemPacket(f);
                            let t = Tunnel {
                                src_mac: mac(0xbb),
                                dst_mac: mac(0xaa),
                                // Now and then from an unnamed VTEP.
                                src_ip: if rng.below(4) == 0 { STRANGER } else { REMOTE },
                                dst_ip: VTEP,
                                vni: *rng.pick(&[100, 101, 102]),
                                resolve: false,
                            };
                            assert!(crate::wire::apply_tunnel(&mut p, &t));
                            f = p.0;
                        }
                        f
                    })
                    .collect();
                let mut a = frames.clone();
                let expected: Vec<(Verdict, Vec<Egress>)> = a
                    .iter_mut()
                    .map(|f| {
                        let mut flood = Vec::new();
                        (one.process(port, f, &mut flood), flood)
                    })
                    .collect();
                let mut b: Vec<_> = frames
                    .iter()
                    .map(|f| crate::io::memory::MemPacket(f.clone()))
                    .collect();
                let mut flood = Vec::new();
                let mut got = Vec::new();
                burst.process_burst(port, &mut b, &mut flood, |pkt, v, flood| {
                    got.push((pkt.0, *v, flood.to_vec()));
                });
                assert!(b.is_empty());
                assert_eq!(got.len(), n);
                for (i, ((v, flood), (bytes, bv, bflood))) in expected.iter().zip(&got).enumerate()
                {
                    let at = format!("round {round} burst {turn} frame {i}/{n}");
                    assert_eq!((bv, bflood), (v, flood), "{at}");
                    assert_eq!(&a[i], bytes, "{at}: bytes");
                    *seen
                        .entry(format!("{v:?}").chars().take(20).collect())
                        .or_default() += 1;
                }
            }
            assert_eq!(
                ha.traffic().tenants,
                hb.traffic().tenants,
                "round {round}: counters"
            );
            recalled[usize::from(stateless)] += burst.memo.hits.get();
        }
        // Through both ways a burst goes, many times.
        assert!(
            recalled.iter().all(|&n| n > 100),
            "decided from memory: {recalled:?}"
        );
        // Every kind of decision was compared, many times.
        for kind in [
            "Forward",
            "Flood",
            "Drop(AclDeny)",
            "Drop(ConntrackInva",
            "Drop(NoTenant)",
            "Drop(Malformed)",
            "Drop(FragmentUnknow",
            "Drop(UnknownVtep)",
            "Drop(MacLimit)",
        ] {
            let n = seen
                .iter()
                .filter(|(k, _)| k.starts_with(kind))
                .map(|(_, n)| n)
                .sum::<usize>();
            assert!(n > 50, "{kind}: {n} in {seen:?}");
        }
    }
}

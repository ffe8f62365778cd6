//! Decisions remembered by link-layer header ([`L2Memo`]) for tenants
//! switched at L2: recalled instead of inspected, checked still fresh at
//! the frame's turn, remembered after a decision.
//!
//! [`L2Memo`]: crate::l2memo::L2Memo

use crate::conntrack::ConnKey;
use crate::l2memo::{Decision, Header};
use crate::wire::L3;
use crate::worker::{Egress, Verdict};

use super::counters::bump;
use super::frame::{Inspected, Seen};
use super::state::SwitchPipeline;

impl SwitchPipeline {
    /// The decision remembered for `frame`, received on `port`, by its
    /// link-layer header, counted as [`SwitchPipeline::decide`] counts
    /// it: what `decide` would make of it now.
    #[inline(always)]
    pub(super) fn recall(&self, port: usize, frame: &[u8]) -> Option<Verdict> {
        let d = self.remembered(port, frame)?;
        Some(self.forward_recalled(d, frame.len() as u64))
    }

    /// The decision remembered for `frame`'s header on `port` that holds
    /// with the MAC table as it is now.
    #[inline(always)]
    fn remembered(&self, port: usize, frame: &[u8]) -> Option<Decision> {
        let h = Header::of(port, frame)?;
        self.memo.recall(&h, self.macs.version(), self.now)
    }

    /// Counts a frame of `len` bytes forwarded as remembered decision `d`
    /// says, and says so.
    #[inline(always)]
    pub(super) fn forward_recalled(&self, d: Decision, len: u64) -> Verdict {
        let cells = &self.compiled.shards[self.shard].tenants[d.tenant as usize];
        bump(&cells.rx_packets, 1);
        bump(&cells.rx_bytes, len);
        bump(&cells.forwarded, 1);
        Verdict::Forward(Egress {
            port: d.port as usize,
            vlan: d.vlan,
            decap: 0,
            tunnel: None,
        })
    }

    /// [`SwitchPipeline::inspect`], unless the frame's decision is
    /// remembered by its header: then [`Seen::Recalled`], to be checked
    /// still fresh at the frame's turn ([`SwitchPipeline::settle`]).
    #[inline]
    pub(super) fn inspect_or_recall(&self, port: usize, packet: &mut [u8]) -> Inspected {
        if self.compiled.l2_memo {
            if let Some(decision) = self.remembered(port, packet) {
                return Inspected {
                    seen: Seen::Recalled {
                        decision,
                        version: self.macs.version(),
                        len: packet.len() as u32,
                    },
                    neighbour: None,
                };
            }
        }
        self.inspect(port, packet)
    }

    /// Decides frame `x` (bytes `packet`, received on `port`) at its turn
    /// in a burst, as [`SwitchPipeline::decide`] with `tag` and `conn`,
    /// and remembers the decision by header where that holds. A frame
    /// recalled from memory earlier in the burst is forwarded as
    /// remembered if the MAC table has not changed since; otherwise it is
    /// inspected and decided now.
    #[inline(always)]
    pub(super) fn settle(
        &mut self,
        port: usize,
        packet: &mut [u8],
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
    ) -> Verdict {
        if let Seen::Recalled {
            decision,
            version,
            len,
        } = x.seen
        {
            if version == self.macs.version() {
                return self.forward_recalled(decision, u64::from(len));
            }
            return self.settle_stale(port, packet, flood);
        }
        if !self.compiled.l2_memo {
            return self.decide(port, x, tag, conn, flood);
        }
        self.decide_remembering(port, packet, x, tag, conn, flood)
    }

    /// [`SwitchPipeline::decide`], then [`SwitchPipeline::remember`].
    #[inline(always)]
    fn decide_remembering(
        &mut self,
        port: usize,
        packet: &[u8],
        x: &Inspected,
        tag: Option<Option<u32>>,
        conn: Option<ConnKey>,
        flood: &mut Vec<Egress>,
    ) -> Verdict {
        let version = self.macs.version();
        let v = self.decide(port, x, tag, conn, flood);
        self.remember(port, packet, x, &v, version);
        v
    }

    /// [`SwitchPipeline::settle`] for a frame recalled from memory whose
    /// MAC table changed before its turn: inspected and decided now. Only
    /// link-layer decisions are remembered, so it needs neither rules
    /// nor a connection.
    #[cold]
    #[inline(never)]
    fn settle_stale(&mut self, port: usize, packet: &mut [u8], flood: &mut Vec<Egress>) -> Verdict {
        let x = self.inspect(port, packet);
        self.decide_remembering(port, packet, &x, None, None, flood)
    }

    /// Remembers verdict `v` on frame `x` (bytes `frame`, received on
    /// `port`) by its link-layer header, if that header alone decided it:
    /// forwarded unparsed past the link layer, not through a tunnel or a
    /// VTEP, and without changing the MAC table (still at `version`), so
    /// that the same header would be decided the same way until the table
    /// or the second changes.
    #[inline]
    fn remember(&mut self, port: usize, frame: &[u8], x: &Inspected, v: &Verdict, version: u64) {
        let (
            Seen::Switch {
                ti,
                decap: 0,
                l3: L3::Other(_),
                ..
            },
            Verdict::Forward(e),
        ) = (&x.seen, v)
        else {
            return;
        };
        if e.tunnel.is_some()
            || self.macs.version() != version
            || self.compiled.vteps.get(port).copied().flatten().is_some()
        {
            return;
        }
        if let Some(h) = Header::of(port, frame) {
            let d = Decision {
                tenant: *ti,
                port: e.port as u32,
                vlan: e.vlan,
            };
            self.memo.remember(h, version, self.now, d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::testing::*;

    /// A link-layer tenant's frames are decided from memory while their
    /// header repeats, and as the MAC table and the rules say the moment
    /// either changes: a host that moves within a burst (also while the
    /// frames wait behind one that needs rules, and when a tenant tracks
    /// connections, so that a burst is inspected whole before any frame
    /// of it is decided), a rule published for the tenant.
    #[test]
    fn headers_decided_from_memory_follow_the_table_and_the_rules() {
        for stateful in [false, true] {
            let ruled = |stateful| {
                let mut s = tenant("s", &[(0, 30), (3, 0)], false);
                s.rules = dns_and_deny_7().into();
                std::sync::Arc::make_mut(&mut s.rules)[0].stateful = stateful;
                s
            };
            let plain = || tenant("t", &[(0, 10), (1, 0), (2, 0)], true);
            let (h, mut p) = switch(4, vec![plain(), ruled(stateful)]);
            assert_eq!(p.compiled.tracking.contains(&true), stateful);
            let burst = |p: &mut SwitchPipeline, port: usize, frames: &[Vec<u8>]| {
                let mut b: Vec<_> = frames
                    .iter()
                    .map(|f| crate::io::memory::MemPacket(f.clone()))
                    .collect();
                let mut got = Vec::new();
                p.process_burst(port, &mut b, &mut Vec::new(), |_, v, fl| {
                    got.push((*v, fl.to_vec()))
                });
                got
            };
            let out = |port| {
                Verdict::Forward(Egress {
                    vlan: VlanOp::Strip,
                    ..Egress::to(port)
                })
            };
            let at = format!("stateful {stateful}");
            // Host 2 is behind port 1; host 1 on port 0 sends to it.
            assert_eq!(run(&mut p, 1, udp(2, mac(1), None, 53)).0, Verdict::Flood);
            let to_2 = udp(1, mac(2), Some(10), 53);
            // A burst inspected whole before it is decided finds nothing
            // remembered yet; the next one does.
            for _ in 0..2 {
                let got = burst(&mut p, 0, &vec![to_2.clone(); 20]);
                assert!(
                    got.iter().all(|(v, fl)| *v == out(1) && fl.is_empty()),
                    "{at}"
                );
            }
            assert!(
                p.memo.hits.get() >= 20,
                "{at}: {} from memory",
                p.memo.hits.get()
            );
            // Behind a frame of the ruled tenant, host 2 moves to port 0:
            // host 1's frame to it before the move goes to port 1, the
            // one after stays on its segment, and so does an IPv6 frame
            // with the same addresses, decided on its own.
            let hits = p.memo.hits.get();
            let moved = udp(2, mac(9), Some(10), 53);
            let mut v6 = build::eth(mac(2), mac(1), Some(10), crate::wire::ETH_IPV6);
            v6.extend(build::ipv6(1, 2, proto::UDP, &build::udp(5000, 53, 8)));
            let ruled_frame = udp(5, mac(6), Some(30), 53);
            let got = burst(
                &mut p,
                0,
                &[ruled_frame, to_2.clone(), moved, to_2.clone(), v6.clone()],
            );
            assert!(
                matches!(got[0].0, Verdict::Forward(e) if e.port == 3),
                "{at}"
            );
            assert_eq!(got[1].0, out(1), "{at}");
            assert_eq!(got[2].0, Verdict::Flood, "{at}");
            assert_eq!(got[3], (Verdict::Flood, Vec::new()), "{at}: filtered");
            assert_eq!(got[4], (Verdict::Flood, Vec::new()), "{at}: filtered");
            assert_eq!(
                p.memo.hits.get(),
                hits + 2,
                "{at}: both recalled, one stale"
            );
            // Back behind port 2.
            run(&mut p, 2, udp(2, mac(1), None, 53));
            let got = burst(&mut p, 0, &vec![to_2.clone(); 4]);
            assert!(got.iter().all(|(v, _)| *v == out(2)), "{at}: {got:?}");
            // Counted as decided: all of them passed the filter.
            let traffic = h.traffic().tenants["t"];
            assert_eq!(traffic.rx_packets, 50, "{at}");
            assert_eq!(traffic.forwarded_packets, 50, "{at}");
            assert_eq!(
                traffic.rx_bytes,
                // 47 tagged frames on port 0, 2 untagged on ports 1 and 2.
                47 * to_2.len() as u64 + 2 * (to_2.len() as u64 - 4) + v6.len() as u64,
                "{at}"
            );
            // A rule for the tenant: the same header is filtered at once.
            let mut t = plain();
            t.rules = dns_and_deny_7().into();
            std::sync::Arc::make_mut(&mut t.rules)[0].allow = false;
            h.publish(&SwitchConfig {
                ports: 4,
                tenants: vec![t, ruled(stateful)],
                ..SwitchConfig::default()
            })
            .unwrap();
            p.turn();
            let got = burst(&mut p, 0, &vec![to_2.clone(); 3]);
            assert!(
                got.iter()
                    .all(|(v, _)| *v == Verdict::Drop(DropReason::AclDeny)),
                "{at}"
            );
            v6[18] = 0; // now parsed: malformed
            assert_eq!(
                burst(&mut p, 0, &[v6])[0].0,
                Verdict::Drop(DropReason::Malformed),
                "{at}"
            );
        }
    }
}

//! Saving and restoring the switch's tables ([`super::saved`]): a
//! stopping pipeline hands its entries to the handle, the handle gives
//! what a previous process saved to the pipelines it makes.

use std::sync::Arc;
use std::time::Instant;

use crate::conntrack::CarriedConns;
use crate::fragtrack::CarriedFrags;

use super::handle::SwitchHandle;
use super::saved::{CarriedSet, RestoreReport, Restored, SavedTables};
use super::state::SwitchPipeline;

impl SwitchPipeline {
    /// Hands this worker's live connections and datagrams to the handle
    /// (by tenant name, for tenants of its configuration): what
    /// [`SwitchHandle::saved_tables`] answers once every worker stopped.
    pub(super) fn save_tables(&self) {
        let names: hashbrown::HashMap<u32, &str> = self
            .compiled
            .tenants
            .iter()
            .map(|t| (t.uid, t.name.as_str()))
            .collect();
        let mut p = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let saved = &mut p.saved;
        let mut index: hashbrown::HashMap<String, u32> = saved
            .tenants
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        let mut added: Vec<String> = Vec::new();
        let mut named = |uid: u32| -> Option<u32> {
            let name = *names.get(&uid)?;
            if let Some(&i) = index.get(name) {
                return Some(i);
            }
            let next = index.len() as u32;
            index.insert(name.to_string(), next);
            added.push(name.to_string());
            Some(next)
        };
        let (mut conns, mut frags) = (Vec::new(), Vec::new());
        self.conns.export(self.now, |mut c| {
            if let Some(t) = named(c.tenant) {
                c.tenant = t;
                conns.push(c);
            }
        });
        self.frags.export(self.now, |mut f| {
            if let Some(t) = named(f.tenant) {
                f.tenant = t;
                frags.push(f);
            }
        });
        saved.tenants.extend(added);
        saved.conns.extend(conns);
        saved.frags.extend(frags);
    }

    /// Lets this pipeline's tables adopt the entries carried over from a
    /// previous process, if there are any.
    pub(super) fn carry(&mut self, set: &CarriedSet) {
        let offset = self.epoch.saturating_duration_since(set.base).as_secs();
        self.conns.carry(set.conns.clone(), offset);
        self.frags.carry(set.frags.clone(), offset);
    }
}

impl SwitchHandle {
    /// What the stopped workers' tables held, as they left it when they
    /// stopped (each at its last turn), read as of now: call once every
    /// worker has stopped. Taken: a second call answers nothing.
    pub fn saved_tables(&self) -> SavedTables {
        let mut p = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut t = std::mem::take(&mut p.saved);
        t.saved_unix = unix_now();
        t
    }

    /// Per worker, the most connections and datagrams together its
    /// tables hold under the current configuration: with the number of
    /// workers, what bounds a file worth reading.
    pub fn table_capacity(&self) -> usize {
        let (_, c) = self.load();
        c.conntrack.max.saturating_add(c.fragments.shares.max)
    }

    /// Gives the entries of `saved` to the pipelines made from now on,
    /// checked against the current configuration and aged by the time
    /// since they were saved (`now_unix`, Unix seconds): each worker
    /// adopts an entry when a packet of it misses in its own tables.
    /// Answers what became of the entries; [`SwitchHandle::restored`]
    /// keeps it.
    pub fn restore(&self, saved: &SavedTables, now_unix: u64) -> RestoreReport {
        let (_, compiled) = self.load();
        // A clock set back counts as no time passed.
        let elapsed = now_unix.saturating_sub(saved.saved_unix);
        let by_name: hashbrown::HashMap<&str, (u32, bool)> = compiled
            .tenants
            .iter()
            .map(|t| (t.name.as_str(), (t.uid, t.tracks)))
            .collect();
        let tenant = |i: u32| {
            saved
                .tenants
                .get(i as usize)
                .and_then(|n| by_name.get(n.as_str()).copied())
        };
        let mut report = RestoreReport::default();
        let mut conns = CarriedConns::with_capacity(saved.conns.len());
        let r = &mut report.conns;
        for c in &saved.conns {
            let Some((uid, tracks)) = tenant(c.tenant) else {
                // An index beyond the names is damage; a name the
                // configuration lacks, a tenant gone.
                if c.tenant as usize >= saved.tenants.len() {
                    r.invalid += 1;
                } else {
                    r.no_tenant += 1;
                }
                continue;
            };
            if !c.is_sound() {
                r.invalid += 1;
                continue;
            }
            if !tracks {
                r.no_tenant += 1;
                continue;
            }
            let ttl = u64::from(c.ttl).min(compiled.conntrack_timeouts.of(c.proto, c.state));
            let Some(left) = ttl.checked_sub(elapsed).filter(|&l| l > 0) else {
                r.expired += 1;
                continue;
            };
            if conns.add(uid, c, left as u32) {
                r.restored += 1;
            } else {
                r.invalid += 1;
            }
        }
        let mut frags = CarriedFrags::with_capacity(saved.frags.len());
        let r = &mut report.frags;
        for f in &saved.frags {
            let Some((uid, _)) = tenant(f.tenant) else {
                if f.tenant as usize >= saved.tenants.len() {
                    r.invalid += 1;
                } else {
                    r.no_tenant += 1;
                }
                continue;
            };
            if !f.is_sound() {
                r.invalid += 1;
                continue;
            }
            let ttl = u64::from(f.ttl).min(compiled.fragments.timeout);
            let Some(left) = ttl.checked_sub(elapsed).filter(|&l| l > 0) else {
                r.expired += 1;
                continue;
            };
            if frags.add(uid, f, left as u32) {
                r.restored += 1;
            } else {
                r.invalid += 1;
            }
        }
        let mut p = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.carried = Some(Arc::new(CarriedSet {
            conns: Arc::new(conns),
            frags: Arc::new(frags),
            base: Instant::now(),
        }));
        p.restored = add_reports(p.restored, report);
        report
    }

    /// Counts a saved-tables file refused as a whole.
    pub fn refused_saved_tables(&self) {
        let mut p = self
            .shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.restored.refused_files += 1;
    }

    /// What restoring saved tables did in this process, summed.
    pub fn restored(&self) -> RestoreReport {
        self.shared
            .pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .restored
    }
}

fn add_reports(a: RestoreReport, b: RestoreReport) -> RestoreReport {
    let add = |a: Restored, b: Restored| Restored {
        restored: a.restored + b.restored,
        expired: a.expired + b.expired,
        no_tenant: a.no_tenant + b.no_tenant,
        invalid: a.invalid + b.invalid,
    };
    RestoreReport {
        conns: add(a.conns, b.conns),
        frags: add(a.frags, b.frags),
        refused_files: a.refused_files + b.refused_files,
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::{
        ConnKey, ConnState, ConnTable, Dir, SavedConn, TcpState, Timeouts, ACK, RST, SYN,
    };
    use crate::fragtrack::SavedFrag;
    use crate::switch::saved::{SavedError, CHECKSUM, CONN, HEADER};
    use crate::switch::testing::*;
    use crate::wire::tests::build::{eth, frag4, ipv4, tcp, udp as udp_header};
    use crate::wire::ETH_IPV4;

    const CLIENT: [u8; 4] = [10, 0, 0, 1];
    const SERVER: [u8; 4] = [10, 0, 0, 2];

    /// A TCP segment from the client (`from` 1, port 0) or the server (2,
    /// port 1), client port 40000, server port 80.
    fn tcp4(from: u8, flags: u8) -> Vec<u8> {
        let (src, dst, sport, dport) = if from == 1 {
            (CLIENT, SERVER, 40000, 80)
        } else {
            (SERVER, CLIENT, 80, 40000)
        };
        let mut f = eth(mac(3 - from), mac(from), None, ETH_IPV4);
        f.extend(ipv4(src, dst, proto::TCP, &tcp(sport, dport, flags)));
        f
    }

    /// A fragment of UDP datagram 77 from the client to port 53.
    fn frag(first: bool) -> Vec<u8> {
        let mut f = eth(mac(2), mac(1), None, ETH_IPV4);
        let (l4, offset, more) = if first {
            (udp_header(5000, 53, 8), 0, true)
        } else {
            (vec![0; 8], 2, false)
        };
        f.extend(frag4(
            ipv4(CLIENT, SERVER, proto::UDP, &l4),
            77,
            offset,
            more,
        ));
        f
    }

    /// Tenant "web": default deny; the client may open TCP to port 80
    /// (stateful) and send UDP to port 53 (stateless), unless `web` is
    /// false, when only port 81 may be opened.
    fn web_tenant(web: bool) -> TenantConfig {
        let mut t = tenant("web", &[(0, 0), (1, 0)], false);
        let mut m = AclRule::any(10, 0, Family::V4);
        m.src = AclRule::prefix_range(0x0a00_0001, 32, 32);
        m.proto = (proto::TCP, proto::TCP);
        let port = if web { 80 } else { 81 };
        m.dst_port = (port, port);
        let mut dns = AclRule::any(20, 0, Family::V4);
        dns.proto = (proto::UDP, proto::UDP);
        dns.dst_port = (53, 53);
        t.rules = Arc::new(vec![
            SwitchRule {
                id: "web".into(),
                matches: m,
                allow: true,
                stateful: true,
                rate_limit: None,
            },
            SwitchRule {
                id: "dns".into(),
                matches: dns,
                allow: true,
                stateful: false,
                rate_limit: None,
            },
        ]);
        t
    }

    fn passes(p: &mut SwitchPipeline, port: usize, frame: Vec<u8>) -> bool {
        !matches!(run(p, port, frame).0, Verdict::Drop(_))
    }

    /// The tables a switch with tenants `first` is left with after a TCP
    /// handshake and a first fragment, once its worker stopped.
    fn saved_after_a_handshake(tenants: Vec<TenantConfig>) -> SavedTables {
        let (h, mut p) = switch(3, tenants);
        assert!(passes(&mut p, 0, tcp4(1, SYN)));
        assert!(passes(&mut p, 1, tcp4(2, SYN | ACK)));
        assert!(passes(&mut p, 0, tcp4(1, ACK)));
        assert!(passes(&mut p, 0, frag(true)));
        p.stopped();
        h.saved_tables()
    }

    #[test]
    fn a_connection_and_a_datagram_outlive_a_restart_under_other_tenant_ids() {
        let other = tenant("other", &[(2, 0)], true);
        let saved = saved_after_a_handshake(vec![other.clone(), web_tenant(true)]);
        assert_eq!((saved.conns.len(), saved.frags.len()), (1, 1));
        assert_eq!(saved.tenants, ["web"]);
        let back = SavedTables::decode(&saved.encode(), 2).unwrap();
        assert_eq!(back, saved);

        // The new process lists its tenants the other way round.
        let (h, _) = switch(3, vec![web_tenant(true), other.clone()]);
        let report = h.restore(&back, saved.saved_unix + 3);
        assert_eq!(report.conns.restored, 1);
        assert_eq!(report.frags.restored, 1);
        assert_eq!(h.restored(), report);
        let mut p = h.pipeline();
        p.turn();
        // The server's data and the client's pass as part of the
        // connection; the datagram's later fragment passes.
        assert!(passes(&mut p, 1, tcp4(2, ACK)));
        assert!(passes(&mut p, 0, tcp4(1, ACK)));
        assert!(passes(&mut p, 0, frag(false)));
        assert_eq!(p.conns.len(), 1);

        // Without the tables, the same server segment is refused.
        let (_, mut fresh) = switch(3, vec![web_tenant(true), other]);
        assert_eq!(
            run(&mut fresh, 1, tcp4(2, ACK)).0,
            Verdict::Drop(DropReason::AclDeny)
        );
        assert!(!passes(&mut fresh, 0, frag(false)));
    }

    #[test]
    fn restored_entries_answer_to_the_new_rules_and_the_time_that_passed() {
        let saved = saved_after_a_handshake(vec![web_tenant(true)]);
        // The rule that opened the connection is gone: it is not kept.
        let (h, _) = switch(2, vec![web_tenant(false)]);
        assert_eq!(h.restore(&saved, saved.saved_unix).conns.restored, 1);
        let mut p = h.pipeline();
        p.turn();
        assert!(!passes(&mut p, 1, tcp4(2, ACK)));
        assert!(p.conns.is_empty());

        // Down for longer than an established connection lives, or than a
        // datagram's fragments: both expired.
        let (h, _) = switch(2, vec![web_tenant(true)]);
        let r = h.restore(
            &saved,
            saved.saved_unix + Timeouts::default().tcp_established,
        );
        assert_eq!((r.conns.expired, r.frags.expired), (1, 1));
        // A tenant gone, or no longer tracking: the connection has nobody.
        let (h, _) = switch(2, vec![tenant("web", &[(0, 0), (1, 0)], true)]);
        let r = h.restore(&saved, saved.saved_unix);
        assert_eq!((r.conns.no_tenant, r.frags.restored), (1, 1));
        let (h, _) = switch(2, vec![tenant("else", &[(0, 0), (1, 0)], true)]);
        let r = h.restore(&saved, saved.saved_unix);
        assert_eq!((r.conns.no_tenant, r.frags.no_tenant), (1, 1));

        // The current timeouts cut what an entry may have left.
        let h = SwitchHandle::new(&SwitchConfig {
            ports: 2,
            tenants: vec![web_tenant(true)],
            conntrack_timeouts: Timeouts {
                tcp_established: 5,
                ..Timeouts::default()
            },
            ..SwitchConfig::default()
        })
        .unwrap();
        let r = h.restore(&saved, saved.saved_unix + 5);
        assert_eq!(r.conns.expired, 1);
    }

    #[test]
    fn entries_no_table_could_hold_are_dropped_and_counted() {
        let saved = saved_after_a_handshake(vec![web_tenant(true)]);
        let mut bad = saved.clone();
        let c = saved.conns[0];
        bad.conns = vec![
            SavedConn { tenant: 9, ..c },
            SavedConn { lo: 1 << 40, ..c },
            SavedConn {
                lo: c.hi,
                hi: c.lo,
                lo_port: c.hi_port,
                hi_port: c.lo_port,
                ..c
            },
            SavedConn {
                state: ConnState::Datagram { replied: true },
                ..c
            },
            SavedConn {
                state: ConnState::Tcp(TcpState::Established, 7),
                ..c
            },
            c,
            c,
            SavedConn {
                lo_port: c.lo_port + 1,
                ..c
            },
        ];
        bad.frags.push(SavedFrag {
            ident: 1 << 20,
            ..saved.frags[0]
        });
        // Through the file: an unknown state code (in the last
        // connection) is one no protocol has.
        let mut bytes = bad.encode();
        let state_at = HEADER + 2 + 3 + 7 * CONN + 4 + 32 + 8 + 2;
        bytes[state_at] = 9;
        let n = bytes.len() - CHECKSUM;
        let crc = crc32c::crc32c(&bytes[..n]).to_le_bytes();
        bytes[n..].copy_from_slice(&crc);
        let back = SavedTables::decode(&bytes, 100).unwrap();
        let (h, _) = switch(2, vec![web_tenant(true)]);
        let r = h.restore(&back, saved.saved_unix);
        assert_eq!(
            r.conns,
            Restored {
                restored: 1,
                invalid: 7,
                ..Restored::default()
            }
        );
        assert_eq!(
            r.frags,
            Restored {
                restored: 1,
                invalid: 1,
                ..Restored::default()
            }
        );
    }

    #[test]
    fn a_damaged_or_foreign_file_is_refused_as_a_whole() {
        let saved = saved_after_a_handshake(vec![web_tenant(true)]);
        let bytes = saved.encode();
        for i in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                assert!(
                    SavedTables::decode(&b, 100).is_err(),
                    "byte {i} bit {bit:#x}"
                );
            }
        }
        for n in 0..bytes.len() {
            assert!(SavedTables::decode(&bytes[..n], 100).is_err(), "{n} bytes");
        }
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert_eq!(SavedTables::decode(&v2, 100), Err(SavedError::Version(2)));
        assert!(matches!(
            SavedTables::decode(&bytes, 1),
            Err(SavedError::Size(_))
        ));
        assert!(bytes.len() <= SavedTables::max_len(2));
    }

    /// A carried connection is adopted once per table: after it closed
    /// and went, its 5-tuple opens a new connection like any.
    #[test]
    fn a_carried_connection_that_closed_does_not_come_back() {
        let f = FlowKey {
            src: 0x0a00_0001,
            dst: 0x0a00_0002,
            src_port: 40000,
            dst_port: 80,
            proto: proto::TCP,
            v6: false,
        };
        let k = ConnKey::of(1, &f, 0).unwrap();
        let mut t = ConnTable::new(8, 8, Timeouts::default());
        t.reserve_tenants(2);
        t.open(k, f, SYN, 0, 1).unwrap();
        let (s, _) = t.find(&k, 0).unwrap();
        assert!(t.track(s, Dir::Reply, SYN | ACK, 0) && t.track(s, Dir::Orig, ACK, 0));
        let mut saved = Vec::new();
        t.export(0, |c| saved.push(c));
        let mut carried = CarriedConns::with_capacity(1);
        assert!(carried.add(1, &saved[0], 1000));

        let mut t = ConnTable::new(8, 8, Timeouts::default());
        t.reserve_tenants(2);
        t.carry(Arc::new(carried), 0);
        let (s, dir) = t.adopt(&k, 0, 5).unwrap();
        assert_eq!(dir, Dir::Orig);
        assert!(!t.checked_at(s, 5), "the rules decide again");
        assert!(t.track(s, Dir::Orig, RST, 0));
        assert_eq!(t.find(&k, 100), None, "closed and gone");
        assert_eq!(t.adopt(&k, 100, 5), None, "not carried again");
        t.open(k, f, SYN, 100, 5).unwrap();
        assert!(t.find(&k, 100).is_some());
    }
}

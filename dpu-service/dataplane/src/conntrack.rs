//! Connection tracking for stateful rules: one table per worker, entries
//! per tenant.
//!
//! A packet that a stateful allow rule lets through opens a connection;
//! packets of either direction of that connection then pass without a
//! rule of their own, while they keep to the protocol: for TCP the
//! handshake has to be seen (only a SYN opens, the reply side must answer
//! with SYN+ACK before anything else of it passes, a RST closes), and UDP,
//! ICMP echo and other protocols are pseudo-connections that live as long
//! as packets keep coming (shorter until a reply is seen). Sequence
//! numbers are not tracked.
//!
//! A connection is known under two keys, one per direction, each with the
//! tenant in it: a packet of one tenant never matches another tenant's
//! connection. Each tenant may hold only so many entries (and the table as
//! a whole only so many), so one tenant cannot exhaust the table for the
//! others; what is refused is counted by the caller as `TableFull`.
//!
//! The table belongs to one worker and is allocated in full when the
//! worker starts; the packet path never allocates. With several workers,
//! symmetric RSS brings both directions of a flow to the same worker.
//! Time is the worker's coarse clock in seconds; expired entries go when a
//! packet meets them or when [`ConnTable::sweep`] passes by.

use crate::parse::{is_echo, proto, FlowKey};

/// TCP FIN flag.
pub const FIN: u8 = 0x01;
/// TCP SYN flag.
pub const SYN: u8 = 0x02;
/// TCP RST flag.
pub const RST: u8 = 0x04;
/// TCP ACK flag.
pub const ACK: u8 = 0x10;

/// Which way a packet travels relative to the connection's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The direction of the packet that opened the connection.
    Orig,
    /// The other direction.
    Reply,
}

/// The key a packet is tracked under: tenant and 5-tuple, with an ICMP
/// echo's identifier and kind (request or reply) in place of the ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    tenant: u32,
    src: u128,
    dst: u128,
    a: u16,
    b: u16,
    proto: u8,
    v6: bool,
}

impl ConnKey {
    /// The key of a packet of tenant `tenant` (a tenant ID that is stable
    /// across configurations) with classification key `key` and ICMP echo
    /// identifier `echo_id`. `None` for ICMP messages other than echo
    /// requests and replies, which are not tracked.
    pub fn of(tenant: u32, key: &FlowKey, echo_id: u16) -> Option<ConnKey> {
        let (a, b) = match key.proto {
            proto::ICMP | proto::ICMPV6 => {
                // The type sits in `src_port` (see FlowKey).
                let request = is_echo(key.proto, key.src_port as u8)?;
                (echo_id, u16::from(!request))
            }
            _ => (key.src_port, key.dst_port),
        };
        Some(ConnKey {
            tenant,
            src: key.src,
            dst: key.dst,
            a,
            b,
            proto: key.proto,
            v6: key.v6,
        })
    }

    /// The key of the packets going the other way. Applied twice it gives
    /// the key back.
    pub fn reply(&self) -> ConnKey {
        let (a, b) = if self.is_icmp() {
            (self.a, self.b ^ 1)
        } else {
            (self.b, self.a)
        };
        ConnKey {
            src: self.dst,
            dst: self.src,
            a,
            b,
            ..*self
        }
    }

    fn is_icmp(&self) -> bool {
        self.proto == proto::ICMP || self.proto == proto::ICMPV6
    }

    /// The tenant the key belongs to.
    pub fn tenant(&self) -> u32 {
        self.tenant
    }
}

/// How long, in seconds, a connection lives without packets, by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP before the handshake completes.
    pub tcp_handshake: u64,
    /// TCP once established.
    pub tcp_established: u64,
    /// TCP after a FIN.
    pub tcp_closing: u64,
    /// TCP after a RST.
    pub tcp_closed: u64,
    /// UDP before a reply.
    pub udp_unreplied: u64,
    /// UDP once replied.
    pub udp_replied: u64,
    /// ICMP echo.
    pub icmp: u64,
    /// Other protocols before a reply.
    pub other_unreplied: u64,
    /// Other protocols once replied.
    pub other_replied: u64,
}

impl Default for Timeouts {
    /// Close to Linux conntrack's, with an established TCP timeout of
    /// 2 h 4 min (RFC 5382's minimum) instead of five days.
    fn default() -> Self {
        Timeouts {
            tcp_handshake: 60,
            tcp_established: 7_440,
            tcp_closing: 120,
            tcp_closed: 10,
            udp_unreplied: 30,
            udp_replied: 180,
            icmp: 30,
            other_unreplied: 30,
            other_replied: 600,
        }
    }
}

/// Where a TCP connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpState {
    /// The opening SYN was seen.
    SynSent,
    /// The reply side answered with SYN+ACK.
    SynReceived,
    /// The opener acknowledged the SYN+ACK.
    Established,
    /// One side sent a FIN.
    FinWait,
    /// Both sides sent a FIN.
    Closing,
    /// A RST was seen.
    Closed,
}

/// The state of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// TCP, and which sides have sent a FIN (bit 0 opener, bit 1 replier).
    Tcp(TcpState, u8),
    /// UDP, ICMP echo or another protocol; whether a reply was seen.
    Datagram {
        /// A packet went the reply way.
        replied: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Conn {
    key: ConnKey,
    /// The classification key of the opening packet (rules are checked
    /// again against it when the configuration changes).
    orig: FlowKey,
    state: ConnState,
    /// Expiry on the caller's clock, seconds.
    expires: u64,
    /// Configuration generation the connection was last checked against.
    generation: u64,
    used: bool,
}

/// Why a connection was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The packet cannot open a connection (TCP other than a lone SYN).
    Invalid,
    /// The tenant holds as many connections as it may.
    TenantFull,
    /// The table is full.
    TableFull,
}

/// One worker's connection table.
#[derive(Debug)]
pub struct ConnTable {
    /// Both keys of every connection: slot << 1 | (1 for the reply key).
    map: hashbrown::HashMap<ConnKey, u32>,
    slots: Vec<Conn>,
    free: Vec<u32>,
    /// Connections per tenant ID.
    per_tenant: Vec<u32>,
    max: usize,
    tenant_max: u32,
    timeouts: Timeouts,
    cursor: usize,
    len: usize,
}

impl ConnTable {
    /// A table for at most `max` connections, of which one tenant may hold
    /// `tenant_max`, allocated now.
    pub fn new(max: usize, tenant_max: usize, timeouts: Timeouts) -> ConnTable {
        ConnTable {
            map: hashbrown::HashMap::with_capacity(2 * max),
            slots: Vec::with_capacity(max),
            free: Vec::with_capacity(max),
            per_tenant: Vec::new(),
            max,
            tenant_max: u32::try_from(tenant_max).unwrap_or(u32::MAX),
            timeouts,
            cursor: 0,
            len: 0,
        }
    }

    /// Makes room in the per-tenant counts for tenant IDs below `n` (call
    /// off the packet path when tenants are added).
    pub fn reserve_tenants(&mut self, n: usize) {
        if self.per_tenant.len() < n {
            self.per_tenant.resize(n, 0);
        }
    }

    /// Connections in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the table holds no connection.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Connections tenant `tenant` holds.
    pub fn tenant_len(&self, tenant: u32) -> u32 {
        self.per_tenant.get(tenant as usize).copied().unwrap_or(0)
    }

    /// The live connection `key` belongs to, and the packet's direction in
    /// it. An expired connection is removed and not returned.
    pub fn find(&mut self, key: &ConnKey, now: u64) -> Option<(u32, Dir)> {
        let v = *self.map.get(key)?;
        let slot = v >> 1;
        if self.slots[slot as usize].expires <= now {
            self.remove(slot);
            return None;
        }
        Some((slot, if v & 1 == 0 { Dir::Orig } else { Dir::Reply }))
    }

    /// The classification key of the packet that opened connection `slot`.
    pub fn orig(&self, slot: u32) -> &FlowKey {
        &self.slots[slot as usize].orig
    }

    /// The configuration generation connection `slot` was last checked
    /// against.
    pub fn generation(&self, slot: u32) -> u64 {
        self.slots[slot as usize].generation
    }

    /// Records that connection `slot` was checked against generation `g`.
    pub fn set_generation(&mut self, slot: u32, g: u64) {
        self.slots[slot as usize].generation = g;
    }

    /// The state of connection `slot`.
    pub fn state(&self, slot: u32) -> ConnState {
        self.slots[slot as usize].state
    }

    /// Moves connection `slot` on with a packet going `dir` (TCP flags
    /// `flags`, 0 for other protocols) at time `now`. False if the packet
    /// does not fit the connection's state: it must not pass, and the
    /// connection is left as it was.
    pub fn track(&mut self, slot: u32, dir: Dir, flags: u8, now: u64) -> bool {
        let t = self.timeouts;
        let c = &mut self.slots[slot as usize];
        let (state, timeout) = match c.state {
            ConnState::Tcp(s, fins) => match tcp_step(s, fins, dir, flags) {
                Some((s, fins)) => {
                    let timeout = match s {
                        TcpState::SynSent | TcpState::SynReceived => t.tcp_handshake,
                        TcpState::Established => t.tcp_established,
                        TcpState::FinWait | TcpState::Closing => t.tcp_closing,
                        TcpState::Closed => t.tcp_closed,
                    };
                    (ConnState::Tcp(s, fins), timeout)
                }
                None => return false,
            },
            ConnState::Datagram { replied } => {
                let replied = replied || dir == Dir::Reply;
                let timeout = match (c.key.proto, replied) {
                    (proto::ICMP | proto::ICMPV6, _) => t.icmp,
                    (proto::UDP, false) => t.udp_unreplied,
                    (proto::UDP, true) => t.udp_replied,
                    (_, false) => t.other_unreplied,
                    (_, true) => t.other_replied,
                };
                (ConnState::Datagram { replied }, timeout)
            }
        };
        c.state = state;
        c.expires = now + timeout;
        true
    }

    /// Opens a connection for the packet with key `key`, classification
    /// key `orig` and TCP flags `flags`, checked against generation
    /// `generation`. The caller has made sure `key` is not in the table.
    pub fn open(
        &mut self,
        key: ConnKey,
        orig: FlowKey,
        flags: u8,
        now: u64,
        generation: u64,
    ) -> Result<u32, Refused> {
        let t = self.timeouts;
        let (state, timeout) = match key.proto {
            proto::TCP if flags & (SYN | ACK | RST | FIN) == SYN => {
                (ConnState::Tcp(TcpState::SynSent, 0), t.tcp_handshake)
            }
            proto::TCP => return Err(Refused::Invalid),
            // Only a request opens an echo pseudo-connection.
            proto::ICMP | proto::ICMPV6 if key.b != 0 => return Err(Refused::Invalid),
            proto::ICMP | proto::ICMPV6 => (ConnState::Datagram { replied: false }, t.icmp),
            proto::UDP => (ConnState::Datagram { replied: false }, t.udp_unreplied),
            _ => (ConnState::Datagram { replied: false }, t.other_unreplied),
        };
        let reply = key.reply();
        if self.map.contains_key(&reply) {
            // The reverse belongs to another connection: never two owners.
            return Err(Refused::Invalid);
        }
        let tenant = key.tenant as usize;
        if tenant >= self.per_tenant.len() || self.per_tenant[tenant] >= self.tenant_max {
            return Err(Refused::TenantFull);
        }
        let conn = Conn {
            key,
            orig,
            state,
            expires: now + timeout,
            generation,
            used: true,
        };
        let slot = if let Some(s) = self.free.pop() {
            self.slots[s as usize] = conn;
            s
        } else if self.slots.len() < self.max {
            self.slots.push(conn);
            (self.slots.len() - 1) as u32
        } else {
            return Err(Refused::TableFull);
        };
        self.map.insert(key, slot << 1);
        self.map.insert(reply, slot << 1 | 1);
        self.per_tenant[tenant] += 1;
        self.len += 1;
        Ok(slot)
    }

    /// Removes connection `slot` (both its keys).
    pub fn remove(&mut self, slot: u32) {
        let c = &mut self.slots[slot as usize];
        if !c.used {
            return;
        }
        c.used = false;
        let key = c.key;
        self.map.remove(&key);
        self.map.remove(&key.reply());
        if let Some(n) = self.per_tenant.get_mut(key.tenant as usize) {
            *n = n.saturating_sub(1);
        }
        self.free.push(slot);
        self.len -= 1;
    }

    /// Looks at up to `budget` slots from where the last sweep stopped and
    /// removes connections that expired or whose tenant `keep` refuses.
    /// Returns how many went.
    pub fn sweep(&mut self, now: u64, budget: usize, keep: impl Fn(u32) -> bool) -> usize {
        let mut removed = 0;
        for _ in 0..budget.min(self.slots.len()) {
            if self.cursor >= self.slots.len() {
                self.cursor = 0;
            }
            let s = self.cursor;
            self.cursor += 1;
            let c = &self.slots[s];
            if c.used && (c.expires <= now || !keep(c.key.tenant)) {
                self.remove(s as u32);
                removed += 1;
            }
        }
        removed
    }
}

/// The TCP state after a packet with `flags` going `dir`, or `None` if
/// the packet does not belong in state `s`.
fn tcp_step(s: TcpState, fins: u8, dir: Dir, flags: u8) -> Option<(TcpState, u8)> {
    use TcpState::*;
    let syn = flags & (SYN | ACK) == SYN;
    let syn_ack = flags & (SYN | ACK) == SYN | ACK;
    if flags & RST != 0 {
        // A RST ends the connection from either side (nothing after it
        // passes but a new SYN).
        return (s != Closed).then_some((Closed, fins));
    }
    let fin_bit = if dir == Dir::Orig { 1 } else { 2 };
    let fins_after = if flags & FIN != 0 {
        fins | fin_bit
    } else {
        fins
    };
    let closing = |fins: u8| if fins == 3 { Closing } else { FinWait };
    match (s, dir) {
        // A new connection on the same ports once the old one is over.
        (Closing | Closed, Dir::Orig) if syn => Some((SynSent, 0)),
        (Closed, _) => None,
        (SynSent, Dir::Orig) => syn.then_some((SynSent, 0)),
        (SynSent, Dir::Reply) => syn_ack.then_some((SynReceived, 0)),
        (SynReceived, Dir::Orig) if syn => Some((SynReceived, 0)),
        (SynReceived, Dir::Orig) if flags & (SYN | ACK) == ACK => Some(if fins_after != 0 {
            (closing(fins_after), fins_after)
        } else {
            (Established, 0)
        }),
        (SynReceived, Dir::Reply) => syn_ack.then_some((SynReceived, 0)),
        (SynReceived, Dir::Orig) => None,
        // Once established, no side may start over.
        (Established | FinWait | Closing, _) if flags & SYN != 0 => None,
        (Established, _) if fins_after != 0 => Some((FinWait, fins_after)),
        (Established, _) => Some((Established, 0)),
        (FinWait | Closing, _) => Some((closing(fins_after), fins_after)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(proto: u8, sport: u16, dport: u16) -> FlowKey {
        FlowKey {
            src: 0x0a00_0001,
            dst: 0x0a00_0002,
            src_port: sport,
            dst_port: dport,
            proto,
            v6: false,
        }
    }

    fn table() -> ConnTable {
        let mut t = ConnTable::new(8, 4, Timeouts::default());
        t.reserve_tenants(4);
        t
    }

    /// Opens with `first` then runs `rest` ((dir, flags, expected pass)).
    fn tcp_script(rest: &[(Dir, u8, bool)]) -> ConnTable {
        let mut t = table();
        let f = flow(proto::TCP, 40000, 80);
        let k = ConnKey::of(1, &f, 0).unwrap();
        let slot = t.open(k, f, SYN, 0, 1).unwrap();
        for (i, &(dir, flags, pass)) in rest.iter().enumerate() {
            let key = if dir == Dir::Orig { k } else { k.reply() };
            let (s, d) = t.find(&key, 1).expect("connection");
            assert_eq!((s, d), (slot, dir));
            assert_eq!(
                t.track(s, d, flags, 1),
                pass,
                "step {i}: {dir:?} {flags:#x}"
            );
        }
        t
    }

    #[test]
    fn keys_of_both_directions() {
        let f = flow(proto::UDP, 1000, 53);
        let k = ConnKey::of(7, &f, 0).unwrap();
        assert_eq!(k.reply(), ConnKey::of(7, &f.reversed(), 0).unwrap());
        assert_eq!(k.reply().reply(), k);
        assert_ne!(k, ConnKey::of(8, &f, 0).unwrap(), "tenant is in the key");

        // Echo request (type 8) and its reply (type 0) meet on one key pair.
        let req = FlowKey {
            src_port: 8,
            dst_port: 0,
            ..flow(proto::ICMP, 0, 0)
        };
        let rep = FlowKey {
            src_port: 0,
            ..req.reversed()
        };
        let kq = ConnKey::of(1, &req, 77).unwrap();
        assert_eq!(kq.reply(), ConnKey::of(1, &rep, 77).unwrap());
        assert_ne!(kq.reply(), ConnKey::of(1, &rep, 78).unwrap(), "identifier");
        // A request the other way is not a reply.
        let back = FlowKey {
            src_port: 8,
            ..req.reversed()
        };
        assert_ne!(kq.reply(), ConnKey::of(1, &back, 77).unwrap());
        // Other ICMP messages are not tracked.
        let unreach = FlowKey {
            src_port: 3,
            dst_port: 1,
            ..req
        };
        assert_eq!(ConnKey::of(1, &unreach, 0), None);
    }

    #[test]
    fn tcp_handshake_data_and_close() {
        let t = tcp_script(&[
            (Dir::Orig, SYN, true),         // retransmitted SYN
            (Dir::Reply, ACK, false),       // no ACK before the SYN+ACK
            (Dir::Reply, SYN | ACK, true),  // SYN+ACK
            (Dir::Orig, ACK, true),         // handshake done
            (Dir::Reply, ACK | 0x08, true), // data
            (Dir::Orig, SYN, false),        // no restart while open
            (Dir::Orig, FIN | ACK, true),   // opener closes
            (Dir::Reply, ACK, true),        // half-closed side still talks
            (Dir::Reply, FIN | ACK, true),  // replier closes
            (Dir::Orig, ACK, true),         // last ACK
        ]);
        assert_eq!(t.state(0), ConnState::Tcp(TcpState::Closing, 3));
    }

    #[test]
    fn tcp_rst_ends_and_only_a_syn_reopens() {
        let mut t = tcp_script(&[
            (Dir::Reply, SYN | ACK, true),
            (Dir::Orig, ACK, true),
            (Dir::Reply, RST, true),
            (Dir::Reply, ACK, false),
            (Dir::Orig, ACK, false),
            (Dir::Orig, SYN, true),
        ]);
        assert_eq!(t.state(0), ConnState::Tcp(TcpState::SynSent, 0));
        // Closed connections expire fast.
        assert!(t.track(0, Dir::Reply, RST, 100));
        let k = t.slots[0].key;
        assert_eq!(t.find(&k, 100 + 10), None);
        assert!(t.is_empty());
    }

    #[test]
    fn only_a_lone_syn_opens_tcp() {
        let mut t = table();
        for flags in [ACK, RST, FIN, SYN | ACK, SYN | RST, 0] {
            let f = flow(proto::TCP, 40000, 80);
            let k = ConnKey::of(1, &f, 0).unwrap();
            assert_eq!(
                t.open(k, f, flags, 0, 1),
                Err(Refused::Invalid),
                "{flags:#x}"
            );
        }
        assert!(t.is_empty());
        // An echo reply opens nothing either.
        let rep = flow(proto::ICMP, 0, 0);
        let k = ConnKey::of(1, &rep, 5).unwrap();
        assert_eq!(t.open(k, rep, 0, 0, 1), Err(Refused::Invalid));
    }

    #[test]
    fn datagram_timeouts_grow_once_replied() {
        let mut t = table();
        let f = flow(proto::UDP, 1000, 53);
        let k = ConnKey::of(1, &f, 0).unwrap();
        let s = t.open(k, f, 0, 0, 1).unwrap();
        assert!(t.find(&k, 29).is_some());
        assert!(t.track(s, Dir::Orig, 0, 29));
        // Unreplied: 30 s from the last packet.
        assert!(t.find(&k.reply(), 58).is_some());
        assert!(t.track(s, Dir::Reply, 0, 58));
        assert_eq!(t.state(s), ConnState::Datagram { replied: true });
        assert!(t.find(&k, 58 + 179).is_some());
        assert_eq!(t.find(&k, 58 + 180), None, "expired");
        assert_eq!(t.find(&k.reply(), 0), None, "both keys went");
        assert_eq!(t.tenant_len(1), 0);
    }

    #[test]
    fn limits_per_tenant_and_in_all() {
        let mut t = table(); // 8 in all, 4 per tenant
        let mut opened = Vec::new();
        for tenant in 0..3u32 {
            for port in 0..5u16 {
                let f = flow(proto::UDP, 1000 + port, 53);
                let k = ConnKey::of(tenant, &f, 0).unwrap();
                let r = t.open(k, f, 0, 0, 1);
                match (tenant, port) {
                    (0 | 1, 0..=3) => opened.push(r.unwrap()),
                    (0 | 1, _) => assert_eq!(r, Err(Refused::TenantFull)),
                    (2, _) => assert_eq!(r, Err(Refused::TableFull)),
                    _ => unreachable!(),
                }
            }
        }
        assert_eq!((t.len(), t.tenant_len(0), t.tenant_len(2)), (8, 4, 0));
        // Freed slots are reused.
        t.remove(opened[0]);
        let f = flow(proto::UDP, 9, 9);
        assert!(t.open(ConnKey::of(2, &f, 0).unwrap(), f, 0, 0, 1).is_ok());
        // A tenant ID nobody reserved is refused, not a panic.
        assert_eq!(
            t.open(ConnKey::of(99, &f, 0).unwrap(), f, 0, 0, 1),
            Err(Refused::TenantFull)
        );
    }

    #[test]
    fn sweep_removes_expired_and_dead_tenants() {
        let mut t = table();
        for (tenant, port) in [(0u32, 1u16), (1, 2), (1, 3)] {
            let f = flow(proto::UDP, port, 53);
            t.open(ConnKey::of(tenant, &f, 0).unwrap(), f, 0, 0, 1)
                .unwrap();
        }
        assert_eq!(t.sweep(1, 100, |tenant| tenant != 0), 1, "tenant 0 is gone");
        assert_eq!(t.sweep(30, 2, |_| true), 1, "a budget of two slots");
        assert_eq!(t.sweep(30, 100, |_| true), 1);
        assert!(t.is_empty());
        assert!(t.map.is_empty());
    }
}

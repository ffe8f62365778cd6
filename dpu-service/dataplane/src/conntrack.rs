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
//! connection. Each tenant may hold only so many entries, and keeps a
//! reserved share of the table that no other tenant's connections can
//! take, however many tenants flood it ([`Shares`]); what is refused is
//! counted by the caller as `TableFull`.
//!
//! The table belongs to one worker and is allocated in full when the
//! worker starts; the packet path never allocates. With several workers,
//! symmetric RSS brings both directions of a flow to the same worker.
//! Time is the worker's coarse clock in seconds; expired entries go when a
//! packet meets them or when [`ConnTable::sweep`] passes by.

use std::sync::Arc;

use crate::carry::{Carried, CarriedView};
use crate::fair_share::{Full, ShareLimits, Shares};
use crate::linear_probe::{self, Probed};
use crate::wire::{is_echo, proto, FlowKey};

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

/// The part of a connection's key that is hashed: the tenant, the two
/// endpoints in a canonical order (lower address and port first; for ICMP
/// echo the requester first, with the identifier), protocol and family.
/// Both directions of a connection have the same canonical key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Canon {
    tenant: u32,
    lo: [u32; 4],
    hi: [u32; 4],
    lo_port: u16,
    hi_port: u16,
    proto: u8,
    v6: bool,
}

/// The key a packet is tracked under: its tenant, its 5-tuple (with an
/// ICMP echo's identifier in place of the ports) in canonical order, and
/// which end of it the packet comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnKey {
    canon: Canon,
    /// The packet comes from the `lo` end.
    from_lo: bool,
    /// `canon` hashed ([`canon_hash`]): once per packet, whatever the
    /// table does with the key (prefetch, look up, open).
    hash: u32,
}

/// The hash of a canonical key: keyed once per process with a random
/// key, so that no one can choose 5-tuples that collide in every table.
fn canon_hash(c: &Canon) -> u32 {
    use std::hash::BuildHasher;
    static HASHER: std::sync::OnceLock<hashbrown::DefaultHashBuilder> = std::sync::OnceLock::new();
    HASHER.get_or_init(Default::default).hash_one(c) as u32
}

fn words(a: u128) -> [u32; 4] {
    [
        (a >> 96) as u32,
        (a >> 64) as u32,
        (a >> 32) as u32,
        a as u32,
    ]
}

fn unwords(w: [u32; 4]) -> u128 {
    w.iter().fold(0, |a, &x| (a << 32) | u128::from(x))
}

impl ConnKey {
    /// The key of a packet of tenant `tenant` (a tenant ID that is stable
    /// across configurations) with classification key `key` and ICMP echo
    /// identifier `echo_id`. `None` for ICMP messages other than echo
    /// requests and replies, which are not tracked.
    pub fn of(tenant: u32, key: &FlowKey, echo_id: u16) -> Option<ConnKey> {
        let (src, dst) = (words(key.src), words(key.dst));
        let (lo, hi, lo_port, hi_port, from_lo) = match key.proto {
            proto::ICMP | proto::ICMPV6 => {
                // The type sits in `src_port` (see FlowKey). The requester
                // is `lo`: a request comes from it, a reply goes to it.
                if is_echo(key.proto, key.src_port as u8)? {
                    (src, dst, echo_id, 0, true)
                } else {
                    (dst, src, echo_id, 0, false)
                }
            }
            _ if (src, key.src_port) <= (dst, key.dst_port) => {
                (src, dst, key.src_port, key.dst_port, true)
            }
            _ => (dst, src, key.dst_port, key.src_port, false),
        };
        let canon = Canon {
            tenant,
            lo,
            hi,
            lo_port,
            hi_port,
            proto: key.proto,
            v6: key.v6,
        };
        Some(ConnKey {
            canon,
            from_lo,
            hash: canon_hash(&canon),
        })
    }

    /// The tenant the key belongs to.
    pub fn tenant(&self) -> u32 {
        self.canon.tenant
    }

    fn is_icmp(&self) -> bool {
        self.canon.proto == proto::ICMP || self.canon.proto == proto::ICMPV6
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

impl Timeouts {
    /// The timeout of a connection of protocol `proto` in state `state`:
    /// what it has after a packet.
    #[inline]
    pub fn of(&self, proto: u8, state: ConnState) -> u64 {
        match state {
            ConnState::Tcp(s, _) => match s {
                TcpState::SynSent | TcpState::SynReceived => self.tcp_handshake,
                TcpState::Established => self.tcp_established,
                TcpState::FinWait | TcpState::Closing => self.tcp_closing,
                TcpState::Closed => self.tcp_closed,
            },
            ConnState::Datagram { replied } => match (proto, replied) {
                (proto::ICMP | proto::ICMPV6, _) => self.icmp,
                (proto::UDP, false) => self.udp_unreplied,
                (proto::UDP, true) => self.udp_replied,
                (_, false) => self.other_unreplied,
                (_, true) => self.other_replied,
            },
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

/// A connection as it is carried across a restart
/// ([`ConnTable::export`]): its key, with the tenant's ID in the process
/// that saved it, which end opened it, its state and the seconds it had
/// left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedConn {
    /// The tenant's ID.
    pub tenant: u32,
    /// The lower endpoint's address (for ICMP echo: the requester).
    pub lo: u128,
    /// The other endpoint's address.
    pub hi: u128,
    /// The lower endpoint's port (for ICMP echo: the identifier).
    pub lo_port: u16,
    /// The other endpoint's port (0 for ICMP echo).
    pub hi_port: u16,
    /// IP protocol.
    pub proto: u8,
    /// IPv6.
    pub v6: bool,
    /// The opening packet came from the `lo` end.
    pub orig_lo: bool,
    /// The opening packet's ports (ICMP type and code), as classified.
    pub orig_ports: (u16, u16),
    /// Where the connection was.
    pub state: ConnState,
    /// Seconds it had left without another packet.
    pub ttl: u32,
}

impl SavedConn {
    /// True if a table could have held this connection: its endpoints in
    /// canonical order, IPv4 addresses within 32 bits, a TCP state for
    /// TCP and only for it, ICMP of its own family, an echo opened by its
    /// requester. What fails this is dropped, not adopted.
    pub fn is_sound(&self) -> bool {
        let v4 = |a: u128| a >> 32 == 0;
        let family = self.v6 || (v4(self.lo) && v4(self.hi));
        let shape = match self.proto {
            proto::ICMP => !self.v6 && self.hi_port == 0 && self.orig_lo,
            proto::ICMPV6 => self.v6 && self.hi_port == 0 && self.orig_lo,
            _ => (self.lo, self.lo_port) <= (self.hi, self.hi_port),
        };
        let state = match self.state {
            ConnState::Tcp(_, fins) => self.proto == proto::TCP && fins <= 3,
            ConnState::Datagram { .. } => self.proto != proto::TCP,
        };
        family && shape && state
    }

    fn canon(&self, tenant: u32) -> Canon {
        Canon {
            tenant,
            lo: words(self.lo),
            hi: words(self.hi),
            lo_port: self.lo_port,
            hi_port: self.hi_port,
            proto: self.proto,
            v6: self.v6,
        }
    }
}

/// What a carried connection brings into a worker's table besides its key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parked {
    orig_lo: bool,
    orig_ports: (u16, u16),
    state: ConnState,
}

/// Connections carried over from a previous process, by key.
pub(crate) type CarriedConns = Carried<Canon, Parked>;

impl CarriedConns {
    /// Adds connection `c` as tenant `tenant` of this process (its ID
    /// may differ from the saved one), expiring `expires` seconds after
    /// the map was made. False if it is there already.
    pub(crate) fn add(&mut self, tenant: u32, c: &SavedConn, expires: u32) -> bool {
        let parked = Parked {
            orig_lo: c.orig_lo,
            orig_ports: c.orig_ports,
            state: c.state,
        };
        self.insert(c.canon(tenant), expires, parked)
    }
}

/// One bucket of the table: a whole cache line, so a lookup that finds
/// its connection at home touches one line.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    key: Canon,
    /// The key's hash, to move entries on removal without rehashing.
    hash: u32,
    /// Expiry on the caller's clock, seconds.
    expires: u32,
    /// Low bits of the configuration generation the connection was last
    /// checked against.
    generation: u32,
    /// The opening packet's ports (ICMP type and code), as classified.
    orig_ports: (u16, u16),
    state: ConnState,
    used: bool,
    /// [`ORIG_LO`], and which directions are offered to flow hardware
    /// ([`OFFLOADED_ORIG`], [`OFFLOADED_REPLY`]): while any is, the
    /// connection does not expire here (its packets go by in hardware;
    /// its age there decides).
    flags: u8,
}

/// [`Bucket::flags`]: the opening packet came from the `lo` end.
const ORIG_LO: u8 = 0x80;
/// [`Bucket::flags`]: the directions offered to flow hardware.
const OFFLOADED: u8 = OFFLOADED_ORIG | OFFLOADED_REPLY;
/// [`Bucket::flags`]: hardware refused an offer of the connection; it
/// stays in software for good.
const OFFLOAD_REFUSED: u8 = 0x04;

impl Bucket {
    fn orig_lo(&self) -> bool {
        self.flags & ORIG_LO != 0
    }

    fn offloaded(&self) -> u8 {
        self.flags & OFFLOADED
    }
}

fn orig_flag(orig_lo: bool) -> u8 {
    if orig_lo {
        ORIG_LO
    } else {
        0
    }
}

/// [`ConnTable::offloaded`]: the opening direction is in hardware.
pub const OFFLOADED_ORIG: u8 = 1;
/// [`ConnTable::offloaded`]: the reply direction is in hardware.
pub const OFFLOADED_REPLY: u8 = 2;

/// The [`ConnTable::offloaded`] bit of direction `dir`.
pub fn offload_bit(dir: Dir) -> u8 {
    match dir {
        Dir::Orig => OFFLOADED_ORIG,
        Dir::Reply => OFFLOADED_REPLY,
    }
}

const EMPTY: Bucket = Bucket {
    key: Canon {
        tenant: 0,
        lo: [0; 4],
        hi: [0; 4],
        lo_port: 0,
        hi_port: 0,
        proto: 0,
        v6: false,
    },
    hash: 0,
    expires: 0,
    generation: 0,
    orig_ports: (0, 0),
    state: ConnState::Datagram { replied: false },
    used: false,
    flags: 0,
};

impl Probed for Bucket {
    fn used(&self) -> bool {
        self.used
    }

    fn clear(&mut self) {
        self.used = false;
    }

    fn hash(&self) -> u32 {
        self.hash
    }
}

/// Why a connection was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The packet cannot open a connection (TCP other than a lone SYN).
    Invalid,
    /// The tenant holds as many connections as it may.
    TenantFull,
    /// The table is full, but for other tenants' reserves.
    TableFull,
}

/// One worker's connection table: open addressing with linear probing,
/// at most half full, one entry per connection, removal by backward shift
/// (no tombstones). Hashes are keyed per table, so nobody outside can aim
/// packets at one chain.
#[derive(Debug)]
pub struct ConnTable {
    buckets: Box<[Bucket]>,
    mask: usize,
    /// Connections per tenant ID, against the tenants' shares.
    shares: Shares,
    timeouts: Timeouts,
    cursor: usize,
    /// Connections carried over from a previous process, adopted on a
    /// miss ([`ConnTable::adopt`]) until they would all have
    /// expired.
    carried: Option<CarriedView<Canon, Parked>>,
}

/// Seconds as stored in a bucket (the worker clock starts at 0, so this
/// lasts 136 years).
fn secs(t: u64) -> u32 {
    u32::try_from(t).unwrap_or(u32::MAX)
}

impl ConnTable {
    /// A table for at most `max` connections, of which one tenant may hold
    /// `tenant_max`, with nothing reserved, allocated now (64 bytes per
    /// bucket, two buckets per connection).
    pub fn new(max: usize, tenant_max: usize, timeouts: Timeouts) -> ConnTable {
        ConnTable::with_shares(
            ShareLimits {
                max,
                per_tenant: tenant_max,
                reserved: 0,
            },
            timeouts,
        )
    }

    /// A table for `limits.max` connections shared among tenants as
    /// `limits` says ([`Shares`]), allocated now.
    pub fn with_shares(limits: ShareLimits, timeouts: Timeouts) -> ConnTable {
        let n = (2 * limits.max).next_power_of_two().max(16);
        ConnTable {
            buckets: vec![EMPTY; n].into_boxed_slice(),
            mask: n - 1,
            shares: Shares::new(limits),
            timeouts,
            cursor: 0,
            carried: None,
        }
    }

    /// Lets this table adopt the connections of `carried`, whose clock
    /// started `offset` seconds before this table's.
    pub(crate) fn carry(&mut self, carried: Arc<CarriedConns>, offset: u64) {
        self.carried = Some(CarriedView::new(carried, offset));
    }

    /// Forgets the carried connections once they would all have expired
    /// at `now` (call now and then, off the packet path).
    pub(crate) fn forget_carried(&mut self, now: u64) {
        if self.carried.as_ref().is_some_and(|c| c.spent(now)) {
            self.carried = None;
        }
    }

    /// Every live connection at `now`, handed to `f` with the seconds it
    /// has left: what a restart carries over.
    pub fn export(&self, now: u64, mut f: impl FnMut(SavedConn)) {
        for b in self.buckets.iter().filter(|b| b.used) {
            let left = b.expires.checked_sub(secs(now)).filter(|&t| t > 0);
            // A connection in flow hardware had its packets there: it is
            // as alive as a packet now would make it.
            let ttl = match left {
                _ if b.offloaded() != 0 => Some(
                    left.unwrap_or(0)
                        .max(secs(self.timeouts.of(b.key.proto, b.state))),
                ),
                left => left,
            };
            let Some(ttl) = ttl else {
                continue;
            };
            f(SavedConn {
                tenant: b.key.tenant,
                lo: unwords(b.key.lo),
                hi: unwords(b.key.hi),
                lo_port: b.key.lo_port,
                hi_port: b.key.hi_port,
                proto: b.key.proto,
                v6: b.key.v6,
                orig_lo: b.orig_lo(),
                orig_ports: b.orig_ports,
                state: b.state,
                ttl,
            });
        }
    }

    /// Makes room in the per-tenant counts for tenant IDs below `n` (call
    /// off the packet path when tenants are added).
    pub fn reserve_tenants(&mut self, n: usize) {
        self.shares.reserve_tenants(n);
    }

    /// Divides the table among `n` tenants that track connections, each
    /// with its reserve (off the packet path).
    pub fn set_tenants(&mut self, n: usize) {
        self.shares.set_tenants(n);
    }

    /// The reserve each tenant has in this table.
    pub fn reserve(&self) -> u32 {
        self.shares.reserve()
    }

    /// Connections in the table.
    pub fn len(&self) -> usize {
        self.shares.len() as usize
    }

    /// True if the table holds no connection.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// Connections tenant `tenant` holds.
    pub fn tenant_len(&self, tenant: u32) -> u32 {
        self.shares.held(tenant)
    }

    /// The bucket holding `key`, or the empty one where it would go.
    fn probe(&self, key: &Canon, hash: u32) -> (usize, bool) {
        let mut i = hash as usize & self.mask;
        loop {
            let b = &self.buckets[i];
            if !b.used {
                return (i, false);
            }
            if b.hash == hash && b.key == *key {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Starts loading the bucket where the search for `key` begins, so
    /// that a burst's table misses overlap instead of coming one after
    /// another.
    #[inline]
    pub fn prefetch(&self, key: &ConnKey) {
        let i = key.hash as usize & self.mask;
        if let Some(b) = self.buckets.get(i) {
            dpu_os::cache::prefetch(b);
        }
    }

    /// The live connection `key` belongs to, and the packet's direction in
    /// it. An expired connection is removed and not returned.
    pub fn find(&mut self, key: &ConnKey, now: u64) -> Option<(u32, Dir)> {
        let (i, found) = self.probe(&key.canon, key.hash);
        if !found {
            return None;
        }
        if u64::from(self.buckets[i].expires) <= now && self.buckets[i].offloaded() == 0 {
            self.remove(i as u32);
            return None;
        }
        let dir = if key.from_lo == self.buckets[i].orig_lo() {
            Dir::Orig
        } else {
            Dir::Reply
        };
        Some((i as u32, dir))
    }

    /// True if this table may adopt connections carried over from a
    /// previous process ([`ConnTable::adopt`]).
    #[inline]
    pub fn carries(&self) -> bool {
        self.carried.is_some()
    }

    /// What to do on a miss of [`ConnTable::find`] when the table
    /// [`carries`](ConnTable::carries) connections of a previous process:
    /// the one under `key`, if there is one this table has not adopted
    /// before and its tenant has room, joins the table, marked as checked
    /// against no generation, so that the current rules decide (as after
    /// a configuration change) whether it may stay. Out of line: the hit
    /// path stays as it is.
    #[cold]
    #[inline(never)]
    pub fn adopt(&mut self, key: &ConnKey, now: u64, generation: u64) -> Option<(u32, Dir)> {
        let (i, found) = self.probe(&key.canon, key.hash);
        if found {
            // Not a miss after all: the table's own entry stands.
            return None;
        }
        let (expires, parked) = self.carried.as_mut()?.take(&key.canon, now)?;
        let tenant = key.canon.tenant;
        self.shares.check(tenant).ok()?;
        self.shares.take(tenant);
        self.buckets[i] = Bucket {
            key: key.canon,
            hash: key.hash,
            expires: secs(expires),
            generation: (generation as u32).wrapping_sub(1),
            orig_ports: parked.orig_ports,
            state: parked.state,
            used: true,
            flags: orig_flag(parked.orig_lo),
        };
        let dir = if key.from_lo == parked.orig_lo {
            Dir::Orig
        } else {
            Dir::Reply
        };
        Some((i as u32, dir))
    }

    /// True if `key` belongs to a connection that is live at `now` and was
    /// last checked against generation `g`: what [`ConnTable::find`] and
    /// [`ConnTable::checked_at`] would say, without changing anything.
    pub fn is_current(&self, key: &ConnKey, now: u64, g: u64) -> bool {
        let (i, found) = self.probe(&key.canon, key.hash);
        found && u64::from(self.buckets[i].expires) > now && self.checked_at(i as u32, g)
    }

    /// The classification key of the packet that opened connection `slot`.
    pub fn orig(&self, slot: u32) -> FlowKey {
        let b = &self.buckets[slot as usize];
        let (src, dst) = if b.orig_lo() {
            (b.key.lo, b.key.hi)
        } else {
            (b.key.hi, b.key.lo)
        };
        FlowKey {
            src: unwords(src),
            dst: unwords(dst),
            src_port: b.orig_ports.0,
            dst_port: b.orig_ports.1,
            proto: b.key.proto,
            v6: b.key.v6,
        }
    }

    /// True if connection `slot` was last checked against generation `g`.
    pub fn checked_at(&self, slot: u32, g: u64) -> bool {
        self.buckets[slot as usize].generation == g as u32
    }

    /// Records that connection `slot` was checked against generation `g`.
    pub fn set_generation(&mut self, slot: u32, g: u64) {
        self.buckets[slot as usize].generation = g as u32;
    }

    /// Which directions of connection `slot` are offered to flow
    /// hardware ([`OFFLOADED_ORIG`], [`OFFLOADED_REPLY`]).
    #[inline]
    pub fn offloaded(&self, slot: u32) -> u8 {
        self.buckets[slot as usize].offloaded()
    }

    /// Moves connection `slot`'s expiry to what a packet `ago` seconds
    /// before `now` would have left it, if that is later: its packets went
    /// by in flow hardware, which says when it last saw one.
    pub fn seen_in_hardware(&mut self, slot: u32, now: u64, ago: u64) {
        let b = &self.buckets[slot as usize];
        let timeout = self.timeouts.of(b.key.proto, b.state);
        let expires = secs((now + timeout).saturating_sub(ago));
        let b = &mut self.buckets[slot as usize];
        b.expires = b.expires.max(expires);
    }

    /// Whether flow hardware refused an offer of connection `slot` (it is
    /// not offered again).
    #[inline]
    pub fn offload_refused(&self, slot: u32) -> bool {
        self.buckets[slot as usize].flags & OFFLOAD_REFUSED != 0
    }

    /// Records that flow hardware refused an offer of connection `slot`.
    #[inline]
    pub fn set_offload_refused(&mut self, slot: u32) {
        self.buckets[slot as usize].flags |= OFFLOAD_REFUSED;
    }

    /// Sets which directions of connection `slot` are offered to flow
    /// hardware.
    #[inline]
    pub fn set_offloaded(&mut self, slot: u32, bits: u8) {
        let b = &mut self.buckets[slot as usize];
        b.flags = (b.flags & !OFFLOADED) | (bits & OFFLOADED);
    }

    /// The state of connection `slot`.
    pub fn state(&self, slot: u32) -> ConnState {
        self.buckets[slot as usize].state
    }

    /// Moves connection `slot` on with a packet going `dir` (TCP flags
    /// `flags`, 0 for other protocols) at time `now`. False if the packet
    /// does not fit the connection's state: it must not pass, and the
    /// connection is left as it was.
    pub fn track(&mut self, slot: u32, dir: Dir, flags: u8, now: u64) -> bool {
        let b = &self.buckets[slot as usize];
        let state = match b.state {
            ConnState::Tcp(s, fins) => match tcp_step(s, fins, dir, flags) {
                Some((s, fins)) => ConnState::Tcp(s, fins),
                None => return false,
            },
            ConnState::Datagram { replied } => ConnState::Datagram {
                replied: replied || dir == Dir::Reply,
            },
        };
        let timeout = self.timeouts.of(b.key.proto, state);
        let b = &mut self.buckets[slot as usize];
        b.state = state;
        b.expires = secs(now + timeout);
        true
    }

    /// Opens a connection for the packet with key `key`, classification
    /// key `orig` and TCP flags `flags`, checked against generation
    /// `generation`. A connection already under `key` is refused as
    /// invalid (callers look it up first).
    pub fn open(
        &mut self,
        key: ConnKey,
        orig: FlowKey,
        flags: u8,
        now: u64,
        generation: u64,
    ) -> Result<u32, Refused> {
        let t = self.timeouts;
        let (state, timeout) = match key.canon.proto {
            proto::TCP if flags & (SYN | ACK | RST | FIN) == SYN => {
                (ConnState::Tcp(TcpState::SynSent, 0), t.tcp_handshake)
            }
            proto::TCP => return Err(Refused::Invalid),
            // Only a request opens an echo pseudo-connection.
            _ if key.is_icmp() && !key.from_lo => return Err(Refused::Invalid),
            _ if key.is_icmp() => (ConnState::Datagram { replied: false }, t.icmp),
            proto::UDP => (ConnState::Datagram { replied: false }, t.udp_unreplied),
            _ => (ConnState::Datagram { replied: false }, t.other_unreplied),
        };
        let hash = key.hash;
        let (i, found) = self.probe(&key.canon, hash);
        if found {
            return Err(Refused::Invalid);
        }
        let tenant = key.canon.tenant;
        match self.shares.check(tenant) {
            Ok(()) => {}
            Err(Full::Tenant) => return Err(Refused::TenantFull),
            Err(Full::Pool) => return Err(Refused::TableFull),
        }
        self.buckets[i] = Bucket {
            key: key.canon,
            hash,
            expires: secs(now + timeout),
            generation: generation as u32,
            orig_ports: (orig.src_port, orig.dst_port),
            state,
            used: true,
            flags: orig_flag(key.from_lo),
        };
        self.shares.take(tenant);
        Ok(i as u32)
    }

    /// Removes connection `slot`. Entries of the same probe chain move
    /// back into the gap, so slot numbers from before are stale after.
    pub fn remove(&mut self, slot: u32) {
        if !self.buckets[slot as usize].used {
            return;
        }
        self.shares.give(self.buckets[slot as usize].key.tenant);
        linear_probe::remove(&mut self.buckets, self.mask, slot as usize);
    }

    /// Moves past up to `budget` buckets from where the last sweep stopped
    /// and removes connections that expired or whose tenant `keep`
    /// refuses, at most `budget` of them. Returns how many went. A budget
    /// of the table's size covers every bucket.
    pub fn sweep(&mut self, now: u64, budget: usize, keep: impl Fn(u32) -> bool) -> usize {
        let mut removed = 0;
        let mut passed = 0;
        while passed < budget && removed < budget {
            let b = &self.buckets[self.cursor];
            let expired = u64::from(b.expires) <= now && b.offloaded() == 0;
            if b.used && (expired || !keep(b.key.tenant)) {
                // Look at this bucket again: a later entry may move in
                // (backward shift only ever fills the hole being looked
                // at, never a bucket already passed). Ends: every removal
                // empties a bucket for good.
                self.remove(self.cursor as u32);
                removed += 1;
            } else {
                self.cursor = (self.cursor + 1) & self.mask;
                passed += 1;
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

    fn key(tenant: u32, f: &FlowKey) -> ConnKey {
        ConnKey::of(tenant, f, 0).unwrap()
    }

    fn table() -> ConnTable {
        let mut t = ConnTable::new(8, 4, Timeouts::default());
        t.reserve_tenants(4);
        t
    }

    /// Opens a TCP connection with a SYN, then runs `rest` ((direction,
    /// flags, whether it fits)).
    fn tcp_script(rest: &[(Dir, u8, bool)]) -> (ConnTable, ConnKey) {
        let mut t = table();
        let f = flow(proto::TCP, 40000, 80);
        let k = key(1, &f);
        let back = key(1, &f.reversed());
        let slot = t.open(k, f, SYN, 0, 1).unwrap();
        for (i, &(dir, flags, pass)) in rest.iter().enumerate() {
            let pk = if dir == Dir::Orig { k } else { back };
            let (s, d) = t.find(&pk, 1).expect("connection");
            assert_eq!((s, d), (slot, dir));
            assert_eq!(
                t.track(s, d, flags, 1),
                pass,
                "step {i}: {dir:?} {flags:#x}"
            );
        }
        (t, k)
    }

    /// A connection whose packets go by in flow hardware does not expire
    /// here, is saved as alive across a restart, and when hardware hands
    /// it back lives as long as its last packet there allows.
    #[test]
    fn an_offloaded_connection_lives_by_its_hardware() {
        let (mut t, k) = tcp_script(&[(Dir::Reply, SYN | ACK, true), (Dir::Orig, ACK, true)]);
        let (slot, _) = t.find(&k, 1).unwrap();
        t.set_offloaded(slot, OFFLOADED_ORIG | OFFLOADED_REPLY);
        let est = Timeouts::default().tcp_established;
        let late = 1 + est + 100;
        assert!(t.find(&k, late).is_some(), "expired while in hardware");
        assert_eq!(t.sweep(late, 1 << 20, |_| true), 0);
        let mut saved = Vec::new();
        t.export(late, |c| saved.push(c));
        assert_eq!(saved.len(), 1);
        assert_eq!(u64::from(saved[0].ttl), est);
        // Handed back after 300 s without packets in hardware: the
        // connection has what a packet 300 s ago would have left it.
        t.set_offloaded(slot, 0);
        t.seen_in_hardware(slot, late, 300);
        assert!(t.find(&k, late + est - 301).is_some());
        assert!(t.find(&k, late + est - 300).is_none());
        // Marked refused, a connection keeps its direction bits apart.
        let (mut t, k) = tcp_script(&[]);
        let (slot, _) = t.find(&k, 1).unwrap();
        t.set_offload_refused(slot);
        t.set_offloaded(slot, OFFLOADED_REPLY);
        assert!(t.offload_refused(slot));
        t.set_offloaded(slot, 0);
        assert!(t.offload_refused(slot) && t.offloaded(slot) == 0);
    }

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
    }

    #[test]
    fn keys_of_both_directions() {
        let f = flow(proto::UDP, 1000, 53);
        let (k, back) = (key(7, &f), key(7, &f.reversed()));
        assert_eq!(k.canon, back.canon);
        assert_ne!(k.from_lo, back.from_lo);
        assert_ne!(k, key(8, &f), "tenant is in the key");
        // The same hosts with other ports are another connection.
        assert_ne!(k.canon, key(7, &flow(proto::UDP, 1001, 53)).canon);
        // Ports alone decide the order between equal addresses.
        let same_host = FlowKey { dst: f.src, ..f };
        assert_eq!(
            key(7, &same_host).canon,
            key(7, &same_host.reversed()).canon
        );

        // Echo request (type 8) and its reply (type 0) meet on one key.
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
        let kr = ConnKey::of(1, &rep, 77).unwrap();
        assert_eq!(kq.canon, kr.canon);
        assert!(kq.from_lo && !kr.from_lo);
        assert_ne!(
            kq.canon,
            ConnKey::of(1, &rep, 78).unwrap().canon,
            "identifier"
        );
        // A request the other way is another connection.
        let back = FlowKey {
            src_port: 8,
            ..req.reversed()
        };
        assert_ne!(kq.canon, ConnKey::of(1, &back, 77).unwrap().canon);
        // Other ICMP messages are not tracked.
        let unreach = FlowKey {
            src_port: 3,
            dst_port: 1,
            ..req
        };
        assert_eq!(ConnKey::of(1, &unreach, 0), None);
    }

    #[test]
    fn the_opening_key_comes_back_for_rechecks() {
        let mut t = table();
        for f in [
            flow(proto::UDP, 1000, 53),
            flow(proto::UDP, 1001, 54).reversed(),
            FlowKey {
                src: u128::MAX - 5,
                dst: 1 << 100,
                v6: true,
                ..flow(proto::TCP, 1, 2)
            },
        ] {
            let k = key(1, &f);
            let s = t.open(k, f, SYN, 0, 1).unwrap();
            assert_eq!(t.orig(s), f);
        }
        let echo = FlowKey {
            src_port: 128,
            dst_port: 0,
            v6: true,
            ..flow(proto::ICMPV6, 0, 0)
        };
        let s = t
            .open(ConnKey::of(1, &echo, 9).unwrap(), echo, 0, 0, 1)
            .unwrap();
        assert_eq!(t.orig(s), echo);
    }

    #[test]
    fn tcp_handshake_data_and_close() {
        let (mut t, k) = tcp_script(&[
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
        let (s, _) = t.find(&k, 1).unwrap();
        assert_eq!(t.state(s), ConnState::Tcp(TcpState::Closing, 3));
    }

    #[test]
    fn tcp_rst_ends_and_only_a_syn_reopens() {
        let (mut t, k) = tcp_script(&[
            (Dir::Reply, SYN | ACK, true),
            (Dir::Orig, ACK, true),
            (Dir::Reply, RST, true),
            (Dir::Reply, ACK, false),
            (Dir::Orig, ACK, false),
            (Dir::Orig, SYN, true),
        ]);
        let (s, _) = t.find(&k, 1).unwrap();
        assert_eq!(t.state(s), ConnState::Tcp(TcpState::SynSent, 0));
        // Closed connections expire fast.
        assert!(t.track(s, Dir::Reply, RST, 100));
        assert_eq!(t.find(&k, 100 + 10), None);
        assert!(t.is_empty());
    }

    #[test]
    fn only_a_lone_syn_opens_tcp() {
        let mut t = table();
        for flags in [ACK, RST, FIN, SYN | ACK, SYN | RST, 0] {
            let f = flow(proto::TCP, 40000, 80);
            assert_eq!(
                t.open(key(1, &f), f, flags, 0, 1),
                Err(Refused::Invalid),
                "{flags:#x}"
            );
        }
        assert!(t.is_empty());
        // An echo reply opens nothing either.
        let rep = flow(proto::ICMP, 0, 0);
        let k = ConnKey::of(1, &rep, 5).unwrap();
        assert_eq!(t.open(k, rep, 0, 0, 1), Err(Refused::Invalid));
        // Nor a second connection under a key in use.
        let f = flow(proto::UDP, 1, 2);
        t.open(key(1, &f), f, 0, 0, 1).unwrap();
        let back = f.reversed();
        assert_eq!(t.open(key(1, &back), back, 0, 0, 1), Err(Refused::Invalid));
    }

    #[test]
    fn datagram_timeouts_grow_once_replied() {
        let mut t = table();
        let f = flow(proto::UDP, 1000, 53);
        let (k, back) = (key(1, &f), key(1, &f.reversed()));
        let s = t.open(k, f, 0, 0, 1).unwrap();
        assert!(t.find(&k, 29).is_some());
        assert!(t.track(s, Dir::Orig, 0, 29));
        // Unreplied: 30 s from the last packet.
        assert_eq!(t.find(&back, 58), Some((s, Dir::Reply)));
        assert!(t.track(s, Dir::Reply, 0, 58));
        assert_eq!(t.state(s), ConnState::Datagram { replied: true });
        assert!(t.find(&k, 58 + 179).is_some());
        assert_eq!(t.find(&k, 58 + 180), None, "expired");
        assert_eq!(t.find(&back, 0), None, "gone for both directions");
        assert_eq!(t.tenant_len(1), 0);
    }

    #[test]
    fn limits_per_tenant_and_in_all() {
        let mut t = table(); // 8 in all, 4 per tenant
        let mut opened = Vec::new();
        for tenant in 0..3u32 {
            for port in 0..5u16 {
                let f = flow(proto::UDP, 1000 + port, 53);
                let r = t.open(key(tenant, &f), f, 0, 0, 1);
                match (tenant, port) {
                    (0 | 1, 0..=3) => opened.push(key(tenant, &f)),
                    (0 | 1, _) => assert_eq!(r, Err(Refused::TenantFull)),
                    (2, _) => assert_eq!(r, Err(Refused::TableFull)),
                    _ => unreachable!(),
                }
            }
        }
        assert_eq!((t.len(), t.tenant_len(0), t.tenant_len(2)), (8, 4, 0));
        // Room made by a removal is used again.
        let (s, _) = t.find(&opened[0], 0).unwrap();
        t.remove(s);
        let f = flow(proto::UDP, 9, 9);
        assert!(t.open(key(2, &f), f, 0, 0, 1).is_ok());
        // A tenant ID nobody reserved is refused, not a panic.
        assert_eq!(t.open(key(99, &f), f, 0, 0, 1), Err(Refused::TenantFull));
        // Everything else is still found.
        for k in &opened[1..] {
            assert!(t.find(k, 0).is_some());
        }
    }

    #[test]
    fn sweep_removes_expired_and_dead_tenants() {
        let mut t = table();
        for (tenant, port) in [(0u32, 1u16), (1, 2), (1, 3)] {
            let f = flow(proto::UDP, port, 53);
            t.open(key(tenant, &f), f, 0, 0, 1).unwrap();
        }
        let n = t.buckets.len();
        assert_eq!(t.sweep(1, n, |tenant| tenant != 0), 1, "tenant 0 is gone");
        assert_eq!(t.sweep(30, n, |_| true), 2, "expired");
        assert!(t.is_empty());
        assert!(t.buckets.iter().all(|b| !b.used));
    }

    /// Random opens, lookups and removals in a small table (long probe
    /// chains, wrap-around) agree with a plain map.
    #[test]
    fn agrees_with_a_map_under_churn() {
        let mut rng = dpu_rand::Rng::new(0xc0ffee);
        let mut t = ConnTable::new(64, 64, Timeouts::default());
        t.reserve_tenants(1);
        let mut model = std::collections::HashMap::new();
        for step in 0..20_000 {
            let f = flow(proto::UDP, rng.below(200) as u16, 53);
            let k = key(0, &f);
            match rng.below(3) {
                0 => {
                    let r = t.open(k, f, 0, 0, 1);
                    if model.contains_key(&f.src_port) {
                        assert_eq!(r, Err(Refused::Invalid), "step {step}");
                    } else if model.len() == 64 {
                        assert_eq!(r, Err(Refused::TenantFull), "step {step}");
                    } else {
                        r.unwrap();
                        model.insert(f.src_port, ());
                    }
                }
                1 => {
                    if let Some((s, _)) = t.find(&k, 0) {
                        t.remove(s);
                    }
                    model.remove(&f.src_port);
                }
                _ => assert_eq!(
                    t.find(&k, 0).is_some(),
                    model.contains_key(&f.src_port),
                    "step {step}"
                ),
            }
            assert_eq!(t.len(), model.len());
        }
    }
}

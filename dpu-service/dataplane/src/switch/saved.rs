//! The switch's tables across a restart: what the workers' connection and
//! fragment tables held when they stopped
//! ([`SwitchHandle::saved_tables`](super::SwitchHandle::saved_tables)),
//! the file that keeps it ([`SavedTables::encode`],
//! [`SavedTables::decode`]) and what restoring it did ([`RestoreReport`];
//! the restoring itself is `restart`'s).
//!
//! Tenants are saved by name: their IDs belong to one process. Nothing in
//! the file is trusted: a file of another version, a damaged one (its
//! checksum) or one larger than the tables could have held is refused as
//! a whole; an entry that no table could have held, of a tenant that no
//! longer tracks connections, or whose time ran out while the service was
//! down is dropped and counted. The time left is also cut to what the
//! current configuration's timeouts give its state.
//!
//! Learned MAC addresses are not carried: every configuration change
//! already starts the workers' MAC tables empty, and an unknown
//! destination is flooded within its tenant until its next frame teaches
//! the switch again, so a restart costs a flood, not a connection.

use std::sync::Arc;
use std::time::Instant;

use crate::conntrack::{CarriedConns, ConnState, SavedConn, TcpState};
use crate::fragtrack::{CarriedFrags, SavedFrag};

/// The connection and fragment entries of the switch's workers, with
/// tenants by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTables {
    /// Unix seconds when the entries' time left was read.
    pub saved_unix: u64,
    /// Tenant names; entries name their tenant by index here.
    pub tenants: Vec<String>,
    /// Connections.
    pub conns: Vec<SavedConn>,
    /// Fragmented datagrams.
    pub frags: Vec<SavedFrag>,
}

/// Why a saved-tables file was refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SavedError {
    /// Shorter than its header and checksum, or than its counts say.
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    /// Not a saved-tables file.
    #[error("not a saved-tables file")]
    Magic,
    /// Written by another version of the format.
    #[error("format version {0}, this service reads {VERSION}")]
    Version(u32),
    /// The checksum does not match: the file was damaged.
    #[error("checksum mismatch")]
    Checksum,
    /// More entries than the tables could hold, or bytes beyond them.
    #[error("{0}")]
    Size(String),
    /// A tenant name is not UTF-8 or is empty.
    #[error("tenant name {0} is not valid")]
    TenantName(usize),
}

/// The file format's version: a file of another is refused.
pub const VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"DPUSWTAB";
pub(super) const HEADER: usize = 40;
pub(super) const CONN: usize = 52;
const FRAG: usize = 48;
pub(super) const CHECKSUM: usize = 4;
/// The longest tenant name the file holds.
pub const NAME_MAX: usize = 1024;

/// What restoring saved tables did with their entries, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Entries carried into the new process.
    pub restored: u64,
    /// Entries whose time ran out while the service was down.
    pub expired: u64,
    /// Entries of tenants that are gone or no longer track connections.
    pub no_tenant: u64,
    /// Entries no table could have held (a key out of shape, a state of
    /// another protocol), or repeated.
    pub invalid: u64,
}

/// What restoring did with each table's entries, and whether a file was
/// refused as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// The connection table's entries.
    pub conns: Restored,
    /// The fragment table's entries.
    pub frags: Restored,
    /// Files refused as a whole (another version, damaged, too large).
    pub refused_files: u64,
}

/// The carried maps the workers' pipelines adopt entries from, and when
/// they were made.
#[derive(Debug)]
pub(super) struct CarriedSet {
    pub(super) conns: Arc<CarriedConns>,
    pub(super) frags: Arc<CarriedFrags>,
    pub(super) base: Instant,
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A little-endian reader over a slice already checked to be long enough.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().unwrap_or([0; N])
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn u128(&mut self) -> u128 {
        u128::from_le_bytes(self.bytes())
    }
}

fn tcp_code(s: TcpState) -> u8 {
    match s {
        TcpState::SynSent => 1,
        TcpState::SynReceived => 2,
        TcpState::Established => 3,
        TcpState::FinWait => 4,
        TcpState::Closing => 5,
        TcpState::Closed => 6,
    }
}

fn tcp_state(code: u8) -> Option<TcpState> {
    Some(match code {
        1 => TcpState::SynSent,
        2 => TcpState::SynReceived,
        3 => TcpState::Established,
        4 => TcpState::FinWait,
        5 => TcpState::Closing,
        6 => TcpState::Closed,
        _ => return None,
    })
}

/// A state code no state has: the entry is invalid.
const BAD_STATE: u8 = 0xff;

impl SavedTables {
    /// The longest file that holds at most `entries` connections and
    /// datagrams together: what a reader needs to read, and no more.
    pub fn max_len(entries: usize) -> usize {
        HEADER
            .saturating_add(entries.saturating_mul(CONN.max(FRAG) + 2 + NAME_MAX))
            .saturating_add(CHECKSUM)
    }

    /// The file's bytes: a header (magic, version, time, counts), the
    /// tenant names, the connections, the datagrams, and a CRC-32C of
    /// everything before it. Tenant names longer than `NAME_MAX` bytes are
    /// cut (their entries then belong to no tenant on restore).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER + self.conns.len() * CONN + self.frags.len() * FRAG + CHECKSUM,
        );
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, VERSION);
        put_u32(&mut out, 0);
        out.extend_from_slice(&self.saved_unix.to_le_bytes());
        for n in [self.tenants.len(), self.conns.len(), self.frags.len(), 0] {
            put_u32(&mut out, u32::try_from(n).unwrap_or(u32::MAX));
        }
        for t in &self.tenants {
            let mut end = t.len().min(NAME_MAX);
            while !t.is_char_boundary(end) {
                end -= 1;
            }
            put_u16(&mut out, end as u16);
            out.extend_from_slice(&t.as_bytes()[..end]);
        }
        for c in &self.conns {
            put_u32(&mut out, c.tenant);
            out.extend_from_slice(&c.lo.to_le_bytes());
            out.extend_from_slice(&c.hi.to_le_bytes());
            for p in [c.lo_port, c.hi_port, c.orig_ports.0, c.orig_ports.1] {
                put_u16(&mut out, p);
            }
            let (state, fins, replied) = match c.state {
                ConnState::Tcp(s, fins) => (tcp_code(s), fins, false),
                ConnState::Datagram { replied } => (0, 0, replied),
            };
            let flags = u8::from(c.v6) | u8::from(c.orig_lo) << 1 | u8::from(replied) << 2;
            out.extend_from_slice(&[c.proto, flags, state, fins]);
            put_u32(&mut out, c.ttl);
        }
        for f in &self.frags {
            put_u32(&mut out, f.tenant);
            out.extend_from_slice(&f.src.to_le_bytes());
            out.extend_from_slice(&f.dst.to_le_bytes());
            put_u32(&mut out, f.ident);
            out.extend_from_slice(&[f.proto, u8::from(f.v6), 0, 0]);
            put_u32(&mut out, f.ttl);
        }
        let crc = crc32c::crc32c(&out);
        put_u32(&mut out, crc);
        out
    }

    /// Reads a file [`SavedTables::encode`] wrote, holding at most
    /// `max_entries` connections and datagrams together. Entries are not
    /// checked here, only the file
    /// ([`SwitchHandle::restore`](super::SwitchHandle::restore) checks
    /// each): a connection whose state code is unknown is kept with a
    /// state of another protocol, so that it fails its check there.
    ///
    /// # Errors
    /// [`SavedError`] if the file is refused as a whole.
    pub fn decode(bytes: &[u8], max_entries: usize) -> Result<SavedTables, SavedError> {
        if bytes.len() < HEADER + CHECKSUM {
            return Err(SavedError::Truncated(bytes.len()));
        }
        if &bytes[..8] != MAGIC {
            return Err(SavedError::Magic);
        }
        let mut r = Reader(&bytes[8..HEADER]);
        let version = r.u32();
        if version != VERSION {
            return Err(SavedError::Version(version));
        }
        let (body, crc) = bytes.split_at(bytes.len() - CHECKSUM);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            return Err(SavedError::Checksum);
        }
        let _flags = r.u32();
        let saved_unix = r.u64();
        let (tenants, conns, frags) = (r.u32() as usize, r.u32() as usize, r.u32() as usize);
        if conns.saturating_add(frags) > max_entries || tenants > conns.saturating_add(frags) {
            return Err(SavedError::Size(format!(
                "{conns} connections, {frags} datagrams and {tenants} tenants; the tables hold {max_entries} entries"
            )));
        }
        let mut r = Reader(&body[HEADER..]);
        // Each name takes at least 3 bytes: a count the bytes cannot
        // hold allocates no more than they could.
        let mut names = Vec::with_capacity(tenants.min(r.0.len() / 3));
        for i in 0..tenants {
            if r.0.len() < 2 {
                return Err(SavedError::Truncated(bytes.len()));
            }
            let len = usize::from(r.u16());
            if len > NAME_MAX || r.0.len() < len {
                return Err(SavedError::TenantName(i));
            }
            let (name, rest) = r.0.split_at(len);
            r.0 = rest;
            match std::str::from_utf8(name) {
                Ok(n) if !n.is_empty() => names.push(n.to_string()),
                _ => return Err(SavedError::TenantName(i)),
            }
        }
        let need = conns * CONN + frags * FRAG;
        if r.0.len() != need {
            return Err(SavedError::Size(format!(
                "{} bytes of entries where the counts say {need}",
                r.0.len()
            )));
        }
        let mut out = SavedTables {
            saved_unix,
            tenants: names,
            conns: Vec::with_capacity(conns),
            frags: Vec::with_capacity(frags),
        };
        for _ in 0..conns {
            let tenant = r.u32();
            let (lo, hi) = (r.u128(), r.u128());
            let (lo_port, hi_port, sport, dport) = (r.u16(), r.u16(), r.u16(), r.u16());
            let [proto, flags, state, fins] = r.bytes::<4>();
            let ttl = r.u32();
            let state = match (state, tcp_state(state)) {
                (_, Some(s)) => ConnState::Tcp(s, fins),
                (0, None) if fins == 0 => ConnState::Datagram {
                    replied: flags & 4 != 0,
                },
                // Neither: a state no protocol fits.
                _ => ConnState::Tcp(TcpState::Closed, BAD_STATE),
            };
            out.conns.push(SavedConn {
                tenant,
                lo,
                hi,
                lo_port,
                hi_port,
                proto,
                v6: flags & 1 != 0,
                orig_lo: flags & 2 != 0,
                orig_ports: (sport, dport),
                state,
                ttl,
            });
        }
        for _ in 0..frags {
            let tenant = r.u32();
            let (src, dst) = (r.u128(), r.u128());
            let ident = r.u32();
            let [proto, v6, _, _] = r.bytes::<4>();
            let ttl = r.u32();
            out.frags.push(SavedFrag {
                tenant,
                src,
                dst,
                ident,
                proto,
                v6: v6 != 0,
                ttl,
            });
        }
        Ok(out)
    }
}

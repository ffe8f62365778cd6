//! One queue pair, host side, as a sans-IO state machine (as
//! [`Connection`](crate::conn::Connection) is for the controller): it
//! holds no socket and reads no clock. The caller moves bytes:
//!
//! - input: read from the controller into [`QueuePair::receive_buffer`],
//!   then report how many with [`QueuePair::received`];
//! - commands: [`QueuePair::submit`] a command with its CID and its data
//!   ([`Transfer`]); it goes out at the next send;
//! - output: [`QueuePair::poll_completion`] until it returns `None`, each
//!   completion with the data the command read (or the buffer it wrote,
//!   handed back); R2Ts are answered on the way, their H2CData queued;
//!   then send [`QueuePair::output`] and report it with
//!   [`QueuePair::sent`].
//!
//! [`Queue`](super::Queue) does this over a byte stream. Commands complete
//! in any order; a CID is free again once its completion has been
//! returned.
//!
//! # Contract
//!
//! Once the ICResp is in, every PDU is checked before it touches a
//! command: a CapsuleResp, C2HData or R2T must name a command in flight,
//! C2HData only a read and only within its buffer, R2T only a write whose
//! data did not go in the capsule and never, over all its R2Ts, more than
//! the command's data. Anything else is an [`Error`]; the PDU stays
//! unread, so the queue keeps reporting it, and the caller drops the
//! queue. A data digest mismatch is not fatal: the command completes with
//! Data Transfer Error (as Linux's host does).

use std::sync::Arc;
use std::time::Duration;

use crate::pdu::{
    self, ControllerPdu, Digests, IcResp, Limits, CAPSULE_CMD_HLEN, DATA_HLEN, DIGEST_LEN,
};
use crate::spec::{sgl, Cqe, Sqe, Status};

use super::error::Error;
use super::ic_req;

/// The smallest MAXH2CDATA a controller may announce (NVMe/TCP 1.0,
/// ICResp).
const MIN_MAXH2CDATA: u32 = 4096;

/// In-capsule data every NVMe/TCP controller takes for Fabrics and Admin
/// commands: what a queue sends in the capsule until told otherwise with
/// [`QueuePair::set_in_capsule`].
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// Room in the receive buffer beyond a PDU's data: its headers, digests
/// and padding.
const PDU_OVERHEAD: usize = 256;

/// How a queue pair is set up.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// Digests asked for in the ICReq; the controller's ICResp decides.
    pub digests: Digests,
    /// Largest data part of a PDU accepted from the controller; a longer
    /// one is refused from its header. The receive buffer holds two such
    /// PDUs.
    pub max_data: u32,
    /// Entries of the queue (the Connect's SQSIZE is one less): CIDs
    /// `0..entries`, at most `entries - 1` of them in flight. At least 2.
    pub entries: u16,
    /// How long a blocking wait of [`Queue`](super::Queue) may take: a
    /// read, a write, a command's completion, the ICResp. `None`: forever.
    pub timeout: Option<Duration>,
}

impl Default for QueueOptions {
    /// No digests, PDUs of up to 1 MiB of data, 32 entries, 30 seconds.
    fn default() -> Self {
        Self {
            digests: Digests::default(),
            max_data: 1 << 20,
            entries: 32,
            timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// The data a command moves, and where it lives while the command is in
/// flight.
#[derive(Debug)]
pub enum Transfer {
    /// No data; the command's SGL descriptor is sent as built.
    None,
    /// Controller to host: C2HData is copied into this buffer, whose
    /// length is the transfer's. The completion hands it back, cut to the
    /// end of the data received.
    Read(Vec<u8>),
    /// Controller to host, this many bytes, checked and dropped (a load
    /// generator's reads).
    Discard(u32),
    /// Host to controller: in the capsule when it fits the queue's
    /// in-capsule size, else sent as the controller asks for it (R2T).
    /// The completion hands the buffer back.
    Write(Vec<u8>),
    /// As [`Transfer::Write`], from a buffer shared with other commands
    /// (a load generator writing one pattern); nothing is handed back.
    WriteShared(Arc<[u8]>),
}

/// A completed command.
#[derive(Debug)]
pub struct Completion {
    /// The completion queue entry; made up from the C2HData when the
    /// controller sent SUCCESS instead of a CapsuleResp.
    pub cqe: Cqe,
    /// A read's buffer, cut to the end of the data received, or a write's
    /// own buffer handed back; empty otherwise.
    pub data: Vec<u8>,
}

impl Completion {
    /// The command's identifier.
    pub fn cid(&self) -> u16 {
        self.cqe.cid
    }

    /// The completion status.
    pub fn status(&self) -> Status {
        let f = self.cqe.status;
        Status {
            sct: ((f >> 9) & 7) as u8,
            sc: (f >> 1) as u8,
            dnr: f & 0x8000 != 0,
        }
    }

    /// True when the command succeeded.
    pub fn is_success(&self) -> bool {
        self.cqe.status & 0x0ffe == 0
    }
}

/// What a command slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Free,
    NoData,
    Read,
    Discard,
    /// A write; its data went in the capsule, or waits for R2Ts.
    Write {
        in_capsule: bool,
    },
}

/// A command's buffer.
#[derive(Default)]
enum Data {
    #[default]
    None,
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl Data {
    fn as_slice(&self) -> &[u8] {
        match self {
            Data::None => &[],
            Data::Owned(v) => v,
            Data::Shared(a) => a,
        }
    }
}

/// One command slot, indexed by CID.
struct Slot {
    kind: Kind,
    data: Data,
    /// Bytes the command moves.
    len: u32,
    /// A read: the end of the data received furthest out. A write: the
    /// bytes R2Ts have asked for.
    progress: u32,
    /// A C2HData of this command failed its data digest.
    digest_error: bool,
}

impl Slot {
    const FREE: Slot = Slot {
        kind: Kind::Free,
        data: Data::None,
        len: 0,
        progress: 0,
        digest_error: false,
    };
}

/// The command slots and how many are in flight.
struct Slots {
    list: Vec<Slot>,
    in_flight: usize,
}

impl Slots {
    /// The slot of `cid` if that command is in flight.
    fn busy(&mut self, cid: u16, pdu: &'static str) -> Result<&mut Slot, Error> {
        match self.list.get_mut(usize::from(cid)) {
            Some(s) if s.kind != Kind::Free => Ok(s),
            _ => Err(Error::UnknownCommand { cid, pdu }),
        }
    }

    /// Completes `cid` (in flight) with `cqe`: frees the slot and hands
    /// back its buffer.
    fn complete(&mut self, cid: u16, mut cqe: Cqe) -> Result<Completion, Error> {
        let slot = self.busy(cid, "completion")?;
        let mut data = match std::mem::take(&mut slot.data) {
            Data::Owned(v) => v,
            Data::None | Data::Shared(_) => Vec::new(),
        };
        if slot.kind == Kind::Read {
            data.truncate(slot.progress as usize);
        }
        if slot.digest_error && cqe.status & 0x0ffe == 0 {
            cqe.status = Status::DATA_TRANSFER_ERROR.to_field();
        }
        *slot = Slot::FREE;
        self.in_flight -= 1;
        Ok(Completion { cqe, data })
    }

    /// Takes C2HData of `cid`: copies (or drops) it into the command's
    /// buffer; the completion when the controller sent SUCCESS.
    fn c2h_data(
        &mut self,
        cid: u16,
        datao: u32,
        data: &[u8],
        success: bool,
        digest_ok: bool,
    ) -> Result<Option<Completion>, Error> {
        const PDU: &str = "C2HData";
        let slot = self.busy(cid, PDU)?;
        if !matches!(slot.kind, Kind::Read | Kind::Discard) {
            return Err(Error::WrongDirection { cid, pdu: PDU });
        }
        // The decoder bounds the data by `max_data`, a u32.
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let out_of_range = Error::DataOutOfRange {
            cid,
            pdu: PDU,
            offset: datao,
            len,
            size: slot.len,
        };
        let end = match datao.checked_add(len) {
            Some(end) if end <= slot.len => end,
            _ => return Err(out_of_range),
        };
        if let Data::Owned(buf) = &mut slot.data {
            match buf.get_mut(datao as usize..end as usize) {
                Some(to) => to.copy_from_slice(data),
                None => return Err(out_of_range),
            }
        }
        slot.progress = slot.progress.max(end);
        slot.digest_error |= !digest_ok;
        if success {
            return self
                .complete(
                    cid,
                    Cqe {
                        cid,
                        ..Cqe::default()
                    },
                )
                .map(Some);
        }
        Ok(None)
    }

    /// Answers an R2T of `cid`: appends to `out` the H2CData PDUs (each
    /// at most `maxh2cdata` bytes) that carry the bytes asked for.
    #[allow(clippy::too_many_arguments)]
    fn r2t(
        &mut self,
        out: &mut Vec<u8>,
        tx: Digests,
        maxh2cdata: u32,
        cid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
    ) -> Result<(), Error> {
        const PDU: &str = "R2T";
        let slot = self.busy(cid, PDU)?;
        if slot.kind != (Kind::Write { in_capsule: false }) {
            return Err(Error::WrongDirection { cid, pdu: PDU });
        }
        let out_of_range = Error::DataOutOfRange {
            cid,
            pdu: PDU,
            offset: r2to,
            len: r2tl,
            size: slot.len,
        };
        // Each byte once: the R2Ts of a command never ask for more than
        // its data, so what this queues stays within the writes' data.
        let end = r2to.checked_add(r2tl).filter(|&e| e <= slot.len);
        let asked = slot.progress.checked_add(r2tl).filter(|&a| a <= slot.len);
        let (Some(end), Some(asked)) = (end, asked) else {
            return Err(out_of_range);
        };
        if r2tl == 0 {
            return Err(out_of_range);
        }
        let Some(data) = slot.data.as_slice().get(r2to as usize..end as usize) else {
            return Err(out_of_range);
        };
        slot.progress = asked;
        let mut at = r2to;
        for chunk in data.chunks(maxh2cdata as usize) {
            // Chunks are at most MAXH2CDATA, a u32.
            let n = chunk.len() as u32;
            pdu::encode_h2c_data(out, tx, cid, ttag, at, chunk, at + n == end);
            at += n;
        }
        Ok(())
    }
}

/// One queue pair's host side: the ICReq/ICResp exchange, commands in
/// flight by CID, the bytes received and to send. See the [module
/// documentation](self) for how to drive it.
pub struct QueuePair {
    /// What PDUs from the controller may be: digests, data size.
    limits: Limits,
    /// Digests the host asked for.
    asked: Digests,
    /// Largest H2CData the controller takes (its ICResp).
    maxh2cdata: u32,
    /// Largest write data sent in the capsule.
    in_capsule: u32,
    /// The ICResp is in.
    ready: bool,
    slots: Slots,
    inbox: Vec<u8>,
    /// Unread bytes are `inbox[start..filled]`.
    start: usize,
    filled: usize,
    out: Vec<u8>,
    /// Bytes of `out` already sent.
    out_sent: usize,
}

impl QueuePair {
    /// A queue pair that has not heard from the controller yet: its ICReq
    /// waits in [`QueuePair::output`].
    pub fn new(opts: &QueueOptions) -> Self {
        let entries = usize::from(opts.entries.max(2));
        let mut out = Vec::with_capacity(1 << 16);
        ic_req(&mut out, opts.digests);
        Self {
            limits: Limits {
                digests: Digests::default(),
                max_data: opts.max_data,
            },
            asked: opts.digests,
            maxh2cdata: MIN_MAXH2CDATA,
            in_capsule: ADMIN_IN_CAPSULE,
            ready: false,
            slots: Slots {
                list: (0..entries).map(|_| Slot::FREE).collect(),
                in_flight: 0,
            },
            inbox: vec![0; 2 * (opts.max_data as usize + PDU_OVERHEAD)],
            start: 0,
            filled: 0,
            out,
            out_sent: 0,
        }
    }

    /// True once the ICResp is in: commands may be submitted.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The digests the connection uses (none before the ICResp).
    pub fn digests(&self) -> Digests {
        self.limits.digests
    }

    /// Largest data of one H2CData PDU, from the ICResp.
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Largest write sent in the capsule.
    pub fn in_capsule(&self) -> u32 {
        self.in_capsule
    }

    /// Sets the largest write sent in the capsule: an I/O queue's is the
    /// controller's IOCCSZ less the SQE (Identify Controller); until then
    /// [`ADMIN_IN_CAPSULE`].
    pub fn set_in_capsule(&mut self, bytes: u32) {
        self.in_capsule = bytes;
    }

    /// The queue's entries: CIDs are below this.
    pub fn entries(&self) -> u16 {
        // At most the u16 of `QueueOptions::entries`.
        self.slots.list.len() as u16
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.slots.in_flight
    }

    /// True when command `cid` is in flight.
    pub fn is_busy(&self, cid: u16) -> bool {
        self.slots
            .list
            .get(usize::from(cid))
            .is_some_and(|s| s.kind != Kind::Free)
    }

    /// The lowest CID not in flight, if the queue has room for another
    /// command.
    pub fn free_cid(&self) -> Option<u16> {
        if self.slots.in_flight + 1 >= self.slots.list.len() {
            return None;
        }
        let i = self.slots.list.iter().position(|s| s.kind == Kind::Free)?;
        u16::try_from(i).ok()
    }

    /// Queues command `sqe` as `cid` with its data. The queue sets the
    /// CID, and for a transfer PSDT and SGL descriptor 1: in-capsule data
    /// for a write that fits [`QueuePair::in_capsule`], a transport data
    /// block of the transfer's length otherwise. With [`Transfer::None`]
    /// the descriptor stays as built.
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`] before the ICResp, [`Error::CidOutOfRange`],
    /// [`Error::CidBusy`], [`Error::QueueFull`] (`entries - 1` in flight),
    /// [`Error::TransferTooLong`]; nothing is queued then.
    pub fn submit(&mut self, cid: u16, mut sqe: Sqe, transfer: Transfer) -> Result<(), Error> {
        if !self.ready {
            return Err(Error::NotReady);
        }
        let entries = self.entries();
        let full = self.slots.in_flight + 1 >= self.slots.list.len();
        let slot = self
            .slots
            .list
            .get_mut(usize::from(cid))
            .ok_or(Error::CidOutOfRange { cid, entries })?;
        if slot.kind != Kind::Free {
            return Err(Error::CidBusy { cid });
        }
        if full {
            return Err(Error::QueueFull);
        }
        let length = |n: usize| u32::try_from(n).map_err(|_| Error::TransferTooLong(n));
        sqe.0[2..4].copy_from_slice(&cid.to_le_bytes());
        let (kind, data, len) = match transfer {
            Transfer::None => (Kind::NoData, Data::None, 0),
            Transfer::Read(buf) => (Kind::Read, Data::Owned(buf), 0),
            Transfer::Discard(len) => (Kind::Discard, Data::None, len),
            Transfer::Write(buf) => (Kind::Write { in_capsule: false }, Data::Owned(buf), 0),
            Transfer::WriteShared(buf) => (Kind::Write { in_capsule: false }, Data::Shared(buf), 0),
        };
        let len = match (&kind, &data) {
            (Kind::Discard, _) => len,
            (_, d) => length(d.as_slice().len())?,
        };
        let kind = match kind {
            Kind::NoData => {
                pdu::encode_capsule_cmd(&mut self.out, self.limits.digests, &sqe, &[]);
                kind
            }
            Kind::Write { .. } if len > 0 && len <= self.in_capsule => {
                set_sgl(&mut sqe, sgl::IN_CAPSULE, len);
                pdu::encode_capsule_cmd(&mut self.out, self.limits.digests, &sqe, data.as_slice());
                Kind::Write { in_capsule: true }
            }
            _ => {
                set_sgl(&mut sqe, sgl::TRANSPORT, len);
                pdu::encode_capsule_cmd(&mut self.out, self.limits.digests, &sqe, &[]);
                kind
            }
        };
        *slot = Slot {
            kind,
            data,
            len,
            progress: 0,
            digest_error: false,
        };
        self.slots.in_flight += 1;
        Ok(())
    }

    /// Room to read the controller's bytes into; report what was read
    /// with [`QueuePair::received`]. Empty only when the buffer holds a
    /// partial PDU longer than the queue accepts, which the decoder
    /// refuses before it gets there.
    pub fn receive_buffer(&mut self) -> &mut [u8] {
        if self.start == self.filled {
            (self.start, self.filled) = (0, 0);
        } else if self.filled == self.inbox.len() {
            self.inbox.copy_within(self.start..self.filled, 0);
            (self.start, self.filled) = (0, self.filled - self.start);
        }
        &mut self.inbox[self.filled..]
    }

    /// Records that `n` bytes were read into the front of
    /// [`QueuePair::receive_buffer`] (more than it held count as all).
    pub fn received(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.inbox.len());
    }

    /// Takes the PDUs received so far until one completes a command:
    /// that command's completion, or `None` when no whole PDU is left.
    /// The ICResp and R2Ts are handled on the way (R2Ts queue H2CData to
    /// send).
    ///
    /// # Errors
    ///
    /// Fatal for the queue: a PDU that does not decode
    /// ([`Error::Pdu`]), a termination request, a PDU out of place, for a
    /// command not in flight or outside its data (see the [module
    /// documentation](self)). The offending PDU stays unread.
    pub fn poll_completion(&mut self) -> Result<Option<Completion>, Error> {
        loop {
            let unread = &self.inbox[self.start..self.filled];
            let Some((p, n)) = pdu::decode_controller(unread, &self.limits)? else {
                return Ok(None);
            };
            let done = match p {
                ControllerPdu::TermReq { fes, fei } => return Err(Error::Terminated { fes, fei }),
                ControllerPdu::IcResp(r) if !self.ready => {
                    accept_ic_resp(&r, self.asked)?;
                    self.limits.digests = r.digests;
                    self.maxh2cdata = r.maxh2cdata;
                    self.ready = true;
                    None
                }
                ControllerPdu::IcResp(_) => return Err(Error::UnexpectedPdu { pdu: "ICResp" }),
                _ if !self.ready => {
                    return Err(Error::UnexpectedPdu {
                        pdu: "PDU before the ICResp",
                    })
                }
                ControllerPdu::CapsuleResp { cqe } => Some(self.slots.complete(cqe.cid, cqe)?),
                ControllerPdu::C2HData {
                    cccid,
                    datao,
                    data,
                    success,
                    data_digest_ok,
                    ..
                } => self
                    .slots
                    .c2h_data(cccid, datao, data, success, data_digest_ok)?,
                ControllerPdu::R2T {
                    cccid,
                    ttag,
                    r2to,
                    r2tl,
                } => {
                    self.slots.r2t(
                        &mut self.out,
                        self.limits.digests,
                        self.maxh2cdata,
                        cccid,
                        ttag,
                        r2to,
                        r2tl,
                    )?;
                    None
                }
            };
            self.start += n;
            if self.start == self.filled {
                (self.start, self.filled) = (0, 0);
            }
            if done.is_some() {
                return Ok(done);
            }
        }
    }

    /// The bytes waiting to be sent; report what went with
    /// [`QueuePair::sent`].
    pub fn output(&self) -> &[u8] {
        &self.out[self.out_sent..]
    }

    /// True when bytes wait to be sent.
    pub fn has_output(&self) -> bool {
        self.out_sent < self.out.len()
    }

    /// Records that the first `n` bytes of [`QueuePair::output`] were
    /// sent.
    pub fn sent(&mut self, n: usize) {
        self.out_sent = (self.out_sent + n).min(self.out.len());
        if self.out_sent == self.out.len() {
            self.out.clear();
            self.out_sent = 0;
        }
    }
}

impl std::fmt::Debug for QueuePair {
    /// The state, not the buffers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("ready", &self.ready)
            .field("digests", &self.limits.digests)
            .field("maxh2cdata", &self.maxh2cdata)
            .field("in_capsule", &self.in_capsule)
            .field("entries", &self.slots.list.len())
            .field("in_flight", &self.slots.in_flight)
            .field("unread", &(self.filled - self.start))
            .field("unsent", &(self.out.len() - self.out_sent))
            .finish()
    }
}

/// Points SGL descriptor 1 of `sqe` at `len` bytes of data of descriptor
/// type `id` (offset 0 of the capsule's data, or the transport's), PSDT
/// set to SGL.
fn set_sgl(sqe: &mut Sqe, id: u8, len: u32) {
    sqe.0[1] = (sqe.0[1] & 0x3f) | 0x40;
    sqe.0[24..32].fill(0);
    sqe.0[32..36].copy_from_slice(&len.to_le_bytes());
    sqe.0[36..39].fill(0);
    sqe.0[39] = id;
}

/// Checks that this host can work with the controller's ICResp `r` after
/// asking for digests `asked`.
fn accept_ic_resp(r: &IcResp, asked: Digests) -> Result<(), Error> {
    if r.pfv != 0 {
        return Err(Error::IcResp("PDU format version is not 0"));
    }
    if r.maxh2cdata < MIN_MAXH2CDATA {
        return Err(Error::IcResp("MAXH2CDATA is below 4096"));
    }
    if (r.digests.header && !asked.header) || (r.digests.data && !asked.data) {
        return Err(Error::IcResp("digests the host did not ask for"));
    }
    // The host puts data right after the header (and its digest): that
    // offset must meet the controller's alignment.
    let align = (usize::from(r.cpda) + 1) * 4;
    let hd = if r.digests.header { DIGEST_LEN } else { 0 };
    if !(CAPSULE_CMD_HLEN + hd).is_multiple_of(align) || !(DATA_HLEN + hd).is_multiple_of(align) {
        return Err(Error::IcResp("CPDA asks for padding before data"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! One NVMe/TCP connection (one queue) as a sans-IO state machine.
//!
//! A transport feeds the bytes it reads to [`Connection::receive`], runs the
//! block requests it takes from [`Connection::next_request`] and hands their
//! results back to [`Connection::complete`], calls [`Connection::tick`] now
//! and then (keep-alive, asynchronous events, controller teardown), and
//! writes out whatever [`Connection::take_output`] returns, or, without
//! copying large read data, what [`Connection::output_slices`] lends in a
//! vectored write, reporting the bytes written to
//! [`Connection::output_sent`]. Nothing here blocks, sleeps or touches a
//! socket.
//!
//! A protocol violation ends the connection with a C2HTermReq carrying the
//! fatal error status; it never affects another connection.
//!
//! A command whose data the host sends only when asked (through R2T) is
//! checked first, as it would be with its data: one that fails, or that
//! reads no data, is answered without an R2T. The rest ask for their data
//! within memory budgets ([`R2T_BUDGET`] per connection,
//! [`Target::set_write_buffer_budget`] for all): a command that does not fit
//! waits, holding no buffer, and its data buffer is taken only when its
//! first H2CData arrives.
//!
//! The Diffie-Hellman work of DH-HMAC-CHAP runs here unless the transport
//! takes it ([`Connection::set_dh_offload`]): then the Authentication
//! Receive that returns the Challenge, or the Send that carries the Reply,
//! waits while its job is out ([`Connection::next_dh_job`]) and completes
//! when the transport hands the result to [`Connection::complete_dh`], as
//! block requests do through [`Connection::complete`]. Each AUTH_Negotiate
//! first takes a token from the target's
//! [`AuthLimiter`](crate::auth::limit::AuthLimiter) for the peer's address.

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admin::{self, AdminQueue};
use crate::auth::controller::{
    HostKeys, ReceiveError, Refusal, Step, DEFAULT_TIMEOUT as AUTH_TIMEOUT,
    MAX_RECEIVE as MAX_AUTH_DATA,
};
use crate::auth::limit::Admit;
use crate::auth::pool::{DhJob, DhResult};
use crate::auth::{AuthOutcome, Authenticator};
use crate::backend::is_out_of_range;
use crate::block::sized;
use crate::command::{Outcome, IO_CMDS};
use crate::controller::{Controller, ControllerKind, MAX_QUEUE_SIZE};
use crate::host::CONNECT_DATA_LEN;
use crate::identify::ErrorEntry;
use crate::pdu::{self, Digests, Fes, HostPdu, IcResp, Limits};
use crate::spec::{self, fctype, nvm, sgl, Cqe, Sqe, Status, FABRICS};
use crate::target::{is_namespace_removed, HostAdmission, Namespace, Target};

pub use crate::block::{BlockCompletion, BlockOp, BlockRequest};
pub use crate::budget::{DEFAULT_WRITE_BUFFER_BUDGET, R2T_BUDGET};
pub use crate::command::{IN_CAPSULE_DATA, MAX_H2C_DATA, MAX_TRANSFER, MDTS, VERSION};
pub use crate::timeouts::{Timeouts, ICREQ_TIMEOUT, IDLE_TIMEOUT, PDU_TIMEOUT};

#[cfg(test)]
mod tests;

use crate::budget::ConnBudget;

/// Most data buffers a connection keeps for reuse (reads, and writes that
/// arrive through R2T): enough for a deep queue's steady state without
/// holding more than a few MiB per connection.
const SPARE_BUFFERS: usize = 16;

/// Most buffers to encode PDUs into a connection keeps for reuse.
const SPARE_OUT: usize = 4;

/// Read data of at least this many bytes goes out from its own buffer, its
/// C2HData header beside it in a vectored write, instead of being copied
/// behind the header; below it, the copy costs less than another slice.
pub const SEND_FROM_BUFFER: usize = 16 * 1024;

/// Completions of a batch of block requests after which
/// [`Connection::execute_requests`] first lets the transport send. On
/// loopback with 4 KiB random reads at QD 32, 8 gave 1.5x the IOPS of one
/// send per batch, more than 4 or 16 did, and cost nothing at QD 128 or
/// with 128 KiB reads.
pub const FIRST_SEND: usize = 8;

/// Most bytes one step of a Write Zeroes or Dataset Management zeroes or
/// deallocates ([`Connection::execute_requests`]): a few milliseconds of
/// memset on a RAM namespace.
pub const WORK_CHUNK: u64 = 4 << 20;

/// Capacity the buffer PDUs are encoded into starts at once it holds
/// output behind read data sent from its own buffer. (A new connection's
/// starts empty: an idle connection holds no buffer.)
const OUT_CAPACITY: usize = 64 * 1024;

/// Output a connection may hold unsent before
/// [`Connection::execute_requests`] leaves the next block requests waiting:
/// a host that reads its socket slower than it submits reads (or not at
/// all) makes the target hold at most this much of its data, plus one
/// command's. A transport should stop reading such a host's commands too
/// ([`Connection::output_len`]).
pub const OUTPUT_BUDGET: usize = 4 << 20;

/// What the connection waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The host's ICReq.
    IcReq,
    /// Commands.
    Ready,
    /// Nothing: the connection is over once the output is written.
    Closed,
}

/// A command between its capsule and its completion.
#[derive(Debug)]
enum Pending {
    /// Data to come through R2T, waiting for room in the budgets
    /// ([`crate::budget`]) before it is asked for.
    Waiting {
        sqe: Sqe,
        /// As in [`Pending::Receiving`].
        ns: Option<Arc<Namespace>>,
    },
    /// Write data arriving in H2CData PDUs.
    Receiving {
        sqe: Sqe,
        /// The namespace the command was accepted against (see
        /// [`Connection::accepted_namespace`]); the data goes there or
        /// nowhere, never to a namespace created under the same ID since.
        ns: Option<Arc<Namespace>>,
        /// Empty until the first H2CData arrives, then `len` bytes.
        buf: Vec<u8>,
        /// Bytes of data the command transfers.
        len: u32,
        /// Bytes received.
        got: u32,
        /// End of the range the current R2T asked for.
        r2t_end: u32,
        /// A data digest did not match: the command fails once all its
        /// data is in, so the stream stays in step.
        corrupt: bool,
    },
    /// A block request is out; `read` when data goes back to the host.
    Executing { sqe: Sqe, read: bool, bytes: u64 },
    /// An Authentication Send (`receive` None) or Receive (of allocation
    /// length `receive`) waits for its DH job.
    Authenticating { sqe: Sqe, receive: Option<usize> },
}

/// One NVMe/TCP connection: one admin or I/O queue.
#[derive(Debug)]
pub struct Connection {
    target: Target,
    local: SocketAddr,
    pub(crate) peer: SocketAddr,
    phase: Phase,
    digests: Digests,
    limits: Limits,
    pub(crate) ctrl: Option<Arc<Controller>>,
    pub(crate) qid: u16,
    sqsize: u16,
    sqhd: u16,
    sqflow_disabled: bool,
    pending: HashMap<u16, Pending>,
    /// Reservations of the commands whose data comes through R2T.
    budget: ConnBudget,
    requests: VecDeque<BlockRequest>,
    aers: Vec<u16>,
    /// Output being encoded, after everything in `tx`.
    out: Vec<u8>,
    /// Output ahead of `out`, in order: buffers of encoded PDUs (flagged
    /// `true`) and read data sent from its own buffer
    /// ([`SEND_FROM_BUFFER`]).
    tx: VecDeque<(Vec<u8>, bool)>,
    /// Bytes of the front of the output (the first of `tx`, else `out`)
    /// already sent.
    sent: usize,
    /// Data buffers for reuse, which keep their length: a read of the
    /// same size as an earlier one zeroes nothing before it fills its
    /// buffer.
    spare: Vec<Vec<u8>>,
    /// Buffers to encode PDUs into, for reuse.
    spare_out: Vec<Vec<u8>>,
    close_reason: Option<String>,
    /// When the connection was first handed bytes or time: the start of
    /// its [`ICREQ_TIMEOUT`].
    opened: Option<Instant>,
    /// Since when the transport has held the first bytes of a PDU that
    /// has not arrived whole ([`PDU_TIMEOUT`]).
    partial_since: Option<Instant>,
    /// The timers, as the target had them when the connection was made.
    timeouts: Timeouts,
    /// The queue's place under the per-host connection limit, once
    /// connected.
    host_slot: Option<HostAdmission>,
    /// The queue must complete DH-HMAC-CHAP before any command but
    /// Authentication Send/Receive and Disconnect.
    auth_required: bool,
    /// The host's keys, as they were at Connect.
    auth_keys: Option<Arc<HostKeys>>,
    /// The queue's authentication, from Connect (when required) or the
    /// first Authentication Send.
    auth: Option<Authenticator>,
    /// DH work goes to the transport instead of running here.
    dh_offload: bool,
    /// DH jobs for the transport, with the command each completes (at
    /// most one: a queue has one authentication command out at a time).
    dh_jobs: VecDeque<(u16, DhJob)>,
}

impl Connection {
    /// A connection accepted on `local` from `peer`.
    pub fn new(target: Target, local: SocketAddr, peer: SocketAddr) -> Self {
        let timeouts = target.timeouts();
        target.stats().connections.fetch_add(1, Ordering::Relaxed);
        Self {
            target,
            local,
            peer,
            phase: Phase::IcReq,
            digests: Digests::default(),
            limits: Limits {
                digests: Digests::default(),
                max_data: MAX_H2C_DATA.max(IN_CAPSULE_DATA),
            },
            ctrl: None,
            qid: 0,
            sqsize: 1,
            sqhd: 0,
            sqflow_disabled: false,
            pending: HashMap::new(),
            budget: ConnBudget::default(),
            requests: VecDeque::new(),
            aers: Vec::new(),
            out: Vec::new(),
            tx: VecDeque::new(),
            sent: 0,
            spare: Vec::new(),
            spare_out: Vec::new(),
            close_reason: None,
            opened: None,
            partial_since: None,
            timeouts,
            host_slot: None,
            auth_required: false,
            auth_keys: None,
            auth: None,
            dh_offload: false,
            dh_jobs: VecDeque::new(),
        }
    }

    /// Whether the transport runs the DH work of authentication
    /// ([`Connection::next_dh_job`]); off by default: it runs in the call
    /// that needs it.
    pub fn set_dh_offload(&mut self, on: bool) {
        self.dh_offload = on;
    }

    /// The next DH job to run, with the command ID to hand its result
    /// back with ([`Connection::complete_dh`]).
    pub fn next_dh_job(&mut self) -> Option<(u16, DhJob)> {
        self.dh_jobs.pop_front()
    }

    /// True while an authentication command waits for a DH job (taken or
    /// not): a transport keeps the connection where the result will find
    /// it.
    pub fn awaits_dh(&self) -> bool {
        self.pending
            .values()
            .any(|p| matches!(p, Pending::Authenticating { .. }))
    }

    /// Hands back the result of the DH job of command `cid`
    /// ([`DhError::Busy`](crate::auth::dh::DhError::Busy) for one the
    /// transport could not run): the command completes. A result for a
    /// command no longer waiting (the connection closed, or the
    /// authentication timed out) is dropped.
    pub fn complete_dh(&mut self, cid: u16, result: DhResult, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        let Some(Pending::Authenticating { sqe, receive }) = self.pending.remove(&cid) else {
            return;
        };
        let outcome = match self.auth.as_mut() {
            Some(a) => {
                a.dh_done(result, now);
                match receive {
                    Some(al) => self.auth_answer(&sqe, al, now),
                    None => {
                        self.auth_outcome();
                        Outcome::ok(&sqe)
                    }
                }
            }
            None => Outcome::status(&sqe, Status::COMMAND_SEQUENCE),
        };
        self.conclude(sqe, outcome);
    }

    /// Consumes whole PDUs from the front of `input` and returns how many
    /// bytes it used; the rest must be offered again with more bytes.
    /// While the connection is [held back](Connection::held_back) it takes
    /// no more PDUs: offer the rest again once the output has drained.
    ///
    /// `now` is the time the bytes are handled at, the only clock the
    /// commands see: a new controller's keep-alive timer starts at `now`,
    /// and a Keep Alive command (or a Set Features of the timeout) restarts
    /// it there.
    ///
    /// Bytes left over (a PDU not yet whole) start the [`PDU_TIMEOUT`],
    /// which [`Connection::tick`] enforces; the transport must offer its
    /// whole buffer on every call, so that the time is counted from the
    /// PDU's first byte.
    pub fn receive(&mut self, input: &[u8], now: Instant) -> usize {
        self.opened.get_or_insert(now);
        let mut used = 0;
        while self.phase != Phase::Closed && !self.held_back() {
            let rest = &input[used..];
            match pdu::decode_host(rest, &self.limits) {
                Ok(None) => break,
                Ok(Some((p, n))) => {
                    used += n;
                    self.on_pdu(p, &rest[..n], now);
                }
                Err(e) => {
                    let hdr = &rest[..e.header_len.min(rest.len())];
                    self.fatal(e.fes, e.fei, hdr, &e.to_string());
                    used = input.len();
                }
            }
        }
        if self.phase == Phase::Closed {
            used = input.len();
        }
        if used < input.len() {
            self.partial_since.get_or_insert(now);
        } else {
            self.partial_since = None;
        }
        // Other connections may have given back target-wide budget.
        self.grant_waiting();
        used
    }

    /// The next block request to run, if any.
    pub fn next_request(&mut self) -> Option<BlockRequest> {
        self.requests.pop_front()
    }

    /// Runs every waiting block request on the calling thread, calling
    /// `send` once the first [`FIRST_SEND`] have completed, then after 16,
    /// 32, ... in all: a transport sends the output there, so the host has
    /// its first answers, and sends its next commands, while the rest of
    /// a deep batch runs. While one request runs, the next read's data is
    /// prefetched ([`crate::backend::Backend::prefetch`]). Returns how many
    /// requests ran; what the last ones produced is left in the output.
    ///
    /// Once [`OUTPUT_BUDGET`] bytes of output wait unsent, the remaining
    /// requests are left for a later call ([`Connection::has_requests`]).
    /// So is the rest of a Write Zeroes or Dataset Management longer than
    /// [`WORK_CHUNK`]: one chunk runs per call, behind the requests that
    /// arrived after it, so a command over a whole namespace never holds
    /// the transport (or the other connections it serves) for long.
    pub fn execute_requests(&mut self, mut send: impl FnMut(&mut Self)) -> usize {
        let (mut done, mut send_at) = (0, FIRST_SEND);
        while !self.held_back() {
            let Some(mut r) = self.next_request() else {
                break;
            };
            if let Some(chunk) = r.take_chunk(WORK_CHUNK) {
                let c = chunk.execute();
                if c.result.is_err() {
                    self.complete(c);
                } else {
                    self.requests.push_back(r);
                }
                done += 1;
                break;
            }
            // The next read's data starts coming into the cache while this
            // request runs (two ahead measured no better).
            if let Some(BlockRequest {
                namespace,
                op: BlockOp::Read { offset, len, .. },
                ..
            }) = self.requests.front()
            {
                namespace.backend.prefetch(*offset, *len as u64);
            }
            self.complete(r.execute());
            done += 1;
            if done == send_at {
                send_at *= 2;
                send(self);
            }
        }
        done
    }

    /// Bytes to send to the host (the output is left empty).
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut v = Vec::new();
        self.drain_output_into(&mut v);
        v
    }

    /// Appends the bytes to send to `buf` (the output is left empty; this
    /// side keeps its buffers).
    pub fn drain_output_into(&mut self, buf: &mut Vec<u8>) {
        let mut skip = std::mem::take(&mut self.sent);
        while let Some((c, pdus)) = self.tx.pop_front() {
            buf.extend_from_slice(&c[skip..]);
            skip = 0;
            self.release(c, pdus);
        }
        buf.extend_from_slice(&self.out[skip..]);
        self.out.clear();
    }

    /// True when there are bytes to send.
    pub fn has_output(&self) -> bool {
        !self.tx.is_empty() || self.out.len() > self.sent
    }

    /// Bytes waiting to be sent.
    pub fn output_len(&self) -> usize {
        self.tx.iter().map(|(c, _)| c.len()).sum::<usize>() + self.out.len() - self.sent
    }

    /// True while the connection holds back: its output is over the
    /// [`OUTPUT_BUDGET`]. It takes no more PDUs and runs no more block
    /// requests until the output drains; a transport does not read the
    /// socket then, and the [`PDU_TIMEOUT`] does not run.
    pub fn held_back(&self) -> bool {
        self.output_len() >= OUTPUT_BUDGET
    }

    /// True when block requests wait to run (left by
    /// [`Connection::execute_requests`] over the [`OUTPUT_BUDGET`]).
    pub fn has_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Lends the bytes to send, in order, as up to `slices.len()` slices
    /// for a vectored write, and answers how many it filled (0 when there
    /// is nothing to send). Large read data is lent from its own buffer,
    /// never copied. Report what the write took with
    /// [`Connection::output_sent`].
    pub fn output_slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let chunks = self
            .tx
            .iter()
            .map(|(c, _)| c)
            .chain(std::iter::once(&self.out));
        let mut n = 0;
        for (i, c) in chunks.enumerate() {
            if n == slices.len() {
                break;
            }
            let c = if i == 0 { &c[self.sent..] } else { &c[..] };
            if !c.is_empty() {
                slices[n] = IoSlice::new(c);
                n += 1;
            }
        }
        n
    }

    /// Marks the first `n` bytes of the output as sent (at most what
    /// [`Connection::output_slices`] lent); their buffers are reused.
    pub fn output_sent(&mut self, n: usize) {
        let mut n = n + std::mem::take(&mut self.sent);
        while let Some((front, _)) = self.tx.front() {
            if n < front.len() {
                self.sent = n;
                return;
            }
            n -= front.len();
            if let Some((c, pdus)) = self.tx.pop_front() {
                self.release(c, pdus);
            }
        }
        if n < self.out.len() {
            self.sent = n;
        } else {
            self.out.clear();
        }
    }

    /// Queues `data` to be sent from its own buffer after the output so far.
    fn send_buffer(&mut self, data: Vec<u8>) {
        if !self.out.is_empty() {
            let mut next = self.spare_out.pop().unwrap_or_default();
            next.clear();
            next.reserve(OUT_CAPACITY);
            self.tx
                .push_back((std::mem::replace(&mut self.out, next), true));
        }
        self.tx.push_back((data, false));
    }

    /// True once the connection is over: send what output is left, then
    /// close the socket.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Why the connection closed, if it did.
    pub fn close_reason(&self) -> Option<&str> {
        self.close_reason.as_deref()
    }

    /// The queue this connection carries (0 = admin), once connected.
    pub fn queue_id(&self) -> Option<u16> {
        self.ctrl.as_ref().map(|_| self.qid)
    }

    /// The controller this connection belongs to, once connected.
    pub fn controller_id(&self) -> Option<u16> {
        self.ctrl.as_ref().map(|c| c.cntlid)
    }

    /// Bytes of write data this connection has asked for through R2T (or
    /// is about to) and not yet written: at most [`R2T_BUDGET`], also
    /// counted in [`Target::write_buffers_reserved`].
    pub fn write_buffers_reserved(&self) -> u64 {
        self.budget.reserved()
    }

    /// Timers and events: ends the connection when the host has not sent
    /// its ICReq within [`ICREQ_TIMEOUT`], or a PDU has stayed partial
    /// for [`PDU_TIMEOUT`] (not counting while the connection is
    /// [held back](Connection::held_back)), or its controller ended, or
    /// (on an admin queue) its host disabled Keep Alive and sent no command
    /// on any queue for [`IDLE_TIMEOUT`], or its keep-alive
    /// timer expired; completes Asynchronous Event Requests with queued
    /// events; asks for the data of writes that waited for target-wide
    /// budget other connections have given back since.
    pub fn tick(&mut self, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        self.grant_waiting();
        let opened = *self.opened.get_or_insert(now);
        let Timeouts {
            handshake,
            pdu,
            idle,
        } = self.timeouts;
        if self.phase == Phase::IcReq && now.saturating_duration_since(opened) >= handshake {
            tracing::warn!(peer = %self.peer, "no ICReq within {handshake:?}; closing the connection");
            self.target
                .stats()
                .handshake_timeouts
                .fetch_add(1, Ordering::Relaxed);
            self.close("no ICReq in time");
            return;
        }
        if self.partial_since.is_some() && self.held_back() {
            // The transport is not reading (the host has not taken its
            // output): the rest of the PDU is not the host's to send yet.
            self.partial_since = Some(now);
        }
        if let Some(since) = self.partial_since {
            if now.saturating_duration_since(since) >= pdu {
                tracing::warn!(peer = %self.peer, "a PDU incomplete for {pdu:?}; closing the connection");
                self.target
                    .stats()
                    .pdu_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                self.close("PDU incomplete in time");
                return;
            }
        }
        let Some(ctrl) = self.ctrl.clone() else {
            return;
        };
        if self.auth.as_mut().is_some_and(|a| a.tick(now)) {
            self.auth_outcome();
            self.close("authentication not completed in time");
            return;
        }
        if self.qid == 0 && ctrl.keep_alive_expired(now) {
            tracing::warn!(cntlid = ctrl.cntlid, host = %ctrl.hostnqn, peer = %self.peer, "keep-alive timeout; ending the controller");
            self.target
                .stats()
                .keep_alive_timeouts
                .fetch_add(1, Ordering::Relaxed);
            ctrl.kill();
        } else if self.qid == 0 && ctrl.idle_expired(now, idle) {
            tracing::warn!(cntlid = ctrl.cntlid, host = %ctrl.hostnqn, peer = %self.peer, "no command for {idle:?} with keep-alive disabled; ending the controller");
            self.target
                .stats()
                .idle_timeouts
                .fetch_add(1, Ordering::Relaxed);
            ctrl.kill();
        }
        if ctrl.is_dead() {
            self.close("controller ended");
            return;
        }
        if self.qid == 0 {
            while !self.aers.is_empty() {
                let Some(ev) = ctrl.with(|s| s.events.pop_front()) else {
                    break;
                };
                let cid = self.aers.remove(0);
                let mut c = Cqe::new(cid, Status::SUCCESS);
                c.dw0 = ev;
                self.respond(c, None);
            }
        }
    }

    /// Hands back the result of a block request.
    pub fn complete(&mut self, done: BlockCompletion) {
        let Some(Pending::Executing { sqe, read, bytes }) = self.pending.remove(&done.cid) else {
            tracing::error!(
                cid = done.cid,
                "completion of a command that is not executing"
            );
            return;
        };
        match done.result {
            Ok(data) => {
                if let Some(c) = &self.ctrl {
                    let h = &c.health;
                    if read {
                        h.bytes_read.fetch_add(bytes, Ordering::Relaxed);
                        h.reads.fetch_add(1, Ordering::Relaxed);
                    } else if sqe.opcode() == nvm::WRITE {
                        h.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                        h.writes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if read {
                    self.finish(&sqe, Cqe::new(sqe.cid(), Status::SUCCESS), Some(data));
                } else {
                    self.recycle(data);
                    self.finish(&sqe, Cqe::new(sqe.cid(), Status::SUCCESS), None);
                }
            }
            Err(e) if is_namespace_removed(&e) => {
                tracing::debug!(
                    cid = sqe.cid(),
                    nsid = sqe.nsid(),
                    "namespace removed under a command"
                );
                self.finish(&sqe, Cqe::new(sqe.cid(), Status::INVALID_NS), None);
            }
            Err(e) if is_out_of_range(&e) => {
                // The namespace shrank between the range check and the I/O:
                // the same answer the check gives a command arriving now.
                tracing::debug!(cid = sqe.cid(), nsid = sqe.nsid(), error = %e, "namespace shrank under a command");
                self.finish(&sqe, Cqe::new(sqe.cid(), Status::LBA_OUT_OF_RANGE), None);
            }
            Err(e) => {
                tracing::warn!(cid = sqe.cid(), opcode = sqe.opcode(), nsid = sqe.nsid(), error = %e, "block I/O failed");
                if let Some(c) = &self.ctrl {
                    c.health.media_errors.fetch_add(1, Ordering::Relaxed);
                }
                let st = if read {
                    Status::UNRECOVERED_READ
                } else {
                    Status::WRITE_FAULT
                };
                self.finish(&sqe, Cqe::new(sqe.cid(), st), None);
            }
        }
    }

    /// Ends the connection (for transports: the peer went away).
    pub fn close(&mut self, why: &str) {
        if self.phase == Phase::Closed {
            return;
        }
        if self.auth_required && self.auth.as_mut().is_some_and(Authenticator::abandon) {
            self.auth_outcome();
        }
        self.phase = Phase::Closed;
        self.close_reason = Some(why.to_string());
        self.host_slot = None;
        self.requests.clear();
        // A DH job out finds no command waiting: its result is dropped.
        self.dh_jobs.clear();
        self.budget.release_all(self.target.write_budget());
        // Write data still to come is never written: drop its buffers now.
        self.pending
            .retain(|_, p| matches!(p, Pending::Executing { .. }));
        if let Some(c) = &self.ctrl {
            c.health.connections.fetch_sub(1, Ordering::Relaxed);
            if self.qid == 0 {
                self.target.remove_controller(c.cntlid);
            } else {
                let q = self.qid;
                c.with(|s| s.connected.retain(|&x| x != q));
            }
        }
    }

    fn fatal(&mut self, fes: Fes, fei: u32, header: &[u8], why: &str) {
        tracing::warn!(peer = %self.peer, fes = ?fes, fei, "protocol error: {why}; terminating the connection");
        self.target
            .stats()
            .protocol_errors
            .fetch_add(1, Ordering::Relaxed);
        pdu::encode_c2h_term_req(&mut self.out, fes as u16, fei, header);
        self.close(why);
    }

    fn on_pdu(&mut self, p: HostPdu<'_>, raw: &[u8], now: Instant) {
        let hdr = &raw[..raw.len().min(usize::from(raw.get(2).copied().unwrap_or(8)))];
        match (self.phase, p) {
            (Phase::IcReq, HostPdu::IcReq(r)) => {
                if r.pfv != 0 {
                    return self.fatal(
                        Fes::InvalidHeaderField,
                        8,
                        hdr,
                        "unsupported PDU format version",
                    );
                }
                if r.hpda != 0 {
                    return self.fatal(
                        Fes::UnsupportedParameter,
                        10,
                        hdr,
                        "host PDU data alignment is not supported",
                    );
                }
                self.digests = r.digests;
                pdu::encode_ic_resp(
                    &mut self.out,
                    &IcResp {
                        pfv: 0,
                        cpda: 0,
                        digests: r.digests,
                        maxh2cdata: MAX_H2C_DATA,
                    },
                );
                self.limits.digests = r.digests;
                self.phase = Phase::Ready;
            }
            (_, HostPdu::TermReq { fes, fei }) => {
                tracing::warn!(peer = %self.peer, fes, fei, "host terminated the connection");
                self.close("host sent H2CTermReq");
            }
            (
                Phase::Ready,
                HostPdu::CapsuleCmd {
                    sqe,
                    data,
                    data_digest_ok,
                },
            ) => self.on_command(sqe, data, data_digest_ok, hdr, now),
            (
                Phase::Ready,
                HostPdu::H2CData {
                    cccid,
                    ttag,
                    datao,
                    data,
                    last,
                    data_digest_ok,
                },
            ) => self.on_h2c_data(cccid, ttag, datao, data, last, data_digest_ok, hdr, now),
            _ => self.fatal(Fes::PduSequence, 0, hdr, "PDU out of sequence"),
        }
    }

    fn on_command(&mut self, sqe: Sqe, data: &[u8], digest_ok: bool, hdr: &[u8], now: Instant) {
        let cid = sqe.cid();
        if let Some(c) = &self.ctrl {
            c.touch(now);
        }
        self.sqhd = (self.sqhd + 1) % self.sqsize.max(1);
        if let Some(i) = self.aers.iter().position(|&a| a == cid) {
            // The host has given up this Asynchronous Event Request: SPDK's
            // host, detaching, completes its AERs itself without telling
            // the target and reuses their CIDs for the shutdown's Property
            // Get. A completion for it now would answer the new command, so
            // it is dropped without one (as nvmet and SPDK's target, which
            // never look at CIDs, in effect do).
            tracing::debug!(peer = %self.peer, cid, "CID of a waiting AER reused; the AER is dropped");
            self.aers.remove(i);
        }
        if self.pending.contains_key(&cid) {
            // Answered, not fatal: the stream stays in step, and the
            // command that holds the CID goes on.
            tracing::warn!(peer = %self.peer, cid, "command identifier already in use");
            return self.respond(Cqe::new(cid, Status::CID_CONFLICT), None);
        }
        if self.pending.len() + self.aers.len() >= usize::from(self.sqsize.max(1)) {
            return self.fatal(
                Fes::PduSequence,
                0,
                hdr,
                "more commands outstanding than the queue holds",
            );
        }
        if !digest_ok {
            return self.respond(Cqe::new(cid, Status::TRANSIENT_TRANSPORT), None);
        }
        // Fabrics transfers describe data with one SGL descriptor.
        if !(1..=2).contains(&sqe.psdt()) {
            return self.finish(&sqe, Cqe::new(cid, Status::INVALID_FIELD), None);
        }
        let dir = if sqe.opcode() == FABRICS {
            sqe.fctype() & 3
        } else {
            sqe.opcode() & 3
        };
        let len = sqe.sgl_len();
        match sqe.sgl_id() {
            sgl::IN_CAPSULE => {
                if dir != 1
                    || sqe.sgl_addr() != 0
                    || len as usize != data.len()
                    || len > IN_CAPSULE_DATA
                {
                    return self.finish(&sqe, Cqe::new(cid, Status::SGL_LENGTH_INVALID), None);
                }
                let ns = self.accepted_namespace(&sqe);
                self.dispatch(sqe, ns, data.to_vec(), now);
            }
            sgl::TRANSPORT => {
                if !data.is_empty() {
                    return self.finish(&sqe, Cqe::new(cid, Status::SGL_LENGTH_INVALID), None);
                }
                if len > MAX_TRANSFER.max(4096) {
                    return self.finish(&sqe, Cqe::new(cid, Status::INVALID_FIELD), None);
                }
                let ns = self.accepted_namespace(&sqe);
                if dir == 1 && len > 0 {
                    // Host-to-controller data not in the capsule: checked
                    // before it is asked for.
                    return match self.reads_data(&sqe, ns.as_ref()) {
                        Ok(true) => self.ask_for_data(sqe, ns),
                        // Answered as the command stands: it would ignore
                        // the data.
                        Ok(false) => self.dispatch(sqe, ns, Vec::new(), now),
                        Err(st) => self.finish(&sqe, Cqe::new(cid, st), None),
                    };
                }
                self.dispatch(sqe, ns, Vec::new(), now);
            }
            // No data at all, whatever the descriptor type.
            _ if len == 0 => {
                let ns = self.accepted_namespace(&sqe);
                self.dispatch(sqe, ns, Vec::new(), now);
            }
            _ => self.finish(&sqe, Cqe::new(cid, Status::SGL_TYPE_INVALID), None),
        }
    }

    /// Whether to ask for the data of a command that carries
    /// host-to-controller data through R2T: `Ok(true)` when the command
    /// reads it and passes the checks it will pass once its data is in,
    /// `Ok(false)` when it reads no data (its answer does not depend on
    /// any), `Err` with the status it gets otherwise.
    fn reads_data(&self, sqe: &Sqe, ns: Option<&Arc<Namespace>>) -> Result<bool, Status> {
        if sqe.opcode() == FABRICS && sqe.fctype() == fctype::AUTH_SEND && self.ctrl.is_some() {
            return if sqe.sgl_len() as usize > MAX_AUTH_DATA {
                Err(Status::INVALID_FIELD)
            } else {
                Ok(true)
            };
        }
        if sqe.opcode() == FABRICS {
            // Only a Connect reads data, as the queue's first command, and
            // answers a short one without reading it.
            return Ok(sqe.fctype() == fctype::CONNECT
                && self.ctrl.is_none()
                && sqe.sgl_len() as usize >= CONNECT_DATA_LEN);
        }
        if self.ctrl.is_none() {
            // Answered with Command Sequence Error.
            return Ok(false);
        }
        if self.qid == 0 {
            // Discovery controllers included.
            return Ok(admin::reads_data(sqe.opcode()));
        }
        match sqe.opcode() {
            nvm::WRITE => {
                let ns = io_namespace(sqe, ns)?;
                transfer_range(sqe, ns)?;
                Ok(true)
            }
            nvm::DSM => {
                io_namespace(sqe, ns)?;
                if (sqe.sgl_len() as usize) < dsm_len(sqe) {
                    return Err(Status::SGL_LENGTH_INVALID);
                }
                Ok(true)
            }
            // Every other NVM command served moves no data to the
            // controller; `io` answers the rest with Invalid Opcode.
            _ => Ok(false),
        }
    }

    /// Asks for the data of a checked command now, or queues the command
    /// until the budgets have room for it.
    fn ask_for_data(&mut self, sqe: Sqe, ns: Option<Arc<Namespace>>) {
        // Earlier commands first, if the target's budget has room again:
        // this one waits only when it has to.
        self.grant_waiting();
        let cid = sqe.cid();
        if self
            .budget
            .admit(self.target.write_budget(), cid, sqe.sgl_len())
        {
            self.start_receiving(sqe, ns);
        } else {
            self.target
                .stats()
                .write_buffer_waits
                .fetch_add(1, Ordering::Relaxed);
            self.pending.insert(cid, Pending::Waiting { sqe, ns });
        }
    }

    /// Asks for the data of the waiting commands the budgets have room
    /// for now, oldest first.
    fn grant_waiting(&mut self) {
        if self.phase == Phase::Closed {
            return;
        }
        while let Some(cid) = self.budget.grant(self.target.write_budget()) {
            match self.pending.remove(&cid) {
                Some(Pending::Waiting { sqe, ns }) => self.start_receiving(sqe, ns),
                other => {
                    // Every queued command is waiting; should that ever
                    // not hold, its reservation must not leak.
                    tracing::error!(cid, "budget granted to a command that is not waiting");
                    if let Some(p) = other {
                        self.pending.insert(cid, p);
                    }
                    self.budget.release(self.target.write_budget(), cid);
                }
            }
        }
    }

    /// Sends the first R2T of a command holding its reservation. Its
    /// buffer is taken when data arrives.
    fn start_receiving(&mut self, sqe: Sqe, ns: Option<Arc<Namespace>>) {
        let (cid, len) = (sqe.cid(), sqe.sgl_len());
        let first = len.min(MAX_H2C_DATA);
        pdu::encode_r2t(&mut self.out, self.digests, cid, cid, 0, first);
        self.pending.insert(
            cid,
            Pending::Receiving {
                sqe,
                ns,
                buf: Vec::new(),
                len,
                got: 0,
                r2t_end: first,
                corrupt: false,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn on_h2c_data(
        &mut self,
        cccid: u16,
        ttag: u16,
        datao: u32,
        data: &[u8],
        last: bool,
        ok: bool,
        hdr: &[u8],
        now: Instant,
    ) {
        let Some(Pending::Receiving {
            buf,
            len,
            got,
            r2t_end,
            corrupt,
            ..
        }) = self.pending.get_mut(&cccid)
        else {
            return self.fatal(
                Fes::InvalidHeaderField,
                8,
                hdr,
                "H2CData for a command that awaits no data",
            );
        };
        if ttag != cccid {
            return self.fatal(
                Fes::InvalidHeaderField,
                10,
                hdr,
                "H2CData with an unknown transfer tag",
            );
        }
        let end = u64::from(datao) + data.len() as u64;
        if datao != *got || end > u64::from(*r2t_end) {
            return self.fatal(
                Fes::DataOutOfRange,
                12,
                hdr,
                "H2CData outside the requested range",
            );
        }
        if last != (end == u64::from(*r2t_end)) {
            return self.fatal(
                Fes::InvalidHeaderField,
                1,
                hdr,
                "H2CData LAST_PDU flag does not match the transfer",
            );
        }
        if buf.is_empty() {
            // The first data: only now does the command hold memory.
            *buf = self.spare.pop().unwrap_or_default();
            sized(buf, *len as usize);
        }
        buf[datao as usize..end as usize].copy_from_slice(data);
        *got = end as u32;
        let (got, total) = (*got, *len);
        *corrupt |= !ok;
        if got < *r2t_end {
            return;
        }
        if got < total {
            let next = (total - got).min(MAX_H2C_DATA);
            *r2t_end = got + next;
            pdu::encode_r2t(&mut self.out, self.digests, cccid, cccid, got, next);
            return;
        }
        match self.pending.remove(&cccid) {
            Some(Pending::Receiving {
                sqe, corrupt: true, ..
            }) => self.finish(&sqe, Cqe::new(cccid, Status::TRANSIENT_TRANSPORT), None),
            Some(Pending::Receiving { sqe, ns, buf, .. }) => self.dispatch(sqe, ns, buf, now),
            _ => {}
        }
    }

    /// Runs a command whose data (if any) is all here; an I/O command runs
    /// against `ns`, the namespace it was accepted against.
    fn dispatch(&mut self, sqe: Sqe, ns: Option<Arc<Namespace>>, data: Vec<u8>, now: Instant) {
        let outcome = if self.needs_auth(&sqe) {
            Outcome::status(&sqe, Status::AUTH_REQUIRED)
        } else if sqe.opcode() == FABRICS {
            self.fabrics(&sqe, &data, now)
        } else if self.ctrl.is_none() {
            Outcome::status(&sqe, Status::COMMAND_SEQUENCE)
        } else if self.qid == 0 {
            self.admin_queue().admin(&sqe, &data, now)
        } else {
            self.io(&sqe, ns, data)
        };
        self.conclude(sqe, outcome);
    }

    /// Completes, parks or starts the block request of a command.
    fn conclude(&mut self, sqe: Sqe, outcome: Outcome) {
        match outcome {
            Outcome::Done(cqe, d) => self.finish(&sqe, cqe, d),
            Outcome::DoneAndClose(cqe) => {
                self.finish(&sqe, cqe, None);
                self.close("host disconnected the queue");
            }
            Outcome::Block(req, bytes) => {
                let read = matches!(req.op, BlockOp::Read { .. });
                self.pending
                    .insert(sqe.cid(), Pending::Executing { sqe, read, bytes });
                self.requests.push_back(req);
            }
            Outcome::Parked => {}
        }
        if self.auth.as_ref().is_some_and(Authenticator::has_failed) {
            // After the Failure1 (or the host's Failure2), as Linux's
            // target: the queue is of no further use.
            self.close("authentication failed");
        }
    }

    /// Whether `sqe` must wait for authentication: the queue requires it,
    /// has not completed it, and `sqe` is not an authentication command
    /// or a Disconnect.
    fn needs_auth(&self, sqe: &Sqe) -> bool {
        if self.ctrl.is_none()
            || !self.auth_required
            || self
                .auth
                .as_ref()
                .is_some_and(Authenticator::is_authenticated)
        {
            return false;
        }
        !(sqe.opcode() == FABRICS
            && matches!(
                sqe.fctype(),
                fctype::AUTH_SEND | fctype::AUTH_RECEIVE | fctype::DISCONNECT
            ))
    }

    /// Checks the protocol fields of an Authentication Send or Receive:
    /// SECP E9h, SPSP0 and SPSP1 01h, a non-zero length (CDW11).
    fn auth_fields(sqe: &Sqe) -> Result<usize, Status> {
        let [_, spsp0, spsp1, secp] = sqe.cdw(10).to_le_bytes();
        if secp != crate::auth::SECP || spsp0 != crate::auth::SPSP || spsp1 != crate::auth::SPSP {
            return Err(Status::INVALID_FIELD);
        }
        match sqe.cdw(11) as usize {
            0 => Err(Status::INVALID_FIELD),
            n => Ok(n),
        }
    }

    /// The queue's authenticator, made on first use when the host has
    /// keys.
    fn authenticator(&mut self, now: Instant) -> Option<&mut Authenticator> {
        if self.auth.is_none() {
            let keys = self.auth_keys.clone()?;
            let c = self.ctrl.as_ref()?;
            self.auth = Some(Authenticator::new(
                keys,
                &c.hostnqn,
                &c.subnqn,
                AUTH_TIMEOUT,
                now,
            ));
        }
        self.auth.as_mut()
    }

    /// Authentication Send: hands the message to the authenticator. An
    /// AUTH_Negotiate from an address over its rate is refused before any
    /// DH work; a Reply that needs the shared secret waits for its job.
    fn auth_send(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> Outcome {
        let tl = match Self::auth_fields(sqe) {
            Ok(n) => n,
            Err(st) => return Outcome::status(sqe, st),
        };
        if tl != data.len() {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        if self.awaits_dh() {
            return Outcome::status(sqe, Status::COMMAND_SEQUENCE);
        }
        let negotiate = data.first() == Some(&0) && data.get(1) == Some(&0);
        if negotiate && self.auth.is_some() {
            // An AUTH_Negotiate (re-authentication): the host's keys as
            // they are now.
            if let Some(c) = &self.ctrl {
                let keys = self.target.auth_policy(&c.subnqn, &c.hostnqn).1;
                self.auth_keys.clone_from(&keys);
                if let Some(a) = self.auth.as_mut() {
                    a.set_keys(keys);
                }
            }
        }
        if self.authenticator(now).is_none() {
            // No secret for this host: nothing to authenticate with.
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        let admit = if negotiate {
            self.target.auth_limiter().admit(self.peer.ip(), now)
        } else {
            Admit::Allowed
        };
        let Some(a) = self.auth.as_mut() else {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        };
        let job = match admit {
            Admit::Allowed => a.send_deferred(data, now),
            Admit::Refused { log } => {
                a.refuse(data, Refusal::RateLimited, now);
                if let Some(unlogged) = log {
                    let rate = self.target.auth_limiter().rate();
                    tracing::warn!(peer = %self.peer, unlogged, per_sec = rate.per_sec, burst = rate.burst, "authentication attempts over the per-address rate refused");
                }
                None
            }
        };
        match job {
            None => {
                self.auth_outcome();
                Outcome::ok(sqe)
            }
            Some(job) => self.dh_job(sqe, job, None, now),
        }
    }

    /// Runs `job` here, or parks `sqe` until the transport brings its
    /// result ([`Connection::complete_dh`]).
    fn dh_job(&mut self, sqe: &Sqe, job: DhJob, receive: Option<usize>, now: Instant) -> Outcome {
        if self.dh_offload {
            self.pending
                .insert(sqe.cid(), Pending::Authenticating { sqe: *sqe, receive });
            self.dh_jobs.push_back((sqe.cid(), job));
            return Outcome::Parked;
        }
        let Some(a) = self.auth.as_mut() else {
            return Outcome::status(sqe, Status::COMMAND_SEQUENCE);
        };
        a.dh_done(job.run(), now);
        match receive {
            Some(al) => self.auth_answer(sqe, al, now),
            None => {
                self.auth_outcome();
                Outcome::ok(sqe)
            }
        }
    }

    /// Authentication Receive: the authenticator's next message.
    fn auth_receive(&mut self, sqe: &Sqe, now: Instant) -> Outcome {
        let al = match Self::auth_fields(sqe) {
            Ok(n) => n,
            Err(st) => return Outcome::status(sqe, st),
        };
        if al > sqe.sgl_len() as usize {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        if self.awaits_dh() {
            return Outcome::status(sqe, Status::COMMAND_SEQUENCE);
        }
        if self.authenticator(now).is_none() {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        match self.auth.as_mut().map(|a| a.receive_deferred(al, now)) {
            Some(Ok(Step::Compute(job))) => self.dh_job(sqe, job, Some(al), now),
            Some(r) => self.receive_outcome(sqe, r.map(Some)),
            None => Outcome::status(sqe, Status::INVALID_FIELD),
        }
    }

    /// The answer of a Receive whose DH job is done.
    fn auth_answer(&mut self, sqe: &Sqe, al: usize, now: Instant) -> Outcome {
        let r = match self.auth.as_mut().map(|a| a.receive_deferred(al, now)) {
            // The job's result was taken: nothing more to compute.
            Some(Ok(Step::Compute(_))) => Err(ReceiveError::InProgress),
            Some(r) => r,
            None => return Outcome::status(sqe, Status::INVALID_FIELD),
        };
        self.receive_outcome(sqe, r.map(Some))
    }

    fn receive_outcome(&mut self, sqe: &Sqe, r: Result<Option<Step>, ReceiveError>) -> Outcome {
        match r {
            Ok(Some(Step::Data(d))) => {
                self.auth_outcome();
                Outcome::data(sqe, d)
            }
            Ok(_) => Outcome::status(sqe, Status::INVALID_FIELD),
            Err(e) => {
                tracing::debug!(peer = %self.peer, "authentication receive: {e}");
                Outcome::status(sqe, Status::INVALID_FIELD)
            }
        }
    }

    /// Counts and logs a transaction that just ended (never with key
    /// material).
    fn auth_outcome(&mut self) {
        let Some(o) = self.auth.as_mut().and_then(Authenticator::take_outcome) else {
            return;
        };
        let Some(c) = &self.ctrl else {
            return;
        };
        match o {
            AuthOutcome::Succeeded => {
                c.health.auth_succeeded.fetch_add(1, Ordering::Relaxed);
                self.target.auth_limiter().refund(self.peer.ip());
                tracing::info!(cntlid = c.cntlid, qid = self.qid, host = %c.hostnqn, subnqn = %c.subnqn, peer = %self.peer, "host authenticated");
            }
            AuthOutcome::Failed { explanation, why } => {
                c.health.auth_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(cntlid = c.cntlid, qid = self.qid, host = %c.hostnqn, subnqn = %c.subnqn, peer = %self.peer, explanation, "authentication failed: {why}");
            }
            AuthOutcome::Refused {
                refusal: Refusal::RateLimited,
            } => {
                // Logged where refused, at a bounded rate.
                c.health.auth_rate_limited.fetch_add(1, Ordering::Relaxed);
            }
            AuthOutcome::Refused {
                refusal: Refusal::Busy,
            } => {
                c.health.auth_busy.fetch_add(1, Ordering::Relaxed);
                if let Some(unlogged) = self.target.auth_limiter().busy_log(Instant::now()) {
                    tracing::warn!(host = %c.hostnqn, subnqn = %c.subnqn, peer = %self.peer, unlogged, "authentication refused: the DH pool's queue is full");
                }
            }
        }
    }

    /// Completes a command: logs failures, sends data and the response.
    fn finish(&mut self, sqe: &Sqe, cqe: Cqe, data: Option<Vec<u8>>) {
        let st = cqe.status;
        if st != 0 {
            if let Some(c) = &self.ctrl {
                c.health.errors.fetch_add(1, Ordering::Relaxed);
                c.log_error(ErrorEntry {
                    error_count: 0,
                    sqid: self.qid,
                    cid: sqe.cid(),
                    status: st,
                    param_location: 0xffff,
                    lba: if self.qid != 0 { sqe.slba() } else { 0 },
                    nsid: sqe.nsid(),
                });
            }
        }
        let data = data.map(|mut d| {
            d.truncate(sqe.sgl_len() as usize);
            d
        });
        self.respond(cqe, data);
        if self.budget.release(self.target.write_budget(), sqe.cid()) {
            self.grant_waiting();
        }
    }

    /// Keeps a sent buffer: `pdus` when it held encoded PDUs, else data.
    fn release(&mut self, buf: Vec<u8>, pdus: bool) {
        if !pdus {
            self.recycle(buf);
        } else if self.spare_out.len() < SPARE_OUT {
            self.spare_out.push(buf);
        }
    }

    /// Keeps a data buffer for a later command.
    fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS && buf.capacity() <= MAX_TRANSFER as usize {
            self.spare.push(buf);
        }
    }

    /// Sends `data` (if any) in a C2HData PDU, then the response unless
    /// the data PDU carries SUCCESS. Large data is sent from its own buffer,
    /// small data copied; either way the buffer is reused afterwards.
    fn respond(&mut self, mut cqe: Cqe, data: Option<Vec<u8>>) {
        if self.phase == Phase::Closed {
            if let Some(d) = data {
                self.recycle(d);
            }
            return;
        }
        let d = data.unwrap_or_default();
        let skip_resp = !d.is_empty() && cqe.status == 0 && self.sqflow_disabled;
        let (dg, cid) = (self.digests, cqe.cid);
        if d.len() >= SEND_FROM_BUFFER {
            // No longer than the command's SGL length, a u32.
            let len = d.len() as u32;
            pdu::encode_c2h_data_header(&mut self.out, dg, cid, 0, len, true, skip_resp);
            let digest = dg.data.then(|| pdu::data_digest(&d));
            self.send_buffer(d);
            if let Some(digest) = digest {
                self.out.extend_from_slice(&digest);
            }
        } else {
            if !d.is_empty() {
                pdu::encode_c2h_data(&mut self.out, dg, cid, 0, &d, true, skip_resp);
            }
            if d.capacity() != 0 {
                self.recycle(d);
            }
        }
        if skip_resp {
            return;
        }
        cqe.sqhd = self.sqhd;
        cqe.sqid = self.qid;
        pdu::encode_capsule_resp(&mut self.out, self.digests, &cqe);
    }

    /// What the admin command set sees of this queue, which must be a
    /// connected admin queue.
    fn admin_queue(&mut self) -> AdminQueue<'_> {
        AdminQueue {
            ctrl: self.ctrl.as_deref().expect("connected admin queue"),
            target: &self.target,
            local: self.local,
            aers: &mut self.aers,
        }
    }

    /// The namespace `nsid` of this connection's subsystem.
    pub(crate) fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        let ctrl = self.ctrl.as_ref()?;
        self.target
            .subsystem(&ctrl.subnqn)?
            .namespaces
            .get(&nsid)
            .cloned()
    }

    /// The namespace an I/O command is accepted against, looked up once,
    /// when its capsule arrives; `None` for other commands and for an NSID
    /// not served then.
    ///
    /// A write whose data comes through R2T runs against this instance
    /// once its data is in, not against whatever serves the NSID by then:
    /// if the namespace was deleted meanwhile the write fails with Invalid
    /// Namespace, even when a namespace was created again under the same
    /// ID (which never sees the data); so does a write for an NSID that
    /// was unknown when it arrived.
    fn accepted_namespace(&self, sqe: &Sqe) -> Option<Arc<Namespace>> {
        if sqe.opcode() == FABRICS || self.qid == 0 {
            return None;
        }
        self.namespace(sqe.nsid())
    }

    fn io(&mut self, sqe: &Sqe, ns: Option<Arc<Namespace>>, data: Vec<u8>) -> Outcome {
        let ns = match io_namespace(sqe, ns.as_ref()) {
            Ok(ns) => ns.clone(),
            Err(st) => return Outcome::status(sqe, st),
        };
        let range = |slba: u64, nlb: u64| lba_range(&ns, slba, nlb);
        let req = |op| BlockRequest {
            cid: sqe.cid(),
            namespace: ns.clone(),
            op,
        };
        match sqe.opcode() {
            nvm::READ | nvm::WRITE => {
                let (offset, len) = match transfer_range(sqe, &ns) {
                    Ok(r) => r,
                    Err(st) => return Outcome::status(sqe, st),
                };
                let op = if sqe.opcode() == nvm::READ {
                    BlockOp::Read {
                        offset,
                        len: len as usize,
                        buf: self.spare.pop().unwrap_or_default(),
                    }
                } else {
                    BlockOp::Write {
                        offset,
                        data,
                        fua: sqe.fua(),
                    }
                };
                Outcome::Block(req(op), len)
            }
            nvm::FLUSH => Outcome::Block(req(BlockOp::Flush), 0),
            nvm::WRITE_ZEROES => match range(sqe.slba(), u64::from(sqe.nlb())) {
                Ok((offset, len)) => {
                    let deallocate = sqe.cdw(12) & (1 << 25) != 0;
                    Outcome::Block(
                        req(BlockOp::WriteZeroes {
                            offset,
                            len,
                            deallocate,
                        }),
                        0,
                    )
                }
                Err(st) => Outcome::status(sqe, st),
            },
            nvm::DSM => {
                if data.len() < dsm_len(sqe) {
                    return Outcome::status(sqe, Status::SGL_LENGTH_INVALID);
                }
                let nr = dsm_len(sqe) / 16;
                let mut ranges = Vec::with_capacity(nr);
                for r in data.chunks_exact(16).take(nr) {
                    let nlb = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes"));
                    let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
                    match range(slba, u64::from(nlb)) {
                        Ok(r) => ranges.push(r),
                        Err(st) => return Outcome::status(sqe, st),
                    }
                }
                if sqe.cdw(11) & (1 << 2) == 0 {
                    // Only attribute hints: nothing to do.
                    return Outcome::ok(sqe);
                }
                Outcome::Block(req(BlockOp::Deallocate { ranges }), 0)
            }
            _ => Outcome::status(sqe, Status::INVALID_OPCODE),
        }
    }

    fn fabrics(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> Outcome {
        match sqe.fctype() {
            fctype::CONNECT => self.connect(sqe, data, now),
            fctype::PROPERTY_GET | fctype::PROPERTY_SET if self.ctrl.is_none() || self.qid != 0 => {
                Outcome::status(sqe, Status::COMMAND_SEQUENCE)
            }
            fctype::PROPERTY_GET => self.admin_queue().property_get(sqe),
            fctype::PROPERTY_SET => self.admin_queue().property_set(sqe),
            fctype::DISCONNECT if self.ctrl.is_some() => {
                Outcome::DoneAndClose(Cqe::new(sqe.cid(), Status::SUCCESS))
            }
            fctype::DISCONNECT => Outcome::status(sqe, Status::COMMAND_SEQUENCE),
            fctype::AUTH_SEND | fctype::AUTH_RECEIVE if self.ctrl.is_none() => {
                Outcome::status(sqe, Status::COMMAND_SEQUENCE)
            }
            fctype::AUTH_SEND => self.auth_send(sqe, data, now),
            fctype::AUTH_RECEIVE => self.auth_receive(sqe, now),
            _ => Outcome::status(sqe, Status::INVALID_OPCODE),
        }
    }

    fn connect(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> Outcome {
        /// Connect: Invalid Parameters, naming the parameter (in the data or
        /// in the command, at byte offset `at`).
        fn invalid(sqe: &Sqe, in_data: bool, at: u16) -> Outcome {
            let mut c = Cqe::new(sqe.cid(), Status::CONNECT_INVALID_PARAMETERS);
            c.dw0 = u32::from(in_data) | (u32::from(at) << 16);
            Outcome::Done(c, None)
        }
        fn nqn(b: &[u8]) -> String {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        }
        if self.ctrl.is_some() {
            return Outcome::status(sqe, Status::COMMAND_SEQUENCE);
        }
        if data.len() < CONNECT_DATA_LEN {
            return Outcome::status(sqe, Status::SGL_LENGTH_INVALID);
        }
        let refused = |o: Outcome| {
            self.target
                .stats()
                .connects_refused
                .fetch_add(1, Ordering::Relaxed);
            o
        };
        if sqe.cdw(10) & 0xffff != 0 {
            return refused(Outcome::status(sqe, Status::CONNECT_INCOMPATIBLE_FORMAT));
        }
        let qid = (sqe.cdw(10) >> 16) as u16;
        let sqsize = (sqe.cdw(11) & 0xffff) as u16;
        let cattr = (sqe.cdw(11) >> 16) as u8;
        let kato = Duration::from_millis(u64::from(sqe.cdw(12)));
        let hostid: [u8; 16] = data[0..16].try_into().expect("16 bytes");
        let cntlid = u16::from_le_bytes([data[16], data[17]]);
        let subnqn = nqn(&data[256..512]);
        let hostnqn = nqn(&data[512..768]);
        if sqsize == 0 || sqsize >= MAX_QUEUE_SIZE {
            return refused(invalid(sqe, false, 44));
        }
        let (auth_required, auth_keys) = if subnqn == spec::DISCOVERY_NQN {
            (false, None)
        } else {
            self.target.auth_policy(&subnqn, &hostnqn)
        };
        if auth_required && auth_keys.is_none() {
            tracing::warn!(%subnqn, %hostnqn, peer = %self.peer, "authentication required, but the host has no secret");
            self.target
                .health(&subnqn)
                .auth_failed
                .fetch_add(1, Ordering::Relaxed);
            let mut c = Cqe::new(sqe.cid(), Status::CONNECT_INVALID_HOST);
            c.dw0 = 1 | (512 << 16);
            return refused(Outcome::Done(c, None));
        }
        let Some(host_slot) = self.target.admit_host(&hostnqn) else {
            return refused(Outcome::status(sqe, Status::CONNECT_CONTROLLER_BUSY));
        };
        let ctrl = if qid == 0 {
            let kind = if subnqn == spec::DISCOVERY_NQN {
                ControllerKind::Discovery
            } else {
                match self.target.subsystem(&subnqn) {
                    Some(s) if !s.exported_on(self.local) => {
                        tracing::warn!(%subnqn, local = %self.local, "connect to a subsystem not exported on this listener");
                        return refused(invalid(sqe, true, 256));
                    }
                    Some(s) if !s.allows_host(&hostnqn) => {
                        tracing::warn!(%subnqn, %hostnqn, peer = %self.peer, "host not allowed");
                        let mut c = Cqe::new(sqe.cid(), Status::CONNECT_INVALID_HOST);
                        c.dw0 = 1 | (512 << 16);
                        return refused(Outcome::Done(c, None));
                    }
                    Some(_) => ControllerKind::Io,
                    None => {
                        tracing::warn!(%subnqn, %hostnqn, "connect to an unknown subsystem");
                        return refused(invalid(sqe, true, 256));
                    }
                }
            };
            if cntlid != 0xffff {
                return refused(invalid(sqe, true, 16));
            }
            let health = self.target.health(&subnqn);
            let made = self.target.add_controller(|id| {
                Controller::new(
                    id,
                    kind,
                    subnqn.clone(),
                    hostnqn.clone(),
                    hostid,
                    self.local,
                    kato,
                    sqsize + 1,
                    health,
                    now,
                )
            });
            let Some(c) = made else {
                return refused(Outcome::status(sqe, Status::CONNECT_CONTROLLER_BUSY));
            };
            tracing::info!(cntlid = c.cntlid, %subnqn, %hostnqn, peer = %self.peer, kato_ms = kato.as_millis() as u64, "controller created");
            c
        } else {
            let Some(c) = self.target.controller(cntlid) else {
                return refused(invalid(sqe, true, 16));
            };
            if c.subnqn != subnqn {
                return refused(invalid(sqe, true, 256));
            }
            if c.hostnqn != hostnqn {
                return refused(invalid(sqe, true, 512));
            }
            if c.hostid != hostid {
                tracing::warn!(cntlid, %hostnqn, peer = %self.peer, "I/O queue connect with another host ID than its controller's");
                return refused(invalid(sqe, true, 0));
            }
            if c.listener != self.local {
                tracing::warn!(cntlid, local = %self.local, listener = %c.listener, "I/O queue connect on another listener than its controller's");
                return refused(invalid(sqe, true, 16));
            }
            // The allow list as it is now, not as it was when the admin
            // queue connected.
            if c.kind == ControllerKind::Io {
                match self.target.subsystem(&subnqn) {
                    Some(s) if s.allows_host(&hostnqn) && s.exported_on(self.local) => {}
                    _ => {
                        tracing::warn!(%subnqn, %hostnqn, peer = %self.peer, "I/O queue connect of a host no longer allowed");
                        let mut c = Cqe::new(sqe.cid(), Status::CONNECT_INVALID_HOST);
                        c.dw0 = 1 | (512 << 16);
                        return refused(Outcome::Done(c, None));
                    }
                }
            }
            if c.kind == ControllerKind::Discovery || !c.ready() {
                return refused(invalid(sqe, false, 42));
            }
            let ok = c.with(|s| {
                if qid > s.io_queues || s.connected.contains(&qid) {
                    false
                } else {
                    s.connected.push(qid);
                    true
                }
            });
            if !ok {
                return refused(invalid(sqe, false, 42));
            }
            c
        };
        self.qid = qid;
        self.sqsize = sqsize + 1;
        self.sqflow_disabled = cattr & 0x04 != 0;
        let id = ctrl.cntlid;
        ctrl.health.connections.fetch_add(1, Ordering::Relaxed);
        self.ctrl = Some(ctrl);
        self.host_slot = Some(host_slot);
        self.auth_required = auth_required;
        self.auth_keys = auth_keys;
        if auth_required {
            // The step timer starts now: a host that never authenticates
            // is cut off.
            let _ = self.authenticator(now);
        }
        // AUTHREQ (bits 31:16): ATR, bit 1, asks the host to authenticate.
        Outcome::dw0(sqe, u32::from(id) | u32::from(auth_required) << 17)
    }
}

impl Drop for Connection {
    /// A connection dropped without [`Connection::close`] gives back its
    /// share of the target's write buffer budget all the same.
    fn drop(&mut self) {
        self.budget.release_all(self.target.write_budget());
    }
}

/// The namespace an I/O command runs against: the checks every I/O command
/// passes before it runs, and a write before its data is asked for.
///
/// A namespace that left service after the command was accepted answers
/// as an unknown one does (its I/O would fail the same way in
/// [`Namespace::run`]).
fn io_namespace<'a>(
    sqe: &Sqe,
    ns: Option<&'a Arc<Namespace>>,
) -> Result<&'a Arc<Namespace>, Status> {
    if !IO_CMDS.contains(&sqe.opcode()) {
        return Err(Status::INVALID_OPCODE);
    }
    ns.filter(|n| !n.is_removed()).ok_or(Status::INVALID_NS)
}

/// Byte offset and length of `nlb` blocks from `slba` in `ns`, if they lie
/// within it.
fn lba_range(ns: &Namespace, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
    let shift = ns.lba_shift;
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks() => Ok((slba << shift, nlb << shift)),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

/// Byte offset and length of a Read's or Write's blocks: within the
/// namespace, no longer than [`MAX_TRANSFER`], and as long as its data.
fn transfer_range(sqe: &Sqe, ns: &Namespace) -> Result<(u64, u64), Status> {
    let (offset, len) = lba_range(ns, sqe.slba(), u64::from(sqe.nlb()))?;
    if len > u64::from(MAX_TRANSFER) {
        return Err(Status::INVALID_FIELD);
    }
    if len != u64::from(sqe.sgl_len()) {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    Ok((offset, len))
}

/// Bytes of range descriptors a Dataset Management command's data holds
/// (16 per range, NR + 1 ranges).
fn dsm_len(sqe: &Sqe) -> usize {
    ((sqe.cdw(10) & 0xff) as usize + 1) * 16
}

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
//!
//! The files, by concern:
//! - this one: the connection's state, what a transport calls, and the
//!   dispatch of PDUs and commands;
//! - `fabrics`: Connect, Property Get and Set, Disconnect;
//! - `admin`: the admin command set, which knows nothing of connections;
//! - `io`: NVM commands, the block requests they become
//!   ([`BlockRequest`], in `block`) and their completions;
//! - `transfer`: write data asked for through R2T, within the memory
//!   budgets of `budget`;
//! - `auth`: DH-HMAC-CHAP on a queue;
//! - `output`: what the connection sends, and the buffers it waits in;
//! - `command`: what a command comes to, the limits advertised and the
//!   command sets served; `timeouts`: the timers ([`Timeouts`]).

pub(crate) mod admin;
mod auth;
mod block;
pub(crate) mod budget;
mod command;
mod fabrics;
mod io;
mod output;
pub(crate) mod timeouts;
mod transfer;

pub use block::{BlockCompletion, BlockOp, BlockRequest, Completer};
pub use budget::{DEFAULT_BACKEND_IN_FLIGHT, DEFAULT_WRITE_BUFFER_BUDGET, R2T_BUDGET};
pub use command::{IN_CAPSULE_DATA, MAX_H2C_DATA, MAX_TRANSFER, MDTS, VERSION};
pub use io::{FIRST_SEND, TURN, WORK_CHUNK};
pub use output::{OUTPUT_BUDGET, SEND_FROM_BUFFER};
pub use timeouts::{Timeouts, ICREQ_TIMEOUT, IDLE_TIMEOUT, PDU_TIMEOUT};

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::auth::controller::HostKeys;
use crate::auth::pool::DhJob;
use crate::auth::Authenticator;
use crate::pdu::{self, Digests, Fes, HostPdu, IcResp, Limits};
use crate::spec::{sgl, Cqe, Sqe, Status, FABRICS};
use crate::target::controller::Controller;
use crate::target::{HostAdmission, Namespace, Target};

use admin::AdminQueue;
use budget::ConnBudget;
use command::Outcome;

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
    /// ([`budget`]) before it is asked for.
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
    /// When the requests a QoS limit held back may start.
    throttled_until: Option<Instant>,
    /// Most block requests one `execute_requests` runs on its thread.
    turn: usize,
    /// Where requests on asynchronous backends complete; without one they
    /// run on the calling thread like the rest.
    completer: Option<Completer>,
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
    /// The TLS identity the queue's secure channel was accepted under:
    /// its Connect must name that host and subsystem.
    tls: Option<Box<dpu_tls::Identity>>,
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
            throttled_until: None,
            turn: usize::MAX,
            completer: None,
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
            tls: None,
        }
    }

    /// Marks the connection as running over a TLS session accepted under
    /// `identity`: its Connect must name the identity's host and
    /// subsystem.
    pub fn set_tls(&mut self, identity: dpu_tls::Identity) {
        self.tls = Some(Box::new(identity));
    }

    /// The TLS identity of the connection's secure channel, if it has one.
    pub fn tls(&self) -> Option<&dpu_tls::Identity> {
        self.tls.as_deref()
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

    pub(super) fn fatal(&mut self, fes: Fes, fei: u32, header: &[u8], why: &str) {
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

    /// Runs a command whose data (if any) is all here; an I/O command runs
    /// against `ns`, the namespace it was accepted against.
    pub(super) fn dispatch(
        &mut self,
        sqe: Sqe,
        ns: Option<Arc<Namespace>>,
        data: Vec<u8>,
        now: Instant,
    ) {
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
    pub(super) fn conclude(&mut self, sqe: Sqe, outcome: Outcome) {
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

    /// What the admin command set sees of this queue, which must be a
    /// connected admin queue.
    pub(super) fn admin_queue(&mut self) -> AdminQueue<'_> {
        AdminQueue {
            ctrl: self.ctrl.as_deref().expect("connected admin queue"),
            target: &self.target,
            local: self.local,
            aers: &mut self.aers,
        }
    }
}

impl Drop for Connection {
    /// A connection dropped without [`Connection::close`] gives back its
    /// share of the target's write buffer budget all the same.
    fn drop(&mut self) {
        self.budget.release_all(self.target.write_budget());
    }
}

#[cfg(test)]
mod tests;

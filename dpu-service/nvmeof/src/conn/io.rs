//! NVM commands (Read, Write, Flush, Write Zeroes, Dataset Management):
//! their checks, the block requests they become, and those requests'
//! completions.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{is_out_of_range, is_unavailable};
use crate::qos::{admit, Limiter, Throttle};
use crate::spec::{nvm, Cqe, Sqe, Status, FABRICS};
use crate::target::{is_namespace_removed, Namespace};

use super::command::{Outcome, IO_CMDS};
use super::{BlockCompletion, BlockOp, BlockRequest, Completer, Connection, Pending, MAX_TRANSFER};

/// Completions of a batch of block requests after which
/// [`Connection::execute_requests`] first lets the transport send. On
/// loopback with 4 KiB random reads at QD 32, 8 gave 1.5x the IOPS of one
/// send per batch, more than 4 or 16 did, and cost nothing at QD 128 or
/// with 128 KiB reads.
pub const FIRST_SEND: usize = 8;

/// The turn a transport gives a connection ([`Connection::set_turn`])
/// while other connections it serves from the same thread are busy: at
/// most this many block requests per [`Connection::execute_requests`], so
/// that a host with a deep queue cannot make a host with a shallow one
/// wait for its whole batch. Beside a host at QD 128, 16 took a host at
/// QD 1 from 5x its p99 alone to 1.9x (`docs/benchmarks/nvme-qos.md`).
pub const TURN: usize = 16;

/// Most bytes one step of a Write Zeroes or Dataset Management zeroes or
/// deallocates ([`Connection::execute_requests`]): a few milliseconds of
/// memset on a RAM namespace.
pub const WORK_CHUNK: u64 = 4 << 20;

impl Connection {
    /// The next block request to run, if any.
    pub fn next_request(&mut self) -> Option<BlockRequest> {
        self.requests.pop_front()
    }

    /// Lets [`Connection::execute_requests`] start the requests on
    /// [asynchronous](crate::backend::Backend::asynchronous) backends
    /// rather than wait for them: their completions go to `completer`,
    /// from any thread, and the transport hands each back to
    /// [`Connection::complete`]. A transport sets it where the connection
    /// is served (its thread and token), before any I/O.
    pub fn set_completer(&mut self, completer: Option<Completer>) {
        self.completer = completer;
    }

    /// Runs the waiting block requests on the calling thread, as many as
    /// [`Connection::set_turn`] allows (the rest are left for the next
    /// call), calling
    /// `send` once the first [`FIRST_SEND`] have completed, then after 16,
    /// 32, ... in all: a transport sends the output there, so the host has
    /// its first answers, and sends its next commands, while the rest of
    /// a deep batch runs. While one request runs, the next read's data is
    /// prefetched ([`crate::backend::Backend::prefetch`]). Returns how many
    /// requests ran; what the last ones produced is left in the output.
    /// A request on an [asynchronous](crate::backend::Backend::asynchronous)
    /// backend is only started, when the transport set a completer
    /// ([`Connection::set_completer`]): it completes later, and does not
    /// count here.
    ///
    /// Once [`OUTPUT_BUDGET`] bytes of output wait unsent, the remaining
    /// requests are left for a later call ([`Connection::has_requests`]).
    /// So is the rest of a Write Zeroes or Dataset Management longer than
    /// [`WORK_CHUNK`]: one chunk runs per call, behind the requests that
    /// arrived after it, so a command over a whole namespace never holds
    /// the transport (or the other connections it serves) for long.
    ///
    /// [`OUTPUT_BUDGET`]: super::OUTPUT_BUDGET
    pub fn execute_requests(&mut self, mut send: impl FnMut(&mut Self)) -> usize {
        let (mut done, mut send_at) = (0, FIRST_SEND);
        self.throttled_until = None;
        // Read once a call, and only if a limit asks: the requests of one
        // call start within microseconds of each other.
        let mut now = None;
        while !self.held_back() {
            let Some(mut r) = self.next_request() else {
                break;
            };
            if !r.admitted {
                if let Err(until) = self.admit(&mut r, &mut now) {
                    // Over a QoS limit: it waits, first in line, and so do
                    // the requests behind it.
                    self.requests.push_front(r);
                    self.throttled_until = Some(until);
                    break;
                }
            }
            if let Some(c) = self
                .completer
                .as_ref()
                .filter(|_| r.namespace.backend.asynchronous())
            {
                let (ops, bytes) = r.load();
                let budget = self.target.backend_budget();
                if !r.namespace.backend.has_room(ops, bytes) || !budget.try_reserve(bytes) {
                    // Its store's bound on what is in flight, or the
                    // target's, is reached: the request waits here, first
                    // in line, for a later call.
                    self.requests.push_front(r);
                    break;
                }
                // The backend works elsewhere (a whole-namespace zeroing
                // too, in one piece): start it and go on. Its completion
                // gives the reservation back.
                r.start(c, Some((budget.clone(), bytes)));
                continue;
            }
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
            if done >= self.turn {
                break;
            }
            if done == send_at {
                send_at *= 2;
                send(self);
            }
        }
        done
    }

    /// True when block requests started on an asynchronous backend have
    /// not completed yet: their completions are to come through the
    /// completer ([`Connection::set_completer`]).
    pub fn awaits_io(&self) -> bool {
        let executing = self
            .pending
            .values()
            .filter(|p| matches!(p, Pending::Executing { .. }))
            .count();
        executing > self.requests.len()
    }

    /// True when block requests wait to run (left by
    /// [`Connection::execute_requests`] over the [`OUTPUT_BUDGET`]), not
    /// counting those a QoS limit holds back
    /// ([`Connection::throttled_until`]).
    ///
    /// [`OUTPUT_BUDGET`]: super::OUTPUT_BUDGET
    pub fn has_requests(&self) -> bool {
        !self.requests.is_empty() && self.throttled_until.is_none()
    }

    /// Lets each [`Connection::execute_requests`] from now on run at most
    /// `max` block requests on the calling thread ([`TURN`] while the
    /// transport's thread has other busy connections; unbounded, the
    /// default, while this one is alone: fewer, larger turns cost less).
    pub fn set_turn(&mut self, max: usize) {
        self.turn = max.max(1);
    }

    /// When the block requests a QoS limit held back in the last
    /// [`Connection::execute_requests`] may start: the transport calls it
    /// again then (not before: nothing would start), or sooner for other
    /// work. `None` when no limit holds any back.
    pub fn throttled_until(&self) -> Option<Instant> {
        self.throttled_until
    }

    /// Lets `r` start under its namespace's, its host's and the target's
    /// QoS limits, or answers when it may.
    /// `now` is read when first needed, and kept for the next request.
    fn admit(&self, r: &mut BlockRequest, now: &mut Option<Instant>) -> Result<(), Instant> {
        let ns = &*r.namespace.qos;
        let all = self.target.qos_limiter();
        let host = self.ctrl.as_deref().map(|c| &*c.qos);
        let active = ns.is_active() || all.is_active() || host.is_some_and(Limiter::is_active);
        if !active && r.throttle.since.is_none() {
            r.admitted = true;
            return Ok(());
        }
        let cost = r.qos_cost();
        let now = *now.get_or_insert_with(Instant::now);
        // Always in this order: namespace, host, target.
        match host {
            Some(h) => admit(&[ns, h, all], cost, &mut r.throttle, now)?,
            None => admit(&[ns, all], cost, &mut r.throttle, now)?,
        }
        r.admitted = true;
        Ok(())
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
            Err(e) if is_unavailable(&e) => {
                // The store is out of reach (a cluster or remote target
                // that did not answer in time): a state the backend logs
                // once, and one the host retries, or fails over from.
                tracing::debug!(cid = sqe.cid(), nsid = sqe.nsid(), error = %e, "namespace not ready");
                self.finish(&sqe, Cqe::new(sqe.cid(), Status::NS_NOT_READY), None);
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
    pub(super) fn accepted_namespace(&self, sqe: &Sqe) -> Option<Arc<Namespace>> {
        if sqe.opcode() == FABRICS || self.qid == 0 {
            return None;
        }
        self.namespace(sqe.nsid())
    }

    pub(super) fn io(&mut self, sqe: &Sqe, ns: Option<Arc<Namespace>>, data: Vec<u8>) -> Outcome {
        let ns = match io_namespace(sqe, ns.as_ref()) {
            Ok(ns) => ns.clone(),
            Err(st) => return Outcome::status(sqe, st),
        };
        let range = |slba: u64, nlb: u64| lba_range(&ns, slba, nlb);
        let req = |op| BlockRequest {
            cid: sqe.cid(),
            namespace: ns.clone(),
            op,
            throttle: Throttle::default(),
            admitted: false,
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
}

/// The namespace an I/O command runs against: the checks every I/O command
/// passes before it runs, and a write before its data is asked for.
///
/// A namespace that left service after the command was accepted answers
/// as an unknown one does (its I/O would fail the same way in
/// [`Namespace::run`]).
pub(super) fn io_namespace<'a>(
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
pub(super) fn transfer_range(sqe: &Sqe, ns: &Namespace) -> Result<(u64, u64), Status> {
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
pub(super) fn dsm_len(sqe: &Sqe) -> usize {
    ((sqe.cdw(10) & 0xff) as usize + 1) * 16
}

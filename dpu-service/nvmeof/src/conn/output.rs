//! What a connection sends: completions and C2HData PDUs, the buffers
//! they are encoded into, and how the transport takes them.

use std::io::IoSlice;
use std::sync::atomic::Ordering;

use crate::identify::ErrorEntry;
use crate::pdu;
use crate::spec::{Cqe, Sqe};

use super::{Connection, Phase, MAX_TRANSFER};

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

impl Connection {
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
    ///
    /// [`PDU_TIMEOUT`]: super::PDU_TIMEOUT
    pub fn held_back(&self) -> bool {
        self.output_len() >= OUTPUT_BUDGET
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

    /// Completes a command: logs failures, sends data and the response.
    pub(super) fn finish(&mut self, sqe: &Sqe, cqe: Cqe, data: Option<Vec<u8>>) {
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
    pub(super) fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS && buf.capacity() <= MAX_TRANSFER as usize {
            self.spare.push(buf);
        }
    }

    /// Sends `data` (if any) in a C2HData PDU, then the response unless
    /// the data PDU carries SUCCESS. Large data is sent from its own buffer,
    /// small data copied; either way the buffer is reused afterwards.
    pub(super) fn respond(&mut self, mut cqe: Cqe, data: Option<Vec<u8>>) {
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
}

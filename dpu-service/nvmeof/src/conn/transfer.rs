//! Write data the host sends only when asked: the checks before asking,
//! the R2Ts within the memory budgets, and the H2CData PDUs that answer
//! them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::auth::controller::MAX_RECEIVE as MAX_AUTH_DATA;
use crate::host::CONNECT_DATA_LEN;
use crate::pdu::{self, Fes};
use crate::spec::{fctype, nvm, Cqe, Sqe, Status, FABRICS};
use crate::target::Namespace;

use super::block::sized;
use super::io::{dsm_len, io_namespace, transfer_range};
use super::{admin, Connection, Pending, Phase, MAX_H2C_DATA};

impl Connection {
    /// Bytes of write data this connection has asked for through R2T (or
    /// is about to) and not yet written: at most [`R2T_BUDGET`], also
    /// counted in [`Target::write_buffers_reserved`].
    ///
    /// [`R2T_BUDGET`]: super::R2T_BUDGET
    /// [`Target::write_buffers_reserved`]: crate::target::Target::write_buffers_reserved
    pub fn write_buffers_reserved(&self) -> u64 {
        self.budget.reserved()
    }

    /// Whether to ask for the data of a command that carries
    /// host-to-controller data through R2T: `Ok(true)` when the command
    /// reads it and passes the checks it will pass once its data is in,
    /// `Ok(false)` when it reads no data (its answer does not depend on
    /// any), `Err` with the status it gets otherwise.
    pub(super) fn reads_data(
        &self,
        sqe: &Sqe,
        ns: Option<&Arc<Namespace>>,
    ) -> Result<bool, Status> {
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
    pub(super) fn ask_for_data(&mut self, sqe: Sqe, ns: Option<Arc<Namespace>>) {
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
    pub(super) fn grant_waiting(&mut self) {
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
    pub(super) fn on_h2c_data(
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
}

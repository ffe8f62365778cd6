//! DH-HMAC-CHAP on a queue: Authentication Send and Receive handed to the
//! queue's authenticator, and the DH work they wait for, run here or by the
//! transport.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::auth::controller::{ReceiveError, Refusal, Step, DEFAULT_TIMEOUT as AUTH_TIMEOUT};
use crate::auth::limit::Admit;
use crate::auth::pool::{DhJob, DhResult};
use crate::auth::{AuthOutcome, Authenticator};
use crate::spec::{fctype, Sqe, Status, FABRICS};

use super::command::Outcome;
use super::{Connection, Pending, Phase};

impl Connection {
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

    /// Whether `sqe` must wait for authentication: the queue requires it,
    /// has not completed it, and `sqe` is not an authentication command
    /// or a Disconnect.
    pub(super) fn needs_auth(&self, sqe: &Sqe) -> bool {
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
    pub(super) fn authenticator(&mut self, now: Instant) -> Option<&mut Authenticator> {
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
    pub(super) fn auth_send(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> Outcome {
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
    pub(super) fn auth_receive(&mut self, sqe: &Sqe, now: Instant) -> Outcome {
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
    pub(super) fn auth_outcome(&mut self) {
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
}

//! Fabrics commands: Connect, which makes a controller or joins one,
//! Property Get and Set, Disconnect, and Authentication Send and Receive
//! passed on to `auth`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::host::CONNECT_DATA_LEN;
use crate::qos::QosScope;
use crate::spec::{self, fctype, Cqe, Sqe, Status};
use crate::target::controller::{Controller, ControllerKind, MAX_QUEUE_SIZE};
use crate::target::TlsStats;

use super::command::Outcome;
use super::Connection;

impl Connection {
    pub(super) fn fabrics(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> Outcome {
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
        // The secure channel: a queue over TLS connects only as the host
        // and to the subsystem its identity named; a host the subsystem
        // requires TLS of connects only over it.
        match self.tls.as_deref() {
            Some(id) if id.hostnqn != hostnqn || id.subnqn != subnqn => {
                tracing::warn!(%subnqn, %hostnqn, identity = %id, peer = %self.peer, "Connect names another host or subsystem than its TLS identity");
                TlsStats::count(&self.target.stats().tls.connects_identity_mismatch);
                let at = if id.hostnqn != hostnqn { 512 } else { 256 };
                return refused(invalid(sqe, true, at));
            }
            None if subnqn != spec::DISCOVERY_NQN
                && self.target.tls_required(&subnqn, &hostnqn) =>
            {
                tracing::warn!(%subnqn, %hostnqn, peer = %self.peer, "the subsystem requires TLS of this host, which connected in clear text");
                TlsStats::count(&self.target.stats().tls.connects_without_tls);
                let mut c = Cqe::new(sqe.cid(), Status::CONNECT_INVALID_HOST);
                c.dw0 = 1 | (512 << 16);
                return refused(Outcome::Done(c, None));
            }
            _ => {}
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
            // The host's QoS limiter, shared by all its controllers on the
            // subsystem (a discovery controller does no I/O).
            let qos = (kind == ControllerKind::Io).then(|| {
                self.target
                    .limiter(&subnqn, QosScope::Host(hostnqn.clone()))
            });
            let made = self.target.add_controller(|id| {
                let c = Controller::new(
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
                );
                match qos {
                    Some(q) => c.with_qos(q),
                    None => c,
                }
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

//! Admin-queue commands and controller properties: Property Get/Set (the
//! enable and shutdown sequences), Identify, Get Log Page (including the
//! discovery log), Get/Set Features, Keep Alive, Asynchronous Event Request
//! and Abort. They run on the [`AdminQueue`] a connection lends them and
//! know nothing of connections: [`crate::conn`] uses this module, never the
//! other way round.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::identify::{self, feature, ControllerInfo, NamespaceInfo};
use crate::spec::{admin, prop, Sqe, Status, CQE_LEN, SQE_LEN};
use crate::target::controller::{
    cc, csts, Controller, ControllerKind, AER_SLOTS, ERROR_LOG_SLOTS, MAX_IO_QUEUES, MAX_QUEUE_SIZE,
};
use crate::target::Target;

use super::command::{Outcome, IN_CAPSULE_DATA, IO_CMDS, IO_CTRL_ADMIN, IO_WRITES, MDTS, VERSION};

/// PCI vendor ID reported (none: a software controller).
const VENDOR_ID: u16 = 0;
/// Firmware revision reported.
pub(crate) const FIRMWARE: &str = concat!(
    "dpu",
    env!("CARGO_PKG_VERSION_MAJOR"),
    ".",
    env!("CARGO_PKG_VERSION_MINOR")
);
/// Keep-alive granularity reported (KAS), in 100 ms units.
const KAS: u16 = 1;
/// CAP.TO: worst-case time to become ready, 500 ms units.
const CAP_TIMEOUT: u64 = 30;

/// What an admin command sees of the admin queue it arrived on: the
/// connection lends it these, so the admin command set knows nothing of
/// connections.
#[derive(Debug)]
pub(crate) struct AdminQueue<'a> {
    /// The queue's controller.
    pub(crate) ctrl: &'a Controller,
    /// The target serving it.
    pub(crate) target: &'a Target,
    /// The address the connection was accepted on (the discovery log's
    /// address for a listener on the unspecified address).
    pub(crate) local: SocketAddr,
    /// Command identifiers of the parked Asynchronous Event Requests.
    pub(crate) aers: &'a mut Vec<u16>,
}

impl AdminQueue<'_> {
    pub(crate) fn property_get(&mut self, sqe: &Sqe) -> Outcome {
        let ctrl = self.ctrl;
        let eight = sqe.cdw(10) & 7 == 1;
        let value: u64 = match (sqe.cdw(11), eight) {
            (prop::CAP, true) => {
                u64::from(MAX_QUEUE_SIZE - 1) // MQES
                    | 1 << 16 // CQR: contiguous queues required
                    | CAP_TIMEOUT << 24
                    | 1 << 37 // CSS: NVM command set
            }
            (prop::VS, false) => u64::from(VERSION),
            (prop::CC, false) => u64::from(ctrl.with(|s| s.cc)),
            (prop::CSTS, false) => u64::from(ctrl.with(|s| s.csts)),
            _ => return Outcome::status(sqe, Status::INVALID_FIELD),
        };
        let mut c = crate::spec::Cqe::new(sqe.cid(), Status::SUCCESS);
        c.dw0 = value as u32;
        c.dw1 = (value >> 32) as u32;
        Outcome::Done(c, None)
    }

    pub(crate) fn property_set(&mut self, sqe: &Sqe) -> Outcome {
        let ctrl = self.ctrl;
        if sqe.cdw(11) != prop::CC || sqe.cdw(10) & 7 != 0 {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        let v = sqe.cdw(12);
        let io = ctrl.kind == ControllerKind::Io;
        ctrl.with(|s| {
            let old = s.cc;
            s.cc = v;
            if v & cc::EN != 0 && old & cc::EN == 0 {
                let sqes = (v >> cc::IOSQES_SHIFT) & 0xf;
                let cqes = (v >> cc::IOCQES_SHIFT) & 0xf;
                if io && (1usize << sqes != SQE_LEN || 1usize << cqes != CQE_LEN) {
                    s.csts |= csts::CFS;
                } else {
                    s.csts |= csts::RDY;
                }
            } else if v & cc::EN == 0 && old & cc::EN != 0 {
                s.csts &= !(csts::RDY | csts::CFS | csts::SHST_COMPLETE);
            }
            if v & cc::SHN_MASK != 0 {
                s.csts |= csts::SHST_COMPLETE;
            }
        });
        if v & (cc::SHN_MASK | cc::EN) != cc::EN {
            // A controller shut down or disabled reports no more events:
            // its waiting AERs are dropped without completions (hosts
            // consider them aborted and may reuse their CIDs).
            self.aers.clear();
        }
        Outcome::ok(sqe)
    }

    /// Runs an admin command; a Keep Alive (or a Set Features of the
    /// keep-alive timeout) restarts the keep-alive timer at `now`.
    pub(crate) fn admin(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> Outcome {
        let ctrl = self.ctrl;
        if !ctrl.ready() {
            return Outcome::status(sqe, Status::COMMAND_SEQUENCE);
        }
        let discovery = ctrl.kind == ControllerKind::Discovery;
        match sqe.opcode() {
            admin::KEEP_ALIVE => {
                ctrl.keep_alive(now);
                Outcome::ok(sqe)
            }
            admin::IDENTIFY => self.identify(sqe),
            admin::GET_LOG_PAGE => self.get_log_page(sqe),
            admin::GET_FEATURES => self.get_features(sqe),
            admin::SET_FEATURES => self.set_features(sqe, data, now),
            admin::ASYNC_EVENT => {
                if self.aers.len() >= AER_SLOTS {
                    return Outcome::status(sqe, Status::AER_LIMIT);
                }
                self.aers.push(sqe.cid());
                Outcome::Parked
            }
            // Commands complete in order as soon as they arrive: nothing is
            // ever left to abort (dword 0 bit 0: not aborted).
            admin::ABORT if !discovery => Outcome::dw0(sqe, 1),
            _ => Outcome::status(sqe, Status::INVALID_OPCODE),
        }
    }

    fn identify(&mut self, sqe: &Sqe) -> Outcome {
        let ctrl = self.ctrl;
        let cns = (sqe.cdw(10) & 0xff) as u8;
        if ctrl.kind == ControllerKind::Discovery {
            if cns != 0x01 {
                return Outcome::status(sqe, Status::INVALID_FIELD);
            }
            let info = ControllerInfo {
                kind: identify::ControllerKind::Discovery,
                vid: VENDOR_ID,
                ssvid: VENDOR_ID,
                serial: "discovery",
                model: "dpu-service discovery",
                firmware: FIRMWARE,
                ieee_oui: [0; 3],
                cntlid: ctrl.cntlid,
                version: VERSION,
                subnqn: crate::spec::DISCOVERY_NQN,
                mdts: MDTS,
                max_namespaces: 0,
                kas: KAS,
                aerl: (AER_SLOTS - 1) as u8,
                maxcmd: ctrl.admin_queue_size,
                ioccsz: 0,
                iorcsz: 0,
                volatile_write_cache: false,
                namespace_mgmt_events: false,
            };
            return Outcome::data(sqe, identify::identify_controller(&info));
        }
        let Some(sub) = self.target.subsystem(&ctrl.subnqn) else {
            return Outcome::status(sqe, Status::INTERNAL);
        };
        let nsid = sqe.nsid();
        match cns {
            0x00 => {
                if nsid == 0 || nsid == u32::MAX {
                    return Outcome::status(sqe, Status::INVALID_NS);
                }
                match sub.namespaces.get(&nsid) {
                    Some(ns) => Outcome::data(
                        sqe,
                        identify::identify_namespace(&NamespaceInfo {
                            blocks: ns.blocks(),
                            lba_shift: ns.lba_shift,
                            nguid: ns.nguid,
                            eui64: ns.eui64,
                            shared: true,
                            deallocate_reads_zero: true,
                            volatile_write_cache: ns.backend.volatile_write_cache(),
                            optimal_io_blocks: None,
                        }),
                    ),
                    None if nsid <= sub.max_namespaces => Outcome::data(sqe, vec![0; 4096]),
                    None => Outcome::status(sqe, Status::INVALID_NS),
                }
            }
            0x01 => {
                let vwc = sub
                    .namespaces
                    .values()
                    .any(|n| n.backend.volatile_write_cache());
                let info = ControllerInfo {
                    kind: identify::ControllerKind::Io,
                    vid: VENDOR_ID,
                    ssvid: VENDOR_ID,
                    serial: &sub.serial,
                    model: &sub.model,
                    firmware: FIRMWARE,
                    ieee_oui: [0; 3],
                    cntlid: ctrl.cntlid,
                    version: VERSION,
                    subnqn: &sub.nqn,
                    mdts: MDTS,
                    max_namespaces: sub.max_namespaces,
                    kas: KAS,
                    aerl: (AER_SLOTS - 1) as u8,
                    maxcmd: MAX_QUEUE_SIZE,
                    ioccsz: (SQE_LEN as u32 + IN_CAPSULE_DATA) / 16,
                    iorcsz: CQE_LEN as u32 / 16,
                    volatile_write_cache: vwc,
                    namespace_mgmt_events: true,
                };
                Outcome::data(sqe, identify::identify_controller(&info))
            }
            0x02 => {
                if nsid >= 0xffff_fffe {
                    return Outcome::status(sqe, Status::INVALID_NS);
                }
                Outcome::data(
                    sqe,
                    identify::active_namespace_list(sub.namespaces.keys().copied(), nsid),
                )
            }
            0x03 => match sub.namespaces.get(&nsid) {
                Some(ns) => Outcome::data(
                    sqe,
                    identify::namespace_descriptors(ns.eui64, ns.nguid, ns.uuid),
                ),
                None => Outcome::status(sqe, Status::INVALID_NS),
            },
            _ => Outcome::status(sqe, Status::INVALID_FIELD),
        }
    }

    fn get_log_page(&mut self, sqe: &Sqe) -> Outcome {
        let ctrl = self.ctrl;
        let cdw10 = sqe.cdw(10);
        let lid = (cdw10 & 0xff) as u8;
        let retain = cdw10 & (1 << 15) != 0;
        let numd = u64::from(cdw10 >> 16) | (u64::from(sqe.cdw(11) & 0xffff) << 16);
        let len = ((numd + 1) * 4) as usize;
        let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
        if offset % 4 != 0 || len > sqe.sgl_len() as usize {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        let discovery = ctrl.kind == ControllerKind::Discovery;
        let page = match lid {
            identify::LID_DISCOVERY if discovery => {
                if !retain {
                    ctrl.with(|s| s.disc_notice_masked = false);
                }
                self.target.discovery_log(&ctrl.hostnqn, self.local)
            }
            identify::LID_ERROR => {
                let entries: Vec<_> = ctrl.with(|s| s.errors.iter().cloned().collect());
                identify::error_log(&entries, ERROR_LOG_SLOTS)
            }
            identify::LID_SMART if !discovery => {
                let h = &ctrl.health;
                let units = |b: u64| u128::from(b.div_ceil(512 * 1000));
                identify::smart_log(&identify::SmartInfo {
                    critical_warning: 0,
                    temperature_kelvin: 313,
                    available_spare: 100,
                    spare_threshold: 10,
                    percentage_used: 0,
                    data_units_read: units(h.bytes_read.load(Ordering::Relaxed)),
                    data_units_written: units(h.bytes_written.load(Ordering::Relaxed)),
                    host_read_commands: u128::from(h.reads.load(Ordering::Relaxed)),
                    host_write_commands: u128::from(h.writes.load(Ordering::Relaxed)),
                    busy_time_minutes: 0,
                    power_cycles: 1,
                    power_on_hours: 0,
                    unsafe_shutdowns: 0,
                    media_errors: u128::from(h.media_errors.load(Ordering::Relaxed)),
                    error_log_entries: u128::from(ctrl.with(|s| s.error_count)),
                })
            }
            identify::LID_FW_SLOT if !discovery => identify::firmware_slot_log(FIRMWARE),
            identify::LID_CHANGED_NS if !discovery => {
                let list = ctrl.with(|s| {
                    let l = s.changed_ns.clone();
                    if !retain {
                        s.changed_ns.clear();
                        s.ns_notice_masked = false;
                    }
                    l
                });
                identify::changed_namespace_list(&list)
            }
            identify::LID_CMD_EFFECTS if !discovery => {
                identify::command_effects_log(IO_CTRL_ADMIN, IO_CMDS, IO_WRITES)
            }
            _ => return Outcome::status(sqe, Status::INVALID_LOG_PAGE),
        };
        if offset > page.len() as u64 {
            return Outcome::status(sqe, Status::INVALID_FIELD);
        }
        let mut out = vec![0u8; len];
        let from = &page[offset as usize..];
        let n = from.len().min(len);
        out[..n].copy_from_slice(&from[..n]);
        Outcome::data(sqe, out)
    }

    fn get_features(&mut self, sqe: &Sqe) -> Outcome {
        let ctrl = self.ctrl;
        let fid = (sqe.cdw(10) & 0xff) as u8;
        let sel = (sqe.cdw(10) >> 8) & 7;
        let current = sel == 0;
        let defaults = crate::target::controller::Features::default();
        let (cur, kato, queues) = ctrl.with(|s| (s.features.clone(), s.kato, s.io_queues));
        let f = if current { &cur } else { &defaults };
        if sel == 3 {
            // Supported capabilities: every feature here is changeable, none saveable.
            return Outcome::dw0(sqe, 1 << 2);
        }
        let discovery = ctrl.kind == ControllerKind::Discovery;
        let v = match fid {
            feature::KEEP_ALIVE => kato.as_millis() as u32,
            feature::ASYNC_EVENT => f.async_event,
            _ if discovery => return Outcome::status(sqe, Status::INVALID_FIELD),
            feature::ARBITRATION => f.arbitration,
            feature::POWER_MGMT => f.power_mgmt,
            feature::TEMP_THRESHOLD => f.temp_threshold,
            feature::ERROR_RECOVERY => f.error_recovery,
            feature::VOLATILE_WC => f.volatile_wc,
            feature::NUM_QUEUES => {
                let q = u32::from(if current { queues } else { MAX_IO_QUEUES } - 1);
                q | q << 16
            }
            feature::IRQ_COALESCE => f.irq_coalesce,
            feature::WRITE_ATOMIC => f.write_atomic,
            _ => return Outcome::status(sqe, Status::INVALID_FIELD),
        };
        Outcome::dw0(sqe, v)
    }

    fn set_features(&mut self, sqe: &Sqe, _data: &[u8], now: Instant) -> Outcome {
        let ctrl = self.ctrl;
        let fid = (sqe.cdw(10) & 0xff) as u8;
        if sqe.cdw(10) & (1 << 31) != 0 {
            return Outcome::status(sqe, Status::FEATURE_NOT_SAVEABLE);
        }
        let v = sqe.cdw(11);
        let discovery = ctrl.kind == ControllerKind::Discovery;
        let r = ctrl.with(|s| {
            let f = &mut s.features;
            match fid {
                feature::KEEP_ALIVE => {
                    s.kato = Duration::from_millis(u64::from(v));
                    s.last_keep_alive = now;
                }
                feature::ASYNC_EVENT => f.async_event = v,
                _ if discovery => return Err(Status::INVALID_FIELD),
                feature::ARBITRATION => f.arbitration = v,
                feature::POWER_MGMT if v & 0x1f == 0 => f.power_mgmt = v,
                feature::POWER_MGMT => return Err(Status::INVALID_FIELD),
                feature::TEMP_THRESHOLD => f.temp_threshold = v,
                feature::ERROR_RECOVERY => f.error_recovery = v,
                feature::VOLATILE_WC => f.volatile_wc = v & 1,
                feature::NUM_QUEUES => {
                    let (nsq, ncq) = (v & 0xffff, v >> 16);
                    if nsq == 0xffff || ncq == 0xffff {
                        return Err(Status::INVALID_FIELD);
                    }
                    if !s.connected.is_empty() {
                        return Err(Status::COMMAND_SEQUENCE);
                    }
                    let want = nsq.max(ncq) + 1;
                    s.io_queues = want.min(u32::from(MAX_IO_QUEUES)) as u16;
                    let q = u32::from(s.io_queues - 1);
                    return Ok(q | q << 16);
                }
                feature::IRQ_COALESCE => f.irq_coalesce = v,
                feature::WRITE_ATOMIC => f.write_atomic = v,
                _ => return Err(Status::INVALID_FIELD),
            }
            Ok(0)
        });
        match r {
            Ok(dw0) => Outcome::dw0(sqe, dw0),
            Err(st) => Outcome::status(sqe, st),
        }
    }
}

/// Whether the admin command `opcode` reads data from the host: none this
/// target serves does (Set Features takes the value of every feature it
/// supports in CDW11; the discovery controller takes no data at all). A
/// connection never asks for the data of a command that reads none, and
/// answers it as it stands; a command that comes to read `data` in
/// [`AdminQueue::admin`] must be named here.
pub(crate) fn reads_data(_opcode: u8) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A ready discovery controller whose keep-alive timer started at `t0`.
    fn controller(kato: Duration, t0: Instant) -> Controller {
        let c = Controller::new(
            1,
            ControllerKind::Discovery,
            crate::spec::DISCOVERY_NQN.into(),
            "nqn.2024-01.io.example:host".into(),
            [0; 16],
            "127.0.0.1:4420".parse().unwrap(),
            kato,
            32,
            Arc::default(),
            t0,
        );
        c.with(|s| s.csts |= csts::RDY);
        c
    }

    fn sqe(opcode: u8, cdw10: u32, cdw11: u32) -> Sqe {
        let mut b = [0u8; SQE_LEN];
        b[0] = opcode;
        b[40..44].copy_from_slice(&cdw10.to_le_bytes());
        b[44..48].copy_from_slice(&cdw11.to_le_bytes());
        Sqe(b)
    }

    /// Runs `sqe` on `ctrl`'s admin queue at `now`; answers the status.
    fn run(ctrl: &Controller, sqe: &Sqe, now: Instant) -> u16 {
        let target = Target::new();
        let mut aers = Vec::new();
        let mut q = AdminQueue {
            ctrl,
            target: &target,
            local: ([127, 0, 0, 1], 4420).into(),
            aers: &mut aers,
        };
        match q.admin(sqe, &[], now) {
            Outcome::Done(c, _) => c.status,
            other => panic!("expected a completion, got {other:?}"),
        }
    }

    /// Identify of namespace `nsid` (CNS `cns`) on an I/O controller of a
    /// subsystem whose namespace 1 has `eui64`; answers the data.
    fn identify_ns(eui64: Option<[u8; 8]>, cns: u32, nsid: u32) -> Vec<u8> {
        const NQN: &str = "nqn.2024-01.io.example:eui";
        let target = Target::new();
        let mut cfg = crate::target::ram_subsystem(NQN, 1 << 20, Vec::new());
        cfg.namespaces[0].eui64 = eui64;
        let errors = target.apply(&crate::target::TargetConfig {
            subsystems: vec![cfg],
            discovery: None,
        });
        assert!(errors.is_empty(), "{errors:?}");
        let t0 = Instant::now();
        let ctrl = Controller::new(
            1,
            ControllerKind::Io,
            NQN.into(),
            "nqn.2024-01.io.example:host".into(),
            [0; 16],
            "127.0.0.1:4420".parse().unwrap(),
            Duration::ZERO,
            32,
            Arc::default(),
            t0,
        );
        ctrl.with(|s| s.csts |= csts::RDY);
        let mut cmd = sqe(admin::IDENTIFY, cns, 0);
        cmd.0[4..8].copy_from_slice(&nsid.to_le_bytes());
        let mut aers = Vec::new();
        let mut q = AdminQueue {
            ctrl: &ctrl,
            target: &target,
            local: ([127, 0, 0, 1], 4420).into(),
            aers: &mut aers,
        };
        match q.admin(&cmd, &[], t0) {
            Outcome::Done(c, Some(data)) if c.status == 0 => data,
            other => panic!("expected data, got {other:?}"),
        }
    }

    /// A namespace's configured EUI-64 is what Identify Namespace (EUI64,
    /// bytes 120..128) and the Namespace Identification Descriptor list
    /// report; without one, EUI64 is zero and the list has no such
    /// descriptor.
    #[test]
    fn identify_reports_a_configured_eui64() {
        const EUI: [u8; 8] = [0x1b, 0x4e, 0x28, 0xba, 0x2f, 0xa1, 0x11, 0xd2];
        let ns = identify_ns(Some(EUI), 0x00, 1);
        assert_eq!(ns[120..128], EUI);
        assert_eq!(ns[104..120], [2; 16], "the NGUID is still there");
        let list = identify_ns(Some(EUI), 0x03, 1);
        // EUI-64 (NIDT 1, NIDL 8) first, then the NGUID and the UUID.
        assert_eq!(list[..4], [identify::NIDT_EUI64, 8, 0, 0]);
        assert_eq!(list[4..12], EUI);
        assert_eq!(list[12..16], [identify::NIDT_NGUID, 16, 0, 0]);

        let ns = identify_ns(None, 0x00, 1);
        assert_eq!(ns[120..128], [0; 8]);
        let list = identify_ns(None, 0x03, 1);
        assert_eq!(list[..4], [identify::NIDT_NGUID, 16, 0, 0]);
    }

    /// Keep Alive restarts the timer at the time the command is handled at,
    /// as given, whatever the clock says.
    #[test]
    fn keep_alive_restarts_the_timer_at_the_time_given() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let ctrl = controller(Duration::from_millis(500), t0);
        assert!(ctrl.keep_alive_expired(at(501)));
        assert_eq!(run(&ctrl, &sqe(admin::KEEP_ALIVE, 0, 0), at(400)), 0);
        assert!(!ctrl.keep_alive_expired(at(900)));
        assert!(ctrl.keep_alive_expired(at(901)));
    }

    /// Set Features of the keep-alive timeout starts the timer afresh at
    /// the time given.
    #[test]
    fn setting_the_keep_alive_timeout_restarts_the_timer() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let ctrl = controller(Duration::ZERO, t0);
        assert!(!ctrl.keep_alive_expired(at(10_000)), "zero disables it");
        let set = sqe(admin::SET_FEATURES, u32::from(feature::KEEP_ALIVE), 1_000);
        assert_eq!(run(&ctrl, &set, at(5_000)), 0);
        assert!(!ctrl.keep_alive_expired(at(6_000)));
        assert!(ctrl.keep_alive_expired(at(6_001)));
    }
}

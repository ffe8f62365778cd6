//! A controller: what the admin queue and the I/O queues of one host
//! association share. Created by an admin-queue Connect, ended when its admin
//! queue goes away, its keep-alive timer expires, or its subsystem is removed.
//! The target keeps the live ones by controller ID.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::identify::{self, ErrorEntry};
use crate::qos::Limiter;

use super::Target;

/// What a controller serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// An I/O controller of an NVM subsystem.
    Io,
    /// The discovery controller.
    Discovery,
}

/// Most I/O queues a controller grants.
pub const MAX_IO_QUEUES: u16 = 64;
/// Largest queue size (0-based SQSIZE is one less), CAP.MQES + 1.
pub const MAX_QUEUE_SIZE: u16 = 1024;
/// Outstanding Asynchronous Event Requests accepted (AERL + 1).
pub const AER_SLOTS: usize = 4;
/// Error log entries kept (ELPE + 1).
pub const ERROR_LOG_SLOTS: usize = 64;

/// Controller Configuration register fields.
pub mod cc {
    /// Enable.
    pub const EN: u32 = 1;
    /// Shutdown Notification (bits 15:14).
    pub const SHN_MASK: u32 = 3 << 14;
    /// I/O Submission Queue Entry Size (bits 19:16).
    pub const IOSQES_SHIFT: u32 = 16;
    /// I/O Completion Queue Entry Size (bits 23:20).
    pub const IOCQES_SHIFT: u32 = 20;
}

/// Controller Status register fields.
pub mod csts {
    /// Ready.
    pub const RDY: u32 = 1;
    /// Controller Fatal Status.
    pub const CFS: u32 = 1 << 1;
    /// Shutdown processing complete (SHST = 10b).
    pub const SHST_COMPLETE: u32 = 2 << 2;
}

/// The Asynchronous Event Configuration bit enabling namespace attribute
/// notices.
pub const AEC_NS_ATTR: u32 = 1 << 8;
/// The AEC bit enabling discovery log page change notices.
pub const AEC_DISCOVERY: u32 = 1 << 31;

/// Values of the features a host may set.
#[derive(Debug, Clone)]
pub struct Features {
    /// Arbitration (01h).
    pub arbitration: u32,
    /// Power Management (02h).
    pub power_mgmt: u32,
    /// Temperature Threshold (04h).
    pub temp_threshold: u32,
    /// Error Recovery (05h).
    pub error_recovery: u32,
    /// Volatile Write Cache enable (06h).
    pub volatile_wc: u32,
    /// Interrupt Coalescing (08h).
    pub irq_coalesce: u32,
    /// Write Atomicity Normal (0Ah).
    pub write_atomic: u32,
    /// Asynchronous Event Configuration (0Bh).
    pub async_event: u32,
}

impl Default for Features {
    fn default() -> Self {
        Self {
            arbitration: 0,
            power_mgmt: 0,
            // 70 °C over-temperature threshold, in kelvin.
            temp_threshold: 343,
            error_recovery: 0,
            volatile_wc: 1,
            irq_coalesce: 0,
            write_atomic: 0,
            async_event: 0,
        }
    }
}

/// Mutable controller state, behind the controller's lock.
#[derive(Debug)]
pub struct State {
    /// CC register.
    pub cc: u32,
    /// CSTS register.
    pub csts: u32,
    /// Keep-alive timeout; zero disables it.
    pub kato: Duration,
    /// Last Keep Alive (or other admin command).
    pub last_keep_alive: Instant,
    /// I/O queues granted (Set Features, Number of Queues), 1-based count.
    pub io_queues: u16,
    /// I/O queue IDs connected.
    pub connected: Vec<u16>,
    /// Settable features.
    pub features: Features,
    /// Asynchronous events waiting for an AER command (completion dword 0).
    pub events: VecDeque<u32>,
    /// A namespace attribute notice was sent and the changed namespace
    /// log has not been read since (further notices wait).
    pub ns_notice_masked: bool,
    /// A discovery notice was sent and the log has not been read since.
    pub disc_notice_masked: bool,
    /// Namespaces changed since the changed namespace log was last read.
    pub changed_ns: Vec<u32>,
    /// Error log, newest first.
    pub errors: VecDeque<ErrorEntry>,
    /// Errors ever logged.
    pub error_count: u64,
}

/// Counters of one subsystem, kept across controllers and configuration
/// changes: the SMART / health log and the service's telemetry.
#[derive(Debug, Default)]
pub struct Health {
    /// Connections (queues) open now.
    pub connections: AtomicU64,
    /// Commands completed with an error status.
    pub errors: AtomicU64,
    /// Bytes read by hosts.
    pub bytes_read: AtomicU64,
    /// Bytes written by hosts.
    pub bytes_written: AtomicU64,
    /// Read commands.
    pub reads: AtomicU64,
    /// Write commands.
    pub writes: AtomicU64,
    /// Backend I/O errors.
    pub media_errors: AtomicU64,
    /// DH-HMAC-CHAP authentications that succeeded (one per queue).
    pub auth_succeeded: AtomicU64,
    /// DH-HMAC-CHAP authentications that failed, and connects refused for
    /// lack of a secret where authentication is required.
    pub auth_failed: AtomicU64,
    /// Authentication attempts refused before any DH work: their source
    /// address was over its rate
    /// ([`AuthLimiter`](crate::auth::limit::AuthLimiter)).
    pub auth_rate_limited: AtomicU64,
    /// Authentications refused because the DH pool's queue was full.
    pub auth_busy: AtomicU64,
}

/// A controller.
#[derive(Debug)]
pub struct Controller {
    /// Controller ID.
    pub cntlid: u16,
    /// What it serves.
    pub kind: ControllerKind,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier.
    pub hostid: [u8; 16],
    /// The listener (local address) its admin queue connected to: its I/O
    /// queues must come there too, and it ends when the subsystem stops
    /// listening there.
    pub listener: SocketAddr,
    /// Admin queue size (0-based SQSIZE + 1).
    pub admin_queue_size: u16,
    /// The subsystem's counters.
    pub health: Arc<Health>,
    dead: AtomicBool,
    state: Mutex<State>,
    /// When the controller was made: the origin of `active_s`.
    created: Instant,
    /// Seconds from `created` to the last command on any of its queues.
    active_s: AtomicU64,
    /// The QoS limiter of its host on its subsystem (one without limits
    /// unless [`Controller::with_qos`] gave one).
    pub qos: Arc<Limiter>,
}

impl Controller {
    /// A new, disabled controller, its keep-alive timer started at `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cntlid: u16,
        kind: ControllerKind,
        subnqn: String,
        hostnqn: String,
        hostid: [u8; 16],
        listener: SocketAddr,
        kato: Duration,
        admin_queue_size: u16,
        health: Arc<Health>,
        now: Instant,
    ) -> Self {
        Self {
            cntlid,
            kind,
            subnqn,
            hostnqn,
            hostid,
            listener,
            admin_queue_size,
            health,
            dead: AtomicBool::new(false),
            created: now,
            active_s: AtomicU64::new(0),
            qos: Arc::default(),
            state: Mutex::new(State {
                cc: 0,
                csts: 0,
                kato,
                last_keep_alive: now,
                io_queues: MAX_IO_QUEUES,
                connected: Vec::new(),
                features: Features::default(),
                events: VecDeque::new(),
                ns_notice_masked: false,
                disc_notice_masked: false,
                changed_ns: Vec::new(),
                errors: VecDeque::new(),
                error_count: 0,
            }),
        }
    }

    /// The controller, its host's I/O held by `qos`.
    pub fn with_qos(mut self, qos: Arc<Limiter>) -> Self {
        self.qos = qos;
        self
    }

    /// Runs `f` on the locked state.
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("controller lock"))
    }

    /// True once the controller has ended; its connections close.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Ends the controller.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// True when CSTS.RDY is set.
    pub fn ready(&self) -> bool {
        self.with(|s| s.csts & csts::RDY != 0)
    }

    /// Records the namespaces `nsids` as changed and queues a namespace
    /// attribute notice if the host enabled them and none is pending.
    pub fn namespaces_changed(&self, nsids: &[u32]) {
        self.with(|s| {
            for n in nsids {
                if !s.changed_ns.contains(n) {
                    s.changed_ns.push(*n);
                }
            }
            if s.features.async_event & AEC_NS_ATTR != 0 && !s.ns_notice_masked {
                s.ns_notice_masked = true;
                s.events.push_back(identify::AEN_NS_ATTR_CHANGED);
            }
        });
    }

    /// Queues a discovery log change notice if the host enabled them.
    pub fn discovery_changed(&self) {
        self.with(|s| {
            if s.features.async_event & AEC_DISCOVERY != 0 && !s.disc_notice_masked {
                s.disc_notice_masked = true;
                s.events
                    .push_back(identify::async_event_dw0(2, 0xf0, identify::LID_DISCOVERY));
            }
        });
    }

    /// Adds an entry to the error log.
    pub fn log_error(&self, mut e: ErrorEntry) {
        self.with(|s| {
            s.error_count += 1;
            e.error_count = s.error_count;
            s.errors.push_front(e);
            s.errors.truncate(ERROR_LOG_SLOTS);
        });
    }

    /// True when the keep-alive timer has expired at `now`.
    pub fn keep_alive_expired(&self, now: Instant) -> bool {
        self.with(|s| !s.kato.is_zero() && now.duration_since(s.last_keep_alive) > s.kato)
    }

    /// Notes a command on one of the controller's queues at `now` (to the
    /// second: most calls only read).
    pub fn touch(&self, now: Instant) {
        let s = now.saturating_duration_since(self.created).as_secs();
        if self.active_s.load(Ordering::Relaxed) < s {
            self.active_s.store(s, Ordering::Relaxed);
        }
    }

    /// True when Keep Alive is disabled (KATO 0) and no queue of the
    /// controller has had a command for `idle` (counted in whole seconds).
    pub fn idle_expired(&self, now: Instant, idle: Duration) -> bool {
        if !self.with(|s| s.kato.is_zero()) {
            return false;
        }
        let last = self.created + Duration::from_secs(self.active_s.load(Ordering::Relaxed));
        now.saturating_duration_since(last) >= idle
    }

    /// Restarts the keep-alive timer.
    pub fn keep_alive(&self, now: Instant) {
        self.with(|s| s.last_keep_alive = now);
    }
}

/// The target's live controllers, by controller ID.
#[derive(Debug, Default)]
pub(super) struct Controllers {
    pub(super) by_id: HashMap<u16, Arc<Controller>>,
    next: u16,
}

/// Largest dynamic controller ID (0xFFF0.. are reserved).
const MAX_CNTLID: u16 = 0xffef;

impl Target {
    /// Registers a new controller with a fresh dynamic controller ID.
    pub(crate) fn add_controller(
        &self,
        make: impl FnOnce(u16) -> Controller,
    ) -> Option<Arc<Controller>> {
        let mut c = self.inner.controllers.lock().expect("controllers lock");
        for _ in 0..MAX_CNTLID {
            c.next = if c.next >= MAX_CNTLID { 1 } else { c.next + 1 };
            let id = c.next;
            if let std::collections::hash_map::Entry::Vacant(e) = c.by_id.entry(id) {
                return Some(e.insert(Arc::new(make(id))).clone());
            }
        }
        None
    }

    /// The live controller with `cntlid`.
    pub(crate) fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .get(&cntlid)
            .cloned()
    }

    /// Forgets a controller (its admin queue went away).
    pub(crate) fn remove_controller(&self, cntlid: u16) {
        let c = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .remove(&cntlid);
        if let Some(c) = c {
            c.kill();
        }
    }

    /// Number of live controllers.
    pub fn controller_count(&self) -> usize {
        self.inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .len()
    }

    /// Ends every controller (service shutdown): their connections close at
    /// their next tick.
    pub fn shutdown(&self) {
        let all: Vec<_> = self
            .inner
            .controllers
            .lock()
            .expect("controllers lock")
            .by_id
            .drain()
            .collect();
        for (_, c) in all {
            c.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keep-alive timer runs on the times it is given, from the one the
    /// controller was made at: nothing here reads a clock.
    #[test]
    fn keep_alive_timer_runs_on_the_times_given() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let c = Controller::new(
            1,
            ControllerKind::Io,
            "nqn.2024-01.io.example:sub".into(),
            "nqn.2024-01.io.example:host".into(),
            [0; 16],
            "127.0.0.1:4420".parse().unwrap(),
            Duration::from_millis(100),
            32,
            Arc::default(),
            at(1_000),
        );
        assert!(!c.keep_alive_expired(at(1_100)), "started when made");
        assert!(c.keep_alive_expired(at(1_101)));
        c.keep_alive(at(1_050));
        assert!(!c.keep_alive_expired(at(1_150)));
        assert!(c.keep_alive_expired(at(1_151)));
        c.with(|s| s.kato = Duration::ZERO);
        assert!(!c.keep_alive_expired(at(1_000_000)), "zero disables it");
    }
}

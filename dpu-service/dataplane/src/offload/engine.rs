//! The offload thread and the workers' lanes to it.
//!
//! A worker offers a rule, or withdraws a connection's, through its
//! [`Lane`]: one push onto a bounded queue (one for both, so that they
//! keep their order), never a wait. What the queue cannot take stays in software and
//! is counted. The thread takes offers lane by lane (so one busy worker
//! cannot starve the others), at most [`OffloadConfig::insert_rate`] a
//! second (offers past the rate are dropped and counted: a flood of short
//! flows costs at most that many insertions), each tenant within its
//! share of the table ([`crate::fair_share`]: a reserve no other tenant
//! can take, plus a shared pool up to a per-tenant cap).
//!
//! Control calls ([`Offloader::invalidate`], [`Offloader::set_tenants`])
//! go through a channel the thread reads before every round, so a flood
//! of offers does not delay them. An invalidation removes the flows it
//! covers and commits the removal before it answers, and it raises the
//! tenant's generation floor: an offer decided under an older
//! configuration, still queued, is dropped as stale instead of installed.
//!
//! Every [`OffloadConfig::poll`] the thread reads the counters of every
//! installed flow, adds what they carried to their tenant's totals, and
//! removes the flows the provider says aged. Every flow the thread
//! removes by itself (aged, invalidated), and every offer it does not
//! install, is reported back to the lane that offered it, with what it
//! carried since it was last read ([`Returned`]), so the worker knows
//! the flow is its own again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use hashbrown::HashMap;

use super::{lane_of, FlowAction, FlowCounts, FlowId, FlowRule, Provider, Refusal};
use crate::fair_share::{ShareLimits, Shares};
use crate::wire::FlowKey;

/// Offers the thread takes from all lanes in one round, at most.
const ROUND: usize = 256;

/// How long a control call waits for the thread's answer.
const CONTROL_WAIT: Duration = Duration::from_secs(10);

/// How the offloader runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadConfig {
    /// Flows it installs at most (and at most the provider's capacity).
    pub table: usize,
    /// Flows one tenant may hold at most.
    pub per_tenant: usize,
    /// Flows kept for each tenant whatever the others hold (less when the
    /// table cannot keep that many for every tenant).
    pub reserved: usize,
    /// Insertions a second, at most.
    pub insert_rate: u32,
    /// Offers one worker's lane holds before it refuses more.
    pub lane_queue: usize,
    /// How often counters are read and aged flows removed.
    pub poll: Duration,
}

impl Default for OffloadConfig {
    fn default() -> OffloadConfig {
        OffloadConfig {
            table: 65_536,
            per_tenant: 16_384,
            reserved: 1_024,
            insert_rate: 20_000,
            lane_queue: 1_024,
            poll: Duration::from_millis(500),
        }
    }
}

/// Why a control call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// The offload thread is not running.
    #[error("the offload thread has stopped")]
    Stopped,
    /// It did not answer in time.
    #[error("the offload thread did not answer within {0:?}")]
    Timeout(Duration),
    /// The provider could not remove flows; they may still be in
    /// hardware.
    #[error("{failed} offloaded flows could not be removed: {message}")]
    Remove {
        /// How many.
        failed: usize,
        /// The provider's last message.
        message: String,
    },
}

/// A lane's withdrawal queue is full: try again at a later turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the offload lane's withdrawal queue is full")]
pub struct Withdraw;

/// Why the offloader took a flow out of hardware by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnReason {
    /// It went longer than its age without a packet.
    Aged,
    /// A configuration change covered it.
    Invalidated,
    /// It was offered and not installed (refused, past its tenant's
    /// share or the rate, stale): it never reached hardware.
    Refused,
}

/// A flow taken out of hardware by the offloader, reported to the lane
/// that offered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Returned {
    /// The flow.
    pub id: FlowId,
    /// Its tenant.
    pub tenant: u32,
    /// The 5-tuple of its direction.
    pub key: FlowKey,
    /// What it carried since its counters were last read.
    pub counts: FlowCounts,
    /// Why.
    pub reason: ReturnReason,
}

/// One tenant's offloaded flows and what they carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantOffload {
    /// The tenant's stable switch ID.
    pub tenant: u32,
    /// Flows it holds in hardware now.
    pub flows: u64,
    /// Packets and bytes its offloaded flows carried, in all.
    pub carried: FlowCounts,
    /// Packets and bytes its drop rules dropped, in all.
    pub dropped: FlowCounts,
}

/// What one rule's flows in hardware matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleOffload {
    /// The rule's stable ID.
    pub rule: u32,
    /// Packets and bytes its flows carried or dropped, in all.
    pub matched: FlowCounts,
}

/// What the offloader has done, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OffloadStatus {
    /// The provider's name.
    pub provider: &'static str,
    /// Flows it may install (the table, within the provider's capacity).
    pub capacity: usize,
    /// Flows installed now.
    pub in_use: usize,
    /// Flows installed, in all.
    pub offloaded: u64,
    /// Flows withdrawn by their workers (connections that ended).
    pub withdrawn: u64,
    /// Flows that aged out.
    pub aged: u64,
    /// Flows removed by configuration changes.
    pub invalidated: u64,
    /// Offers the provider refused as unsupported.
    pub unsupported: u64,
    /// Offers the provider's table had no room for.
    pub table_full: u64,
    /// Offers whose insertion failed otherwise.
    pub insert_failed: u64,
    /// Offers past their tenant's share.
    pub over_quota: u64,
    /// Offers past the insertion rate.
    pub rate_limited: u64,
    /// Offers a full lane could not take.
    pub lane_full: u64,
    /// Offers decided under a configuration since changed.
    pub stale: u64,
    /// Removals the provider failed.
    pub remove_failed: u64,
    /// Commits that did not take effect in time.
    pub commit_failed: u64,
    /// The provider's last error message.
    pub last_error: Option<String>,
    /// Why the provider last refused an offer as unsupported.
    pub last_unsupported: Option<String>,
    /// Per rule whose stateless verdicts went to hardware, by ID (rules
    /// no longer configured are forgotten with [`Offloader::keep_rules`]).
    pub rules: Vec<RuleOffload>,
    /// Per tenant that has held a flow, by ID.
    pub tenants: Vec<TenantOffload>,
}

struct Offer {
    id: FlowId,
    generation: u64,
    rule: FlowRule,
}

/// A connection, as withdrawals name it: its tenant and its 5-tuple with
/// the lower address (and port) first.
type ConnRef = (u32, FlowKey);

/// The connection of a flow of `tenant` with 5-tuple `key`, whichever
/// direction.
fn conn_ref(tenant: u32, key: &FlowKey) -> ConnRef {
    if (key.src, key.src_port) <= (key.dst, key.dst_port) {
        (tenant, *key)
    } else {
        (tenant, key.reversed())
    }
}

/// What a worker asks of the thread, in its lane's order (a withdrawal
/// never overtakes the offer it follows).
enum Request {
    Offer(Offer),
    Withdraw(ConnRef),
    /// The flows of a tenant from or to a MAC address.
    WithdrawMac(u32, [u8; 6]),
    /// Every flow of the lane.
    WithdrawAll,
}

/// Requests a batch holds: a worker fills one in its own cache and hands
/// it over whole, so that offering costs it no cache line shared with
/// the thread.
const BATCH: usize = 64;

struct LaneCells {
    /// Batches handed over, in order.
    batches: ArrayQueue<Vec<Request>>,
    /// Empty batches for the worker to fill (allocated when the lane is
    /// made; the thread gives each back once taken).
    spare: ArrayQueue<Vec<Request>>,
    returned: ArrayQueue<Returned>,
    /// Offers the lane refused (written by its worker only).
    full: AtomicU64,
}

struct Shared {
    lanes: Box<[LaneCells]>,
    stop: AtomicBool,
    status: Mutex<OffloadStatus>,
}

enum Command {
    Invalidate {
        tenant: Option<u32>,
        generation: u64,
        reply: SyncSender<Result<usize, OffloadError>>,
    },
    Tenants {
        count: usize,
        reply: SyncSender<()>,
    },
    /// Forget the counts of rules not in this sorted list.
    KeepRules {
        rules: Vec<u32>,
        reply: SyncSender<()>,
    },
    Port {
        port: usize,
        reply: SyncSender<Result<usize, OffloadError>>,
    },
}

/// A worker's way to the offload thread.
pub struct Lane {
    index: usize,
    next: u64,
    shared: Arc<Shared>,
    /// The batch being filled (no capacity while no spare one was free).
    batch: Vec<Request>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("index", &self.index).finish()
    }
}

impl Lane {
    /// Offers `rule`, decided under configuration `generation`, for
    /// hardware. Returns its flow ID, or `None` if the lane is full (the
    /// flow stays in software). Never waits.
    pub fn offer(&mut self, rule: FlowRule, generation: u64) -> Option<FlowId> {
        if !self.room() {
            let cells = &self.shared.lanes[self.index];
            let n = cells.full.load(Ordering::Relaxed);
            cells.full.store(n + 1, Ordering::Relaxed);
            return None;
        }
        let id = (self.index as u64) << 48 | (self.next & ((1 << 48) - 1));
        self.next += 1;
        self.batch.push(Request::Offer(Offer {
            id,
            generation,
            rule,
        }));
        Some(id)
    }

    /// Whether the batch being filled has room, handing it over first if
    /// it is full.
    #[inline]
    fn room(&mut self) -> bool {
        if self.batch.len() < self.batch.capacity() {
            return true;
        }
        self.flush();
        self.batch.len() < self.batch.capacity()
    }

    /// Hands what was offered and withdrawn so far to the thread (a
    /// worker calls it once a turn). Never waits.
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            if self.batch.capacity() == 0 {
                if let Some(b) = self.shared.lanes[self.index].spare.pop() {
                    self.batch = b;
                }
            }
            return;
        }
        let cells = &self.shared.lanes[self.index];
        let next = cells.spare.pop().unwrap_or_default();
        let full = std::mem::replace(&mut self.batch, next);
        // Room for every batch there is: never refused.
        let _ = cells.batches.push(full);
    }

    /// Asks for the flows of `tenant`'s connection with 5-tuple `key`
    /// (either direction's), offered through this lane, to leave
    /// hardware. Never waits.
    ///
    /// # Errors
    /// [`Withdraw`] if the queue is full; ask again later.
    pub fn withdraw(&mut self, tenant: u32, key: &FlowKey) -> Result<(), Withdraw> {
        if !self.room() {
            return Err(Withdraw);
        }
        self.batch.push(Request::Withdraw(conn_ref(tenant, key)));
        Ok(())
    }

    /// Asks for the flows of `tenant` from or to `mac` (a station that
    /// moved), offered through this lane, to leave hardware.
    ///
    /// # Errors
    /// [`Withdraw`] if the queue is full; ask again later.
    pub fn withdraw_mac(&mut self, tenant: u32, mac: [u8; 6]) -> Result<(), Withdraw> {
        if !self.room() {
            return Err(Withdraw);
        }
        self.batch.push(Request::WithdrawMac(tenant, mac));
        Ok(())
    }

    /// Asks for every flow offered through this lane to leave hardware.
    ///
    /// # Errors
    /// [`Withdraw`] if the queue is full; ask again later.
    pub fn withdraw_all(&mut self) -> Result<(), Withdraw> {
        if !self.room() {
            return Err(Withdraw);
        }
        self.batch.push(Request::WithdrawAll);
        Ok(())
    }

    /// The next flow the offloader took out of hardware by itself.
    pub fn returned(&mut self) -> Option<Returned> {
        self.shared.lanes[self.index].returned.pop()
    }
}

/// The offload thread, and the control side of it.
pub struct Offloader {
    shared: Arc<Shared>,
    control: SyncSender<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Offloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offloader").finish_non_exhaustive()
    }
}

impl Offloader {
    /// Starts the offload thread on `provider`, with `lanes` lanes (one per
    /// worker, in worker order).
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start<P: Provider>(
        mut provider: P,
        config: OffloadConfig,
        lanes: usize,
    ) -> std::io::Result<(Offloader, Vec<Lane>)> {
        let capacity = config.table.min(provider.capacity());
        let shared = Arc::new(Shared {
            lanes: (0..lanes)
                .map(|_| {
                    let n = config.lane_queue.max(1).div_ceil(BATCH) + 1;
                    let spare = ArrayQueue::new(n);
                    for _ in 0..n {
                        let _ = spare.push(Vec::with_capacity(BATCH));
                    }
                    LaneCells {
                        batches: ArrayQueue::new(n),
                        spare,
                        returned: ArrayQueue::new(config.lane_queue.max(1)),
                        full: AtomicU64::new(0),
                    }
                })
                .collect(),
            stop: AtomicBool::new(false),
            status: Mutex::new(OffloadStatus {
                provider: provider.name(),
                capacity,
                ..OffloadStatus::default()
            }),
        });
        let (tx, rx) = mpsc::sync_channel(16);
        let mut state = Thread {
            shares: Shares::new(ShareLimits {
                max: capacity,
                per_tenant: config.per_tenant,
                reserved: config.reserved,
            }),
            config,
            capacity,
            // Sized for a full table: inserting never grows them.
            flows: HashMap::with_capacity(capacity),
            conns: HashMap::with_capacity(capacity),
            by_mac: HashMap::new(),
            floors: HashMap::new(),
            tokens: f64::from(config.insert_rate.min(ROUND as u32)),
            refilled: Instant::now(),
            polled: Instant::now(),
            backlog: (0..lanes).map(|_| Vec::new()).collect(),
            status: OffloadStatus {
                provider: provider.name(),
                capacity,
                ..OffloadStatus::default()
            },
            shared: shared.clone(),
            scratch: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("dpu-offload".into())
            .spawn(move || state.run(&mut provider, &rx))?;
        let out = (0..lanes)
            .map(|index| Lane {
                index,
                next: 0,
                batch: shared.lanes[index].spare.pop().unwrap_or_default(),
                shared: shared.clone(),
            })
            .collect();
        Ok((
            Offloader {
                shared,
                control: tx,
                thread: Mutex::new(Some(thread)),
            },
            out,
        ))
    }

    fn call<T>(&self, make: impl FnOnce(SyncSender<T>) -> Command) -> Result<T, OffloadError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.control
            .send(make(reply))
            .map_err(|_| OffloadError::Stopped)?;
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.thread().unpark();
        }
        answer.recv_timeout(CONTROL_WAIT).map_err(|e| match e {
            RecvTimeoutError::Timeout => OffloadError::Timeout(CONTROL_WAIT),
            RecvTimeoutError::Disconnected => OffloadError::Stopped,
        })
    }

    /// Removes from hardware every flow of `tenant` (`None`: of every
    /// tenant) and drops the offers still queued that were decided under
    /// a configuration older than `generation`. Returns how many flows it
    /// removed, once the removal has taken effect.
    ///
    /// # Errors
    /// [`OffloadError`] if the thread is gone, late, or the provider
    /// failed to remove some.
    pub fn invalidate(&self, tenant: Option<u32>, generation: u64) -> Result<usize, OffloadError> {
        self.call(|reply| Command::Invalidate {
            tenant,
            generation,
            reply,
        })?
    }

    /// Removes from hardware every flow that comes in on or goes out of
    /// port `port` (its link went down). Returns how many, once the
    /// removal has taken effect.
    ///
    /// # Errors
    /// [`OffloadError`] if the thread is gone, late, or the provider
    /// failed to remove some.
    pub fn invalidate_port(&self, port: usize) -> Result<usize, OffloadError> {
        self.call(|reply| Command::Port { port, reply })?
    }

    /// Divides the table among `count` tenants.
    ///
    /// # Errors
    /// [`OffloadError`] if the thread is gone or late.
    pub fn set_tenants(&self, count: usize) -> Result<(), OffloadError> {
        self.call(|reply| Command::Tenants { count, reply })
    }

    /// Forgets the counts of the rules not in `rules` (the rules
    /// configured now), so that removed rules take no room.
    ///
    /// # Errors
    /// [`OffloadError`] if the thread is gone or late.
    pub fn keep_rules(&self, mut rules: Vec<u32>) -> Result<(), OffloadError> {
        rules.sort_unstable();
        self.call(|reply| Command::KeepRules { rules, reply })
    }

    /// What it has done so far (as of its last round).
    pub fn status(&self) -> OffloadStatus {
        let mut s = self
            .shared
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.lane_full = self
            .shared
            .lanes
            .iter()
            .map(|l| l.full.load(Ordering::Relaxed))
            .sum();
        s
    }
}

impl Offloader {
    /// Stops the thread, which first removes every flow it installed
    /// (while the workers still run: the model's lanes take the removals
    /// between their bursts). Later calls answer [`OffloadError::Stopped`].
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Offloader {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    tenant: u32,
    /// Its direction's 5-tuple.
    key: FlowKey,
    /// Its source and destination MAC addresses.
    macs: [[u8; 6]; 2],
    /// The ports it comes in on and goes out of (`usize::MAX`: none).
    ports: [usize; 2],
    /// Counts as last read.
    read: FlowCounts,
    /// The rule whose matches it counts, if one.
    rule: Option<u32>,
}

struct Thread {
    config: OffloadConfig,
    capacity: usize,
    shares: Shares,
    flows: HashMap<FlowId, Held>,
    /// The flows of each connection (per lane: a flow's ID names its lane).
    conns: HashMap<ConnRef, Vec<FlowId>>,
    /// The flows from or to each (tenant, MAC address).
    by_mac: HashMap<(u32, [u8; 6]), Vec<FlowId>>,
    /// Per tenant: the oldest configuration generation an offer may have
    /// been decided under.
    floors: HashMap<u32, u64>,
    tokens: f64,
    refilled: Instant,
    polled: Instant,
    /// Returned flows a full lane could not take yet, per lane.
    backlog: Vec<Vec<Returned>>,
    status: OffloadStatus,
    shared: Arc<Shared>,
    scratch: Vec<FlowId>,
}

impl Thread {
    fn run<P: Provider>(&mut self, p: &mut P, control: &Receiver<Command>) {
        while !self.shared.stop.load(Ordering::Relaxed) {
            while let Ok(c) = control.try_recv() {
                self.command(p, c);
            }
            let work = self.requests(p);
            if work > 0 {
                if let Err(e) = p.commit() {
                    self.status.commit_failed += 1;
                    self.status.last_error = Some(e);
                }
            }
            let poll = self.polled.elapsed() >= self.config.poll;
            if poll {
                self.polled = Instant::now();
                self.poll(p);
            }
            self.hand_back();
            // Status changes only with work or a poll: an idle thread
            // copies nothing.
            if work > 0 || poll {
                self.publish();
            }
            if work == 0 {
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
        // Hardware must not go on forwarding for a switch that stopped.
        let all: Vec<FlowId> = self.flows.keys().copied().collect();
        for id in all {
            let _ = p.remove(id);
        }
        let _ = p.commit();
    }

    fn command<P: Provider>(&mut self, p: &mut P, c: Command) {
        match c {
            Command::Invalidate {
                tenant,
                generation,
                reply,
            } => {
                match tenant {
                    Some(t) => {
                        self.floors.insert(t, generation);
                    }
                    None => {
                        for f in self.floors.values_mut() {
                            *f = generation;
                        }
                        self.floors.insert(u32::MAX, generation);
                    }
                }
                let r = self.invalidate(p, |h| tenant.is_none_or(|t| h.tenant == t));
                let _ = reply.send(r);
            }
            Command::Tenants { count, reply } => {
                self.shares.set_tenants(count);
                let _ = reply.send(());
            }
            Command::KeepRules { rules, reply } => {
                self.status
                    .rules
                    .retain(|r| rules.binary_search(&r.rule).is_ok());
                let _ = reply.send(());
            }
            Command::Port { port, reply } => {
                let r = self.invalidate(p, |h| h.ports.contains(&port));
                let _ = reply.send(r);
            }
        }
    }

    /// Removes the flows `covers` says a change covers, commits, and hands
    /// them back: what a control call answers.
    fn invalidate<P: Provider>(
        &mut self,
        p: &mut P,
        covers: impl Fn(&Held) -> bool,
    ) -> Result<usize, OffloadError> {
        let ids: Vec<FlowId> = self
            .flows
            .iter()
            .filter(|(_, h)| covers(h))
            .map(|(&id, _)| id)
            .collect();
        let r = self.remove(p, &ids, ReturnReason::Invalidated);
        let r = self.committed(p, r);
        self.hand_back();
        self.publish();
        r
    }

    /// `r`, the outcome of removals, once they are committed.
    fn committed<P: Provider>(
        &mut self,
        p: &mut P,
        r: Result<usize, OffloadError>,
    ) -> Result<usize, OffloadError> {
        match (r, p.commit()) {
            (Ok(n), Ok(())) => Ok(n),
            (Err(e), _) => Err(e),
            (Ok(n), Err(message)) => {
                self.status.commit_failed += 1;
                self.status.last_error = Some(message.clone());
                Err(OffloadError::Remove { failed: n, message })
            }
        }
    }

    /// The generation floor for `tenant`'s offers.
    fn floor(&self, tenant: u32) -> u64 {
        let all = self.floors.get(&u32::MAX).copied().unwrap_or(0);
        self.floors.get(&tenant).copied().unwrap_or(0).max(all)
    }

    /// Removes `ids` from hardware, reporting them to their lanes.
    fn remove<P: Provider>(
        &mut self,
        p: &mut P,
        ids: &[FlowId],
        why: ReturnReason,
    ) -> Result<usize, OffloadError> {
        let mut removed = 0;
        let mut failed = 0;
        let mut message = String::new();
        for &id in ids {
            let Some(h) = self.flows.get(&id).copied() else {
                continue;
            };
            let now = p.counts(id).unwrap_or(h.read);
            if let Err(e) = p.remove(id) {
                failed += 1;
                self.status.remove_failed += 1;
                self.status.last_error = Some(e.clone());
                message = e;
                continue;
            }
            self.forget(id, &h);
            let counts = self.fold(&h, now);
            removed += 1;
            match why {
                ReturnReason::Aged => self.status.aged += 1,
                ReturnReason::Invalidated => self.status.invalidated += 1,
                ReturnReason::Refused => {}
            }
            if let Some(b) = self.backlog.get_mut(lane_of(id)) {
                b.push(Returned {
                    id,
                    tenant: h.tenant,
                    key: h.key,
                    counts,
                    reason: why,
                });
            }
        }
        if failed > 0 {
            return Err(OffloadError::Remove { failed, message });
        }
        Ok(removed)
    }

    /// Drops flow `id` from the thread's books once it left hardware.
    fn forget(&mut self, id: FlowId, h: &Held) {
        self.flows.remove(&id);
        self.shares.give(h.tenant);
        let c = conn_ref(h.tenant, &h.key);
        if let Some(ids) = self.conns.get_mut(&c) {
            ids.retain(|&x| x != id);
            if ids.is_empty() {
                self.conns.remove(&c);
            }
        }
        for mac in h.macs {
            let k = (h.tenant, mac);
            if let Some(ids) = self.by_mac.get_mut(&k) {
                ids.retain(|&x| x != id);
                if ids.is_empty() {
                    self.by_mac.remove(&k);
                }
            }
        }
    }

    /// Adds what flow `h` did since its counters were last read (`now`
    /// is their reading) to its tenant: carried, or dropped for a drop
    /// rule.
    fn fold(&mut self, h: &Held, now: FlowCounts) -> FlowCounts {
        let d = FlowCounts {
            packets: now.packets.saturating_sub(h.read.packets),
            bytes: now.bytes.saturating_sub(h.read.bytes),
        };
        let t = self.tenant(h.tenant);
        let to = if h.ports[1] == usize::MAX {
            &mut t.dropped
        } else {
            &mut t.carried
        };
        to.packets += d.packets;
        to.bytes += d.bytes;
        if let Some(rule) = h.rule {
            let rules = &mut self.status.rules;
            let i = match rules.binary_search_by_key(&rule, |r| r.rule) {
                Ok(i) => i,
                Err(i) => {
                    rules.insert(
                        i,
                        RuleOffload {
                            rule,
                            matched: FlowCounts::default(),
                        },
                    );
                    i
                }
            };
            rules[i].matched.packets += d.packets;
            rules[i].matched.bytes += d.bytes;
        }
        d
    }

    fn tenant(&mut self, tenant: u32) -> &mut TenantOffload {
        let i = match self
            .status
            .tenants
            .binary_search_by_key(&tenant, |t| t.tenant)
        {
            Ok(i) => i,
            Err(i) => {
                self.status.tenants.insert(
                    i,
                    TenantOffload {
                        tenant,
                        ..TenantOffload::default()
                    },
                );
                i
            }
        };
        &mut self.status.tenants[i]
    }

    /// Removes the flows of connection `c` offered through lane `index`.
    fn withdraw<P: Provider>(&mut self, p: &mut P, index: usize, c: &ConnRef) {
        let Some(ids) = self.conns.get(c) else {
            return;
        };
        let ids = ids.clone();
        self.withdraw_ids(p, index, ids);
    }

    /// Removes those of flows `ids` offered through lane `index`.
    fn withdraw_ids<P: Provider>(&mut self, p: &mut P, index: usize, ids: Vec<FlowId>) {
        for id in ids.into_iter().filter(|&id| lane_of(id) == index) {
            let Some(h) = self.flows.get(&id).copied() else {
                continue;
            };
            let now = p.counts(id).unwrap_or(h.read);
            if let Err(e) = p.remove(id) {
                self.status.remove_failed += 1;
                self.status.last_error = Some(e);
                continue;
            }
            self.forget(id, &h);
            self.fold(&h, now);
            self.status.withdrawn += 1;
        }
    }

    /// Takes at most about a round's requests, a lane's batch at a time
    /// in turn so that every worker gets turns, and gives the batches
    /// back empty. Returns how many.
    fn requests<P: Provider>(&mut self, p: &mut P) -> usize {
        let now = Instant::now();
        let rate = f64::from(self.config.insert_rate);
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        // A second's worth at most, and never less than one round's.
        self.tokens = (self.tokens + elapsed * rate).min(rate.max(ROUND as f64));
        let shared = self.shared.clone();
        let mut n = 0;
        loop {
            let mut any = false;
            for (index, lane) in shared.lanes.iter().enumerate() {
                if n >= ROUND {
                    return n;
                }
                let Some(mut batch) = lane.batches.pop() else {
                    continue;
                };
                any = true;
                n += batch.len();
                for r in batch.drain(..) {
                    match r {
                        Request::Offer(o) => self.offer(p, o),
                        Request::Withdraw(c) => self.withdraw(p, index, &c),
                        Request::WithdrawMac(t, mac) => {
                            let ids = self.by_mac.get(&(t, mac)).cloned().unwrap_or_default();
                            self.withdraw_ids(p, index, ids);
                        }
                        Request::WithdrawAll => {
                            let ids: Vec<FlowId> = self.flows.keys().copied().collect();
                            self.withdraw_ids(p, index, ids);
                        }
                    }
                }
                let _ = lane.spare.push(batch);
            }
            if !any {
                return n;
            }
        }
    }

    /// Installs the flow `o` offers, or hands it back to its lane as
    /// refused, counting why.
    fn offer<P: Provider>(&mut self, p: &mut P, o: Offer) {
        if !self.install(p, &o) {
            if let Some(b) = self.backlog.get_mut(lane_of(o.id)) {
                b.push(Returned {
                    id: o.id,
                    tenant: o.rule.tenant,
                    key: o.rule.matches.key,
                    counts: FlowCounts::default(),
                    reason: ReturnReason::Refused,
                });
            }
        }
    }

    /// Installs the flow `o` offers; false, counting why, if it is not.
    fn install<P: Provider>(&mut self, p: &mut P, o: &Offer) -> bool {
        let tenant = o.rule.tenant;
        if o.generation < self.floor(tenant) {
            self.status.stale += 1;
            return false;
        }
        if self.tokens < 1.0 {
            self.status.rate_limited += 1;
            return false;
        }
        self.shares.reserve_tenants(tenant as usize + 1);
        if self.flows.len() >= self.capacity || self.shares.check(tenant).is_err() {
            self.status.over_quota += 1;
            return false;
        }
        self.tokens -= 1.0;
        match p.insert(o.id, &o.rule) {
            Ok(()) => {
                self.shares.take(tenant);
                self.tenant(tenant);
                let key = o.rule.matches.key;
                let macs = [o.rule.matches.src_mac, o.rule.matches.dst_mac];
                let out = match o.rule.action {
                    FlowAction::Forward(e) => e.port,
                    FlowAction::Drop => usize::MAX,
                };
                self.flows.insert(
                    o.id,
                    Held {
                        rule: o.rule.rule,
                        tenant,
                        key,
                        macs,
                        ports: [usize::from(o.rule.matches.in_port), out],
                        read: FlowCounts::default(),
                    },
                );
                self.conns
                    .entry(conn_ref(tenant, &key))
                    .or_default()
                    .push(o.id);
                for mac in macs {
                    self.by_mac.entry((tenant, mac)).or_default().push(o.id);
                }
                self.status.offloaded += 1;
                true
            }
            Err(r) => {
                match r {
                    Refusal::Unsupported(why) => {
                        self.status.unsupported += 1;
                        if self.status.last_unsupported.as_deref() != Some(why.as_ref()) {
                            self.status.last_unsupported = Some(why.into_owned());
                        }
                    }
                    Refusal::TableFull => self.status.table_full += 1,
                    Refusal::Failed(e) => {
                        self.status.insert_failed += 1;
                        self.status.last_error = Some(e);
                    }
                }
                false
            }
        }
    }

    /// Reads every flow's counters and removes the aged ones.
    fn poll<P: Provider>(&mut self, p: &mut P) {
        let ids: Vec<FlowId> = self.flows.keys().copied().collect();
        for id in ids {
            let Some(now) = p.counts(id) else {
                continue;
            };
            if let Some(h) = self.flows.get(&id).copied() {
                self.fold(&h, now);
                if let Some(h) = self.flows.get_mut(&id) {
                    h.read = now;
                }
            }
        }
        let mut aged = std::mem::take(&mut self.scratch);
        aged.clear();
        p.aged(Instant::now(), &mut aged);
        if !aged.is_empty() {
            let _ = self.remove(p, &aged, ReturnReason::Aged);
            if let Err(e) = p.commit() {
                self.status.commit_failed += 1;
                self.status.last_error = Some(e);
            }
        }
        self.scratch = aged;
    }

    /// Hands returned flows to their lanes as room allows.
    fn hand_back(&mut self) {
        for (lane, backlog) in self.backlog.iter_mut().enumerate() {
            let q = &self.shared.lanes[lane].returned;
            let mut moved = 0;
            for r in backlog.iter() {
                if q.push(*r).is_err() {
                    break;
                }
                moved += 1;
            }
            backlog.drain(..moved);
        }
    }

    fn publish(&mut self) {
        self.status.in_use = self.flows.len();
        for t in &mut self.status.tenants {
            t.flows = u64::from(self.shares.held(t.tenant));
        }
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        s.clone_from(&self.status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::model::{ModelLanes, ModelLimits, ModelNic};
    use crate::offload::{FlowAction, FlowMatch};
    use crate::wire::{proto, FlowKey};
    use crate::worker::Egress;

    fn rule(tenant: u32, port: u16) -> FlowRule {
        FlowRule {
            tenant,
            matches: FlowMatch {
                in_port: 0,
                vni: None,
                vlan: None,
                src_mac: [2, 0, 0, 0, 0, 1],
                dst_mac: [2, 0, 0, 0, 0, 2],
                key: FlowKey {
                    src: 0x0a00_0001,
                    dst: 0x0a00_0002,
                    src_port: port,
                    dst_port: 80,
                    proto: proto::TCP,
                    v6: false,
                },
            },
            action: FlowAction::Forward(Egress::to(1)),
            idle: Duration::from_secs(30),
            rule: None,
        }
    }

    fn config() -> OffloadConfig {
        OffloadConfig {
            table: 64,
            per_tenant: 48,
            reserved: 16,
            insert_rate: 1_000_000,
            lane_queue: 256,
            poll: Duration::from_millis(20),
        }
    }

    /// Waits (bounded) until `f` holds of the status.
    fn until(o: &Offloader, f: impl Fn(&OffloadStatus) -> bool) -> OffloadStatus {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let s = o.status();
            if f(&s) || Instant::now() > end {
                return s;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Runs lanes' model changes on a thread, as workers would between
    /// bursts, until dropped.
    struct Workers {
        stop: Arc<AtomicBool>,
        t: Option<JoinHandle<ModelLanes>>,
    }

    impl Workers {
        fn run(mut lanes: ModelLanes) -> Workers {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let t = std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    for l in &mut lanes {
                        l.turn();
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                lanes
            });
            Workers { stop, t: Some(t) }
        }

        fn stop(mut self) -> ModelLanes {
            self.stop.store(true, Ordering::Relaxed);
            self.t.take().unwrap().join().unwrap()
        }
    }

    /// The offloader with `cfg` over a model NIC of `lanes` lanes, whose
    /// changes a thread takes as workers would.
    fn running(cfg: OffloadConfig, lanes: usize) -> (Offloader, Vec<Lane>, Workers) {
        let (nic, models) = ModelNic::new(ModelLimits::default(), lanes);
        let w = Workers::run(models);
        let (o, l) = Offloader::start(nic, cfg, lanes).unwrap();
        (o, l, w)
    }

    #[test]
    fn a_flood_keeps_to_its_share_and_the_others_keep_their_reserve() {
        let (o, mut l, w) = running(config(), 2);
        o.set_tenants(3).unwrap();
        // Tenant 1 floods from both workers: the pool (64 - 3 * 16 = 16)
        // plus its reserve, never tenant 2's or 3's reserve.
        let mut offered = 0;
        for i in 0..400u16 {
            offered += l[usize::from(i % 2)].offer(rule(1, i), 1).is_some() as u32;
        }
        for lane in &mut l {
            lane.flush();
        }
        let s = until(&o, |s| s.over_quota + s.offloaded >= u64::from(offered));
        assert_eq!(s.offloaded, 32, "{s:?}");
        assert_eq!(s.over_quota as u32 + 32, offered);
        for i in 0..20 {
            l[0].offer(rule(2, i), 1).unwrap();
        }
        l[0].flush();
        let s = until(&o, |s| s.offloaded >= 48);
        assert_eq!(s.offloaded, 48, "tenant 2 gets its whole reserve: {s:?}");
        let t1 = s.tenants.iter().find(|t| t.tenant == 1).unwrap();
        let t2 = s.tenants.iter().find(|t| t.tenant == 2).unwrap();
        assert_eq!((t1.flows, t2.flows), (32, 16));
        drop(o);
        let lanes = w.stop();
        assert_eq!(
            lanes.iter().map(|l| l.len()).sum::<usize>(),
            0,
            "a stopped offloader leaves no flow in hardware"
        );
    }

    #[test]
    fn a_port_that_goes_down_takes_the_flows_through_it() {
        let (o, mut l, w) = running(config(), 1);
        // In on 0, out of 1; in on 2, out of 3; in on 3, out of 0.
        for (i, (inp, out)) in [(0u16, 1usize), (2, 3), (3, 0)].into_iter().enumerate() {
            let mut r = rule(1, i as u16);
            r.matches.in_port = inp;
            r.action = FlowAction::Forward(Egress::to(out));
            l[0].offer(r, 1).unwrap();
        }
        l[0].flush();
        until(&o, |s| s.offloaded == 3);
        assert_eq!(o.invalidate_port(0), Ok(2));
        assert_eq!(o.invalidate_port(0), Ok(0));
        assert_eq!(o.invalidate_port(2), Ok(1));
        assert_eq!(o.status().in_use, 0);
        drop(o);
        w.stop();
    }

    #[test]
    fn an_invalidation_removes_before_it_answers_and_drops_stale_offers() {
        let (o, mut l, w) = running(config(), 1);
        let a = l[0].offer(rule(1, 1), 5).unwrap();
        l[0].offer(rule(2, 2), 5).unwrap();
        l[0].flush();
        until(&o, |s| s.offloaded == 2);
        assert_eq!(o.invalidate(Some(1), 6), Ok(1));
        let s = o.status();
        assert_eq!((s.in_use, s.invalidated), (1, 1));
        let r = l[0].returned().unwrap();
        assert_eq!((r.id, r.reason), (a, ReturnReason::Invalidated));
        // Decided under generation 5, after the change to 6: stale.
        l[0].offer(rule(1, 3), 5).unwrap();
        l[0].offer(rule(1, 4), 6).unwrap();
        l[0].flush();
        let s = until(&o, |s| s.offloaded == 3 && s.stale == 1);
        assert_eq!((s.offloaded, s.stale), (3, 1));
        assert_eq!(o.invalidate(None, 7), Ok(2));
        l[0].offer(rule(2, 9), 6).unwrap();
        l[0].flush();
        let s = until(&o, |s| s.stale == 2);
        assert_eq!((s.in_use, s.stale), (0, 2));
        drop(o);
        let lanes = w.stop();
        assert!(lanes[0].is_empty());
    }

    #[test]
    fn counters_fold_per_tenant_and_aged_flows_come_back() {
        let (nic, mut lanes) = ModelNic::new(ModelLimits::default(), 1);
        let mut cfg = config();
        cfg.poll = Duration::from_millis(10);
        let (o, mut l) = Offloader::start(nic, cfg, 1).unwrap();
        let mut r = rule(4, 1);
        r.idle = Duration::from_millis(300);
        let id = l[0].offer(r, 1).unwrap();
        l[0].flush();
        // The lane takes the insertion as a worker would, at once.
        let end = Instant::now() + Duration::from_secs(5);
        while lanes[0].is_empty() && Instant::now() < end {
            lanes[0].turn();
            std::thread::sleep(Duration::from_micros(100));
        }
        until(&o, |s| s.offloaded == 1);
        let frame = {
            use crate::wire::tests::build;
            let mut f = build::eth(
                [2, 0, 0, 0, 0, 2],
                [2, 0, 0, 0, 0, 1],
                None,
                crate::wire::ETH_IPV4,
            );
            f.extend(build::ipv4(
                [10, 0, 0, 1],
                [10, 0, 0, 2],
                proto::TCP,
                &build::tcp(1, 80, 0x10),
            ));
            f
        };
        for _ in 0..10 {
            assert!(lanes[0].carry(0, &frame, Instant::now()).is_some());
        }
        let s = until(&o, |s| {
            s.tenants.first().is_some_and(|t| t.carried.packets == 10)
        });
        assert_eq!(s.tenants[0].carried.bytes, 10 * frame.len() as u64, "{s:?}");
        // No packet for longer than its age: removed and handed back.
        let end = Instant::now() + Duration::from_secs(10);
        let back = loop {
            lanes[0].turn();
            if let Some(b) = l[0].returned() {
                break b;
            }
            assert!(Instant::now() < end, "never aged: {:?}", o.status());
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!((back.id, back.reason), (id, ReturnReason::Aged));
        assert_eq!(o.status().aged, 1);
        lanes[0].turn();
        assert!(lanes[0].carry(0, &frame, Instant::now()).is_none());
    }

    #[test]
    fn the_insertion_rate_and_full_lanes_bound_a_flood() {
        let mut cfg = config();
        cfg.table = 10_000;
        cfg.per_tenant = 10_000;
        cfg.insert_rate = 300;
        cfg.lane_queue = 64;
        let (o, mut l, w) = running(cfg, 1);
        let start = Instant::now();
        let mut refused = 0;
        for i in 0..20_000u32 {
            if l[0].offer(rule(1, i as u16), 1).is_none() {
                refused += 1;
            }
            if i % 64 == 0 {
                l[0].flush();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        l[0].flush();
        let took = start.elapsed().as_secs_f64();
        let s = until(&o, |s| s.offloaded + s.rate_limited + s.lane_full >= 20_000);
        assert_eq!(s.lane_full, refused);
        // The first round's tokens, then the rate.
        let most = 256.0 + 300.0 * (took + 0.1);
        assert!(
            (s.offloaded as f64) <= most,
            "{} in {took:.2}s: {s:?}",
            s.offloaded
        );
        assert!(s.rate_limited > 0);
        drop(o);
        w.stop();
    }

    #[test]
    fn withdrawn_flows_leave_hardware_and_give_their_share_back() {
        let mut cfg = config();
        cfg.table = 2;
        cfg.per_tenant = 2;
        cfg.reserved = 0;
        let (o, mut l, w) = running(cfg, 1);
        l[0].offer(rule(1, 1), 1).unwrap();
        l[0].offer(rule(1, 2), 1).unwrap();
        l[0].offer(rule(1, 3), 1).unwrap();
        l[0].flush();
        let s = until(&o, |s| s.offloaded == 2 && s.over_quota == 1);
        assert_eq!((s.offloaded, s.over_quota), (2, 1));
        // Named by the other direction's 5-tuple: the same connection.
        l[0].withdraw(1, &rule(1, 1).matches.key.reversed())
            .unwrap();
        l[0].offer(rule(1, 3), 1).unwrap();
        l[0].flush();
        let s = until(&o, |s| s.offloaded == 3);
        assert_eq!((s.withdrawn, s.in_use), (1, 2));
        // The offer past the share came back refused; the withdrawal
        // is not handed back.
        let r = l[0].returned().unwrap();
        assert_eq!((r.reason, r.key.src_port), (ReturnReason::Refused, 3));
        assert!(l[0].returned().is_none(), "a withdrawal is not handed back");
        drop(o);
        w.stop();
    }
}

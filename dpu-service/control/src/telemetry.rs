//! Counters: where they come from, and how they are read.
//!
//! The data plane and the NVMe-oF target own their counters (per worker,
//! lock-free) and register a [`CounterSource`]; a read asks every source to
//! add its figures into one [`Counters`] value, which the telemetry gRPC
//! service and the Prometheus endpoint turn into their formats. Every
//! configured port, tenant, rule and subsystem appears in a snapshot, at
//! zero until a source counts something for it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, RwLock};

use dpu_proto::v1 as pb;

use crate::convert;
use crate::model::{State, Timestamp};
use crate::state::PortRegistry;

mod qos;

pub use dpu_nvmeof::qos::QosScope;
pub use qos::{QosByScope, QosCounters};

/// Every reason `dpu.v1.DropReason` names, in its order (`UNSPECIFIED`
/// left out). Drops are counted by the contract's own enum: a reason added
/// to the proto is listed, counted and exported without another copy here.
pub fn drop_reasons() -> impl Iterator<Item = pb::DropReason> {
    (1..).map_while(|i| pb::DropReason::try_from(i).ok())
}

/// The lower-case label a drop reason has in metrics, e.g. `acl_deny`.
pub fn drop_label(reason: pb::DropReason) -> String {
    let name = reason.as_str_name();
    name.strip_prefix("DROP_REASON_")
        .unwrap_or(name)
        .to_ascii_lowercase()
}

/// Live state of a port as its driver reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortStatus {
    /// `Some(true)` up, `Some(false)` down, `None` unknown.
    pub link_up: Option<bool>,
    /// Speed in Mbit/s, 0 if unknown.
    pub speed_mbps: u32,
    /// MAC address, empty if unknown.
    pub mac_address: String,
    /// MTU, 0 if unknown.
    pub mtu: u32,
}

/// Counters of one tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantCounters {
    /// Packets received on the tenant's attachments.
    pub rx_packets: u64,
    /// Bytes received on the tenant's attachments.
    pub rx_bytes: u64,
    /// Packets forwarded.
    pub forwarded_packets: u64,
    /// Packets dropped.
    pub dropped_packets: u64,
    /// Connection-tracking entries in use.
    pub conntrack_entries: u64,
    /// Of the packets received and forwarded: those flow hardware
    /// forwarded.
    pub offloaded_packets: u64,
    /// Their bytes.
    pub offloaded_bytes: u64,
}

/// Counters of one rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCounters {
    /// Packets matched.
    pub packets: u64,
    /// Bytes matched.
    pub bytes: u64,
    /// Last match, if any.
    pub last_hit: Option<Timestamp>,
}

/// Counters of one subsystem.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubsystemCounters {
    /// Open host connections.
    pub connections: u64,
    /// Reads completed.
    pub read_ops: u64,
    /// Writes completed.
    pub write_ops: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Commands completed with an error.
    pub errors: u64,
    /// DH-HMAC-CHAP authentications that succeeded.
    pub auth_succeeded: u64,
    /// DH-HMAC-CHAP authentications that failed, and connects refused for
    /// want of a secret.
    pub auth_failed: u64,
    /// DH-HMAC-CHAP attempts refused before any DH work: their source
    /// address was over its rate.
    pub auth_rate_limited: u64,
    /// DH-HMAC-CHAP attempts refused because the DH threads' queue was
    /// full.
    pub auth_busy: u64,
    /// Namespaces served whose store is out of reach now.
    pub namespaces_unreachable: u64,
}

/// Everything counted, keyed by resource ID.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Port status by port ID.
    pub port_status: BTreeMap<String, PortStatus>,
    /// Port counters by port ID, in the contract's own message.
    pub ports: BTreeMap<String, pb::PortCounters>,
    /// Tenant counters by tenant ID.
    pub tenants: BTreeMap<String, TenantCounters>,
    /// Rule counters by (tenant ID, rule ID).
    pub rules: BTreeMap<(String, String), RuleCounters>,
    /// Drops by reason.
    pub drops: BTreeMap<pb::DropReason, u64>,
    /// Subsystem counters by subsystem ID.
    pub subsystems: BTreeMap<String, SubsystemCounters>,
    /// The NVMe-oF target's QoS limiters (those with limits set or that
    /// held commands back) by subsystem ID and scope.
    pub qos: QosByScope,
    /// The data-plane workers' flow caches, summed.
    pub flow_cache: FlowCacheCounters,
    /// The NVMe/TCP target as a whole, in the contract's own message.
    pub nvmf_target: pb::NvmfTargetCounters,
    /// The service's own TCP listeners (the API's, its health listener's,
    /// the metrics'), by name.
    pub listeners: BTreeMap<String, ListenerCounters>,
    /// What this process restored of the switch's tables the process
    /// before it saved.
    pub restored: RestoredCounters,
    /// Flow offload, when it is on (tenants named by ID, not yet as
    /// resources).
    pub offload: Option<pb::OffloadCounters>,
}

/// What a start did with the switch's tables saved by the process before
/// it: entries by table (`conntrack`, `fragments`) and outcome
/// (`restored`, `expired`, `no_tenant`, `invalid`), and files refused as
/// a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoredCounters {
    /// Entries by (table, outcome).
    pub entries: BTreeMap<(&'static str, &'static str), u64>,
    /// Files refused as a whole: another version, damaged, too large.
    pub refused_files: u64,
}

/// Renders what the start restored of the switch's tables.
fn render_restored(m: &mut Metrics, r: &RestoredCounters) {
    let name = "dpu_switch_restored_entries_total";
    m.family(
        name,
        "counter",
        "Entries of the switch's tables saved by the previous process, by table and what became of them at start.",
    );
    for ((table, outcome), n) in &r.entries {
        m.sample(name, &[("table", table), ("outcome", outcome)], *n);
    }
    let name = "dpu_switch_restore_refused_files_total";
    m.family(
        name,
        "counter",
        "Saved switch-table files refused as a whole (another version, damaged, too large).",
    );
    m.sample(name, &[], r.refused_files);
}

/// The flow offload's families, `dpu_offload_*`.
fn render_offload(m: &mut Metrics, o: &pb::OffloadCounters) {
    let gauges: [(&str, &str, u64); 2] = [
        (
            "dpu_offload_capacity",
            "Flows the hardware table may hold.",
            o.capacity,
        ),
        ("dpu_offload_flows", "Flows in hardware now.", o.in_use),
    ];
    for (name, help, v) in gauges {
        m.family(name, "gauge", help);
        m.sample(name, &[("provider", &o.provider)], v);
    }
    let name = "dpu_offload_flows_total";
    m.family(
        name,
        "counter",
        "Flows installed in hardware, and how they left it.",
    );
    for (event, v) in [
        ("installed", o.offloaded),
        ("withdrawn", o.withdrawn),
        ("aged", o.aged),
        ("invalidated", o.invalidated),
    ] {
        m.sample(name, &[("event", event)], v);
    }
    let name = "dpu_offload_refused_total";
    m.family(
        name,
        "counter",
        "Offers of flows that stayed in software, by reason.",
    );
    for (reason, v) in [
        ("unsupported", o.unsupported),
        ("table_full", o.table_full),
        ("insert_failed", o.insert_failed),
        ("over_quota", o.over_quota),
        ("rate_limited", o.rate_limited),
        ("queue_full", o.queue_full),
        ("stale", o.stale),
    ] {
        m.sample(name, &[("reason", reason)], v);
    }
    let name = "dpu_offload_errors_total";
    m.family(
        name,
        "counter",
        "Removals and batches of changes the provider failed.",
    );
    m.sample(name, &[("op", "remove")], o.remove_failed);
    m.sample(name, &[("op", "commit")], o.commit_failed);
    let tenants: Vec<_> = o
        .tenants
        .iter()
        .map(|t| (t.tenant.strip_prefix("tenants/").unwrap_or(&t.tenant), t))
        .collect();
    let fields: [Field<pb::OffloadTenant>; 5] = [
        (
            "dpu_offload_tenant_flows",
            "gauge",
            "The tenant's flows in hardware now.",
            |t| t.flows,
        ),
        (
            "dpu_offload_tenant_packets_total",
            "counter",
            "Packets the tenant's offloaded flows carried.",
            |t| t.packets,
        ),
        (
            "dpu_offload_tenant_bytes_total",
            "counter",
            "Bytes the tenant's offloaded flows carried.",
            |t| t.bytes,
        ),
        (
            "dpu_offload_tenant_dropped_packets_total",
            "counter",
            "Packets the tenant's drop rules dropped in hardware.",
            |t| t.dropped_packets,
        ),
        (
            "dpu_offload_tenant_dropped_bytes_total",
            "counter",
            "Bytes the tenant's drop rules dropped in hardware.",
            |t| t.dropped_bytes,
        ),
    ];
    m.fields(&fields, "tenant", &tenants);
}

/// Counters of one of the service's own TCP listeners: what its bounds
/// refused and closed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerCounters {
    /// Connections open now.
    pub connections: u64,
    /// Connections closed at once: the listener had its most.
    pub refused_max_connections: u64,
    /// Connections closed at once: their source address had its most.
    pub refused_max_connections_per_source: u64,
    /// Connections closed for not finishing the TLS handshake and a first
    /// request in time.
    pub closed_handshake_timeout: u64,
    /// Connections closed after a time without a call open.
    pub closed_idle_timeout: u64,
    /// Connections closed before their first call to make room for a
    /// newer one, at the listener's bound or their source's.
    pub closed_displaced: u64,
    /// Failed accepts (such as the process out of file descriptors).
    pub accept_errors: u64,
    /// Streaming watch calls open now.
    pub watches: u64,
    /// Streaming watch calls refused: the listener or the connection had
    /// its most.
    pub refused_watches: u64,
}

/// Renders the service's own listeners' counters: connections and watches
/// open, and what their bounds refused or closed, by reason.
fn render_listeners(m: &mut Metrics, listeners: &BTreeMap<String, ListenerCounters>) {
    type Get = fn(&ListenerCounters) -> u64;
    type Reasons<'a> = &'a [(&'a str, Get)];
    let gauges: [(&str, &str, Get); 2] = [
        (
            "dpu_listener_connections",
            "Connections open to the service's own listener.",
            |c| c.connections,
        ),
        (
            "dpu_listener_watches",
            "Streaming watch calls open on the listener.",
            |c| c.watches,
        ),
    ];
    for (name, help, get) in gauges {
        m.family(name, "gauge", help);
        for (l, c) in listeners {
            m.sample(name, &[("listener", l)], get(c));
        }
    }
    let refused: [(&str, Get); 3] = [
        ("max_connections", |c| c.refused_max_connections),
        ("max_connections_per_source", |c| {
            c.refused_max_connections_per_source
        }),
        ("max_watches", |c| c.refused_watches),
    ];
    let closed: [(&str, Get); 3] = [
        ("handshake_timeout", |c| c.closed_handshake_timeout),
        ("idle_timeout", |c| c.closed_idle_timeout),
        ("displaced", |c| c.closed_displaced),
    ];
    let by_reason: [(&str, &str, Reasons); 2] = [
        (
            "dpu_listener_refused_total",
            "Connections and watch calls the listener refused, by the bound they met.",
            &refused,
        ),
        (
            "dpu_listener_closed_total",
            "Connections the listener closed: on a timeout, or displaced before their first call by newer ones at a bound.",
            &closed,
        ),
    ];
    for (name, help, reasons) in by_reason {
        m.family(name, "counter", help);
        for (l, c) in listeners {
            for (reason, get) in reasons {
                m.sample(name, &[("listener", l), ("reason", reason)], get(c));
            }
        }
    }
    let name = "dpu_listener_accept_errors_total";
    m.family(
        name,
        "counter",
        "Failed accepts on the listener (such as no file descriptor left).",
    );
    for (l, c) in listeners {
        m.sample(name, &[("listener", l)], c.accept_errors);
    }
}

/// Counters of the data-plane workers' flow caches, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowCacheCounters {
    /// Classifications looked up in a cache.
    pub lookups: u64,
    /// Lookups a cache answered.
    pub hits: u64,
    /// Times a worker's cache rested for missing too often.
    pub rests: u64,
}

/// Something that counts: the data plane, the NVMe-oF target.
pub trait CounterSource: Send + Sync {
    /// Adds this source's current figures into `out`.
    fn collect(&self, out: &mut Counters);
}

/// The registry of counter sources plus the control plane's own request counters.
#[derive(Default)]
pub struct Telemetry {
    sources: RwLock<Vec<Arc<dyn CounterSource>>>,
    requests: Mutex<BTreeMap<(&'static str, i32), u64>>,
    /// Refused calls by method and client label (both from bounded sets:
    /// the method table and the configured clients).
    denied: Mutex<BTreeMap<(&'static str, String), u64>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Registers a counter source.
    pub fn register(&self, source: Arc<dyn CounterSource>) {
        if let Ok(mut s) = self.sources.write() {
            s.push(source);
        }
    }

    /// Counts one gRPC request to `method` that ended with `code`.
    pub fn observe_request(&self, method: &'static str, code: tonic::Code) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((method, code as i32)).or_default() += 1;
        }
    }

    /// Counts one call to `method` refused to the client labelled
    /// `client` (a configured client's name, or
    /// [`crate::service::authz::UNKNOWN`] or
    /// [`crate::service::authz::ANONYMOUS`]).
    pub fn observe_denied(&self, method: &'static str, client: &str) {
        if let Ok(mut d) = self.denied.lock() {
            match d.get_mut(&(method, client.to_string())) {
                Some(n) => *n = n.saturating_add(1),
                None => {
                    d.insert((method, client.to_string()), 1);
                }
            }
        }
    }

    /// Collects every source into one [`Counters`] value.
    pub fn collect(&self) -> Counters {
        let mut c = Counters::default();
        if let Ok(sources) = self.sources.read() {
            for s in sources.iter() {
                s.collect(&mut c);
            }
        }
        c
    }

    /// A snapshot for the telemetry API: every configured object, its
    /// counters (zero if nothing counted it), tenants and rules optionally
    /// restricted to `tenant`.
    pub fn snapshot(
        &self,
        state: &State,
        ports: &PortRegistry,
        tenant: Option<&str>,
    ) -> pb::CounterSnapshot {
        snapshot_of(&self.collect(), state, ports, tenant)
    }

    /// Renders all counters and state gauges in the Prometheus text
    /// exposition format (version 0.0.4).
    pub fn render_prometheus(&self, state: &State, ports: &PortRegistry) -> String {
        // Counted once: every source is asked once per scrape.
        let c = self.collect();
        let snap = snapshot_of(&c, state, ports, None);
        let mut m = Metrics::default();
        m.family("dpu_up", "gauge", "1 while the service runs.");
        m.sample("dpu_up", &[], 1);
        m.family("dpu_build_info", "gauge", "Build of the running service.");
        m.sample(
            "dpu_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1,
        );

        let gauges: [(&str, &str, usize); 5] = [
            ("dpu_tenants", "Tenants configured.", state.tenants.len()),
            (
                "dpu_rules",
                "Filter rules configured, all tenants.",
                state.tenants.values().map(|t| t.rules.rules.len()).sum(),
            ),
            (
                "dpu_subsystems",
                "NVMe-oF subsystems configured.",
                state.subsystems.len(),
            ),
            (
                "dpu_namespaces",
                "NVMe-oF namespaces configured.",
                state.subsystems.values().map(|s| s.namespaces.len()).sum(),
            ),
            (
                "dpu_listeners",
                "NVMe-oF listeners configured.",
                state.subsystems.values().map(|s| s.listeners.len()).sum(),
            ),
        ];
        for (name, help, v) in gauges {
            m.family(name, "gauge", help);
            m.sample(name, &[], v as u64);
        }

        let port_fields: [Field<pb::PortCounters>; 7] = [
            (
                "dpu_port_rx_packets_total",
                "counter",
                "Packets received on the port.",
                |c| c.rx_packets,
            ),
            (
                "dpu_port_rx_bytes_total",
                "counter",
                "Bytes received on the port.",
                |c| c.rx_bytes,
            ),
            (
                "dpu_port_tx_packets_total",
                "counter",
                "Packets transmitted on the port.",
                |c| c.tx_packets,
            ),
            (
                "dpu_port_tx_bytes_total",
                "counter",
                "Bytes transmitted on the port.",
                |c| c.tx_bytes,
            ),
            (
                "dpu_port_rx_missed_total",
                "counter",
                "Packets the port's driver could not receive.",
                |c| c.rx_missed,
            ),
            (
                "dpu_port_rx_errors_total",
                "counter",
                "Receive errors on the port.",
                |c| c.rx_errors,
            ),
            (
                "dpu_port_tx_errors_total",
                "counter",
                "Transmit errors on the port.",
                |c| c.tx_errors,
            ),
        ];
        let zero = pb::PortCounters::default();
        let port_rows: Vec<(&str, &pb::PortCounters)> = snap
            .ports
            .iter()
            .map(|p| (strip(&p.port), p.counters.as_ref().unwrap_or(&zero)))
            .collect();
        m.fields(&port_fields, "port", &port_rows);
        let status = &c.port_status;
        m.family(
            "dpu_port_link_up",
            "gauge",
            "1 if the port's link is up, 0 if down or unknown.",
        );
        for id in ports.keys() {
            let up = status.get(id).and_then(|s| s.link_up).unwrap_or(false);
            m.sample("dpu_port_link_up", &[("port", id)], u64::from(up));
        }

        let tenant_fields: [Field<pb::TenantCounters>; 5] = [
            (
                "dpu_tenant_rx_packets_total",
                "counter",
                "Packets received on the tenant's attachments.",
                |c| c.rx_packets,
            ),
            (
                "dpu_tenant_rx_bytes_total",
                "counter",
                "Bytes received on the tenant's attachments.",
                |c| c.rx_bytes,
            ),
            (
                "dpu_tenant_forwarded_packets_total",
                "counter",
                "Packets of the tenant forwarded.",
                |c| c.forwarded_packets,
            ),
            (
                "dpu_tenant_dropped_packets_total",
                "counter",
                "Packets of the tenant dropped.",
                |c| c.dropped_packets,
            ),
            (
                "dpu_tenant_conntrack_entries",
                "gauge",
                "Connection-tracking entries of the tenant in use.",
                |c| c.conntrack_entries,
            ),
        ];
        let tenant_rows: Vec<_> = snap.tenants.iter().map(|t| (strip(&t.tenant), t)).collect();
        m.fields(&tenant_fields, "tenant", &tenant_rows);

        m.family(
            "dpu_rule_packets_total",
            "counter",
            "Packets that matched the filter rule.",
        );
        for r in &snap.rules {
            m.sample("dpu_rule_packets_total", &rule_labels(&r.rule), r.packets);
        }
        m.family(
            "dpu_rule_bytes_total",
            "counter",
            "Bytes that matched the filter rule.",
        );
        for r in &snap.rules {
            m.sample("dpu_rule_bytes_total", &rule_labels(&r.rule), r.bytes);
        }

        m.family(
            "dpu_dropped_packets_total",
            "counter",
            "Packets dropped by the data plane, by reason.",
        );
        for (reason, d) in drop_reasons().zip(&snap.drops) {
            m.sample(
                "dpu_dropped_packets_total",
                &[("reason", &drop_label(reason))],
                d.packets,
            );
        }

        let cache_counters: [(&str, &str, u64); 3] = [
            (
                "dpu_flow_cache_lookups_total",
                "Classifications looked up in the workers' flow caches.",
                c.flow_cache.lookups,
            ),
            (
                "dpu_flow_cache_hits_total",
                "Flow-cache lookups answered from the cache.",
                c.flow_cache.hits,
            ),
            (
                "dpu_flow_cache_rests_total",
                "Times a worker's flow cache rested for missing too often.",
                c.flow_cache.rests,
            ),
        ];
        for (name, help, v) in cache_counters {
            m.family(name, "counter", help);
            m.sample(name, &[], v);
        }

        let ss_fields: [Field<pb::SubsystemCounters>; 7] = [
            (
                "dpu_nvmf_connections",
                "gauge",
                "Open host queue connections of the subsystem.",
                |c| c.connections,
            ),
            (
                "dpu_nvmf_read_ops_total",
                "counter",
                "Read commands completed.",
                |c| c.read_ops,
            ),
            (
                "dpu_nvmf_write_ops_total",
                "counter",
                "Write commands completed.",
                |c| c.write_ops,
            ),
            (
                "dpu_nvmf_read_bytes_total",
                "counter",
                "Bytes read by hosts.",
                |c| c.read_bytes,
            ),
            (
                "dpu_nvmf_write_bytes_total",
                "counter",
                "Bytes written by hosts.",
                |c| c.write_bytes,
            ),
            (
                "dpu_nvmf_errors_total",
                "counter",
                "Commands completed with an error status.",
                |c| c.errors,
            ),
            (
                "dpu_nvmf_namespaces_unreachable",
                "gauge",
                "Namespaces of the subsystem whose store (a storage cluster, a remote target) is out of reach.",
                |c| c.namespaces_unreachable,
            ),
        ];
        let ss_rows: Vec<_> = snap
            .subsystems
            .iter()
            .map(|s| (strip(&s.subsystem), s))
            .collect();
        m.fields(&ss_fields, "subsystem", &ss_rows);
        m.family(
            "dpu_nvmf_auth_total",
            "counter",
            "DH-HMAC-CHAP authentications of the subsystem's queues by result; failed includes connects refused for want of a secret; rate_limited (the source address over storage.auth_attempts_per_sec) and busy (the DH threads' queue full) were refused before their secret was checked.",
        );
        for (id, c) in &ss_rows {
            for (result, v) in [
                ("succeeded", c.auth_succeeded),
                ("failed", c.auth_failed),
                ("rate_limited", c.auth_rate_limited),
                ("busy", c.auth_busy),
            ] {
                m.sample(
                    "dpu_nvmf_auth_total",
                    &[("subsystem", id), ("result", result)],
                    v,
                );
            }
        }

        qos::render(&mut m, &c.qos);

        let target = &c.nvmf_target;
        for (name, kind, help, samples) in NVMF_TARGET_FAMILIES {
            m.family(name, kind, help);
            for (reason, get) in samples {
                let labels = reason.map(|r| ("reason", r));
                m.sample(name, labels.as_slice(), get(target));
            }
        }
        m.family(
            "dpu_nvmf_poll_group_queues",
            "gauge",
            "I/O queues the NVMe/TCP poll group serves now.",
        );
        for (group, queues) in target.poll_group_queues.iter().enumerate() {
            m.sample(
                "dpu_nvmf_poll_group_queues",
                &[("group", &group.to_string())],
                *queues,
            );
        }

        render_listeners(&mut m, &c.listeners);
        render_restored(&mut m, &c.restored);
        if let Some(o) = &snap.offload {
            render_offload(&mut m, o);
        }

        m.family(
            "dpu_grpc_requests_total",
            "counter",
            "gRPC requests handled, by method and status code.",
        );
        if let Ok(reqs) = self.requests.lock() {
            for ((method, code), n) in reqs.iter() {
                let code = format!("{:?}", tonic::Code::from_i32(*code));
                m.sample(
                    "dpu_grpc_requests_total",
                    &[("method", method), ("code", &code)],
                    *n,
                );
            }
        }
        m.family(
            "dpu_grpc_denied_total",
            "counter",
            "gRPC calls refused by authorization, by method and client.",
        );
        if let Ok(denied) = self.denied.lock() {
            for ((method, client), n) in denied.iter() {
                m.sample(
                    "dpu_grpc_denied_total",
                    &[("method", method), ("client", client)],
                    *n,
                );
            }
        }
        m.out
    }
}

/// [`Telemetry::snapshot`] of the counters `c`.
fn snapshot_of(
    c: &Counters,
    state: &State,
    ports: &PortRegistry,
    tenant: Option<&str>,
) -> pb::CounterSnapshot {
    let keep = |t: &str| tenant.is_none_or(|want| want == t);
    pb::CounterSnapshot {
        time: Some(convert::timestamp(Timestamp::now())),
        ports: ports
            .keys()
            .map(|id| pb::PortCounterEntry {
                port: format!("ports/{id}"),
                counters: Some(c.ports.get(id).copied().unwrap_or_default()),
            })
            .collect(),
        tenants: state
            .tenants
            .keys()
            .filter(|t| keep(t))
            .map(|id| {
                let t = c.tenants.get(id).copied().unwrap_or_default();
                pb::TenantCounters {
                    tenant: format!("tenants/{id}"),
                    rx_packets: t.rx_packets,
                    rx_bytes: t.rx_bytes,
                    forwarded_packets: t.forwarded_packets,
                    dropped_packets: t.dropped_packets,
                    conntrack_entries: t.conntrack_entries,
                    offloaded_packets: t.offloaded_packets,
                    offloaded_bytes: t.offloaded_bytes,
                }
            })
            .collect(),
        rules: state
            .tenants
            .values()
            .filter(|t| keep(&t.id))
            .flat_map(|t| t.rules.rules.iter().map(move |r| (&t.id, r)))
            .map(|(tid, r)| {
                let rc = c
                    .rules
                    .get(&(tid.clone(), r.id.clone()))
                    .copied()
                    .unwrap_or_default();
                pb::RuleCounters {
                    rule: format!("tenants/{tid}/rules/{}", r.id),
                    packets: rc.packets,
                    bytes: rc.bytes,
                    last_hit_time: rc.last_hit.map(convert::timestamp),
                }
            })
            .collect(),
        drops: drop_reasons()
            .map(|r| pb::DropCounter {
                reason: r as i32,
                packets: c.drops.get(&r).copied().unwrap_or(0),
            })
            .collect(),
        subsystems: state
            .subsystems
            .keys()
            .map(|id| {
                let s = c.subsystems.get(id).copied().unwrap_or_default();
                pb::SubsystemCounters {
                    subsystem: format!("subsystems/{id}"),
                    connections: s.connections,
                    read_ops: s.read_ops,
                    write_ops: s.write_ops,
                    read_bytes: s.read_bytes,
                    write_bytes: s.write_bytes,
                    errors: s.errors,
                    auth_succeeded: s.auth_succeeded,
                    auth_failed: s.auth_failed,
                    auth_rate_limited: s.auth_rate_limited,
                    auth_busy: s.auth_busy,
                    namespaces_unreachable: s.namespaces_unreachable,
                }
            })
            .collect(),
        flow_cache: Some(pb::FlowCacheCounters {
            lookups: c.flow_cache.lookups,
            hits: c.flow_cache.hits,
            rests: c.flow_cache.rests,
        }),
        nvmf_target: Some(c.nvmf_target.clone()),
        offload: c.offload.clone().map(|mut o| {
            o.tenants.retain(|t| keep(&t.tenant));
            for t in &mut o.tenants {
                t.tenant = format!("tenants/{}", t.tenant);
            }
            o
        }),
    }
}

/// A metric family fed from one field of a counter message: name, type, help, getter.
type Field<C> = (&'static str, &'static str, &'static str, fn(&C) -> u64);

/// A metric family fed from fields of one counter message: name, type,
/// help, and its samples, each with the value of its `reason` label (`None`
/// for a family of one unlabelled sample) and the field it reads.
type Family<C> = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(Option<&'static str>, fn(&C) -> u64)],
);

/// The NVMe/TCP target's own families on `/metrics`, one row per family,
/// one entry per sample: a counter the target adds to
/// [`pb::NvmfTargetCounters`] is exported by one more row (or, for a
/// further reason to close or refuse connections, one more entry).
/// The poll groups' gauge, one sample per group, is rendered apart.
const NVMF_TARGET_FAMILIES: [Family<pb::NvmfTargetCounters>; 16] = [
    (
        "dpu_nvmf_connections_accepted_total",
        "counter",
        "NVMe/TCP connections accepted.",
        &[(None, |c| c.connections_accepted)],
    ),
    (
        "dpu_nvmf_open_connections",
        "gauge",
        "NVMe/TCP connections open now, handshaking or connected.",
        &[(None, |c| c.open_connections)],
    ),
    (
        "dpu_endpoint_buffer_reserved_bytes",
        "gauge",
        "Socket buffer bytes the storage endpoints' reserves set aside.",
        &[(None, |c| c.endpoint_buffer_reserved_bytes)],
    ),
    (
        "dpu_endpoint_buffer_shared_bytes",
        "gauge",
        "Socket buffer bytes the storage endpoints hold beyond their reserves, out of storage.endpoint_buffer_memory.",
        &[(None, |c| c.endpoint_buffer_shared_bytes)],
    ),
    (
        "dpu_nvmf_backend_in_flight_bytes",
        "gauge",
        "Bytes of reads and writes in flight on RBD images and remote namespaces, out of storage.backend_in_flight_budget.",
        &[(None, |c| c.backend_in_flight_bytes)],
    ),
    (
        "dpu_nvmf_connections_refused_total",
        "counter",
        "NVMe/TCP connections refused (at accept, or at Connect for the host limit), by the limit they met.",
        &[
            (Some("max_connections"), |c| c.refused_max_connections),
            (Some("max_connections_per_host"), |c| {
                c.refused_max_connections_per_host
            }),
            (Some("max_connections_per_address"), |c| {
                c.refused_max_connections_per_address
            }),
        ],
    ),
    (
        "dpu_nvmf_connections_closed_total",
        "counter",
        "NVMe/TCP connections closed on a timeout, by timeout.",
        &[
            (Some("handshake_timeout"), |c| c.handshake_timeouts),
            (Some("pdu_timeout"), |c| c.pdu_timeouts),
            (Some("write_timeout"), |c| c.write_timeouts),
        ],
    ),
    (
        "dpu_nvmf_protocol_errors_total",
        "counter",
        "NVMe/TCP connections ended with a termination request for a protocol error.",
        &[(None, |c| c.protocol_errors)],
    ),
    (
        "dpu_nvmf_connects_refused_total",
        "counter",
        "Fabrics Connect commands refused.",
        &[(None, |c| c.connects_refused)],
    ),
    (
        "dpu_nvmf_keep_alive_timeouts_total",
        "counter",
        "Controllers ended by their keep-alive timeout.",
        &[(None, |c| c.keep_alive_timeouts)],
    ),
    (
        "dpu_nvmf_write_buffer_waits_total",
        "counter",
        "Writes whose data waited for write buffer budget before it was asked for.",
        &[(None, |c| c.write_buffer_waits)],
    ),
    (
        "dpu_nvmf_controllers_revoked_total",
        "counter",
        "Controllers ended because their host or listener was revoked.",
        &[(None, |c| c.controllers_revoked)],
    ),
    (
        "dpu_nvmf_idle_timeouts_total",
        "counter",
        "Controllers without Keep Alive ended for going idle too long.",
        &[(None, |c| c.idle_timeouts)],
    ),
    (
        "dpu_nvmf_tls_handshakes_total",
        "counter",
        "Secure-channel (TLS 1.3 PSK) handshakes completed.",
        &[(None, |c| c.tls_handshakes)],
    ),
    (
        "dpu_nvmf_tls_refused_total",
        "counter",
        "Connections refused or closed before or in the TLS handshake, by reason: no key for the identity, a failed handshake, the handshake timeout, too many handshakes at once, clear text on a listener that requires TLS.",
        &[
            (Some("unknown_key"), |c| c.tls_refused_unknown_key),
            (Some("failed"), |c| c.tls_failed),
            (Some("timeout"), |c| c.tls_timeouts),
            (Some("busy"), |c| c.tls_busy),
            (Some("clear_text"), |c| c.tls_clear_text_refused),
        ],
    ),
    (
        "dpu_nvmf_tls_connects_refused_total",
        "counter",
        "Fabrics Connect commands refused for the secure channel, by reason: a host required to use TLS came in clear text, or its Connect named another host or subsystem than its TLS identity.",
        &[
            (Some("without_tls"), |c| c.connects_without_tls),
            (Some("identity_mismatch"), |c| c.connects_identity_mismatch),
        ],
    ),
];

/// The ID part of a resource name (`"ports/p0"` → `"p0"`).
fn strip(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn rule_labels(name: &str) -> [(&str, &str); 2] {
    let mut parts = name.split('/');
    let tenant = parts.nth(1).unwrap_or("");
    let rule = parts.nth(1).unwrap_or("");
    [("tenant", tenant), ("rule", rule)]
}

#[derive(Default)]
struct Metrics {
    out: String,
}

impl Metrics {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One family per field, one sample per row labelled `label="{row id}"`.
    fn fields<C>(&mut self, fields: &[Field<C>], label: &str, rows: &[(&str, &C)]) {
        for (name, kind, help, get) in fields {
            self.family(name, kind, help);
            for (id, c) in rows {
                self.sample(name, &[(label, id)], get(c));
            }
        }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"");
                for ch in v.chars() {
                    match ch {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, PortRole, PortSpec, RuleSet, Tenant};

    struct Fixed;
    impl CounterSource for Fixed {
        fn collect(&self, out: &mut Counters) {
            out.ports.entry("p0".into()).or_default().rx_packets += 5;
            *out.drops.entry(pb::DropReason::AclDeny).or_default() += 3;
            out.tenants.entry("a".into()).or_default().forwarded_packets += 2;
            out.flow_cache.lookups += 100;
            out.flow_cache.hits += 90;
            out.flow_cache.rests += 1;
            let t = &mut out.nvmf_target;
            t.connections_accepted += 20;
            t.open_connections += 3;
            t.protocol_errors += 1;
            t.connects_refused += 2;
            t.keep_alive_timeouts += 4;
            t.handshake_timeouts += 5;
            t.pdu_timeouts += 6;
            t.write_timeouts += 7;
            t.refused_max_connections += 8;
            t.refused_max_connections_per_address += 9;
            t.write_buffer_waits += 10;
            t.controllers_revoked += 11;
            t.idle_timeouts += 12;
            t.refused_max_connections_per_host += 13;
            t.endpoint_buffer_reserved_bytes += 14;
            t.endpoint_buffer_shared_bytes += 15;
            t.backend_in_flight_bytes += 16;
            t.tls_handshakes += 17;
            t.tls_refused_unknown_key += 18;
            t.tls_failed += 19;
            t.tls_timeouts += 20;
            t.tls_busy += 21;
            t.tls_clear_text_refused += 22;
            t.connects_without_tls += 23;
            t.connects_identity_mismatch += 24;
            t.poll_group_queues.resize(2, 0);
            t.poll_group_queues[0] += 2;
            let q = out
                .qos
                .entry(("vol".into(), QosScope::Host("nqn.h".into())))
                .or_default();
            q.limits.iops = 100;
            q.throttled_commands += 4;
        }
    }

    fn fixture() -> (State, PortRegistry) {
        let mut s = State::default();
        for id in ["a", "b"] {
            s.tenants.insert(
                id.into(),
                Tenant {
                    id: id.into(),
                    display_name: "quote\" and \\ here".into(),
                    attachments: vec![],
                    default_policy: Action::Deny,
                    create_time: Timestamp::now(),
                    rules: RuleSet::default(),
                    storage_qos: Default::default(),
                    vlan_id: 0,
                    no_offload: false,
                },
            );
        }
        let ports = [(
            "p0".to_string(),
            PortSpec {
                id: "p0".into(),
                driver: "x".into(),
                device: String::new(),
                role: PortRole::Uplink,
                vtep_address: None,
            },
        )]
        .into_iter()
        .collect();
        (s, ports)
    }

    #[test]
    fn drop_reasons_are_the_contracts_with_their_metric_labels() {
        let labels: Vec<String> = drop_reasons().map(drop_label).collect();
        assert_eq!(
            labels,
            [
                "no_tenant",
                "spoofed",
                "acl_deny",
                "conntrack_invalid",
                "table_full",
                "rate_limited",
                "malformed",
                "tx_full",
                "fragment_invalid",
                "fragment_unknown",
                "fragment_table_full",
                "unknown_vtep",
                "mac_limit",
                "encapsulated",
                "endpoint_full"
            ]
        );
    }

    #[test]
    fn snapshot_lists_everything_and_sums_sources() {
        let (state, ports) = fixture();
        let t = Telemetry::default();
        t.register(Arc::new(Fixed));
        t.register(Arc::new(Fixed));
        let snap = t.snapshot(&state, &ports, None);
        assert_eq!(snap.ports[0].counters.as_ref().unwrap().rx_packets, 10);
        assert_eq!(snap.tenants.len(), 2);
        assert_eq!(snap.drops.len(), drop_reasons().count());
        assert_eq!(drop_reasons().count(), 15);
        assert_eq!(snap.drops[2].packets, 6);
        assert_eq!(
            snap.flow_cache,
            Some(pb::FlowCacheCounters {
                lookups: 200,
                hits: 180,
                rests: 2
            })
        );
        assert_eq!(
            snap.nvmf_target,
            Some(pb::NvmfTargetCounters {
                connections_accepted: 40,
                open_connections: 6,
                protocol_errors: 2,
                connects_refused: 4,
                keep_alive_timeouts: 8,
                handshake_timeouts: 10,
                pdu_timeouts: 12,
                write_timeouts: 14,
                refused_max_connections: 16,
                refused_max_connections_per_address: 18,
                write_buffer_waits: 20,
                poll_group_queues: vec![4, 0],
                controllers_revoked: 22,
                idle_timeouts: 24,
                refused_max_connections_per_host: 26,
                endpoint_buffer_reserved_bytes: 28,
                endpoint_buffer_shared_bytes: 30,
                backend_in_flight_bytes: 32,
                tls_handshakes: 34,
                tls_refused_unknown_key: 36,
                tls_failed: 38,
                tls_timeouts: 40,
                tls_busy: 42,
                tls_clear_text_refused: 44,
                connects_without_tls: 46,
                connects_identity_mismatch: 48,
            })
        );
        let only_b = t.snapshot(&state, &ports, Some("b"));
        assert_eq!(only_b.tenants.len(), 1);
        assert_eq!(only_b.tenants[0].forwarded_packets, 0);
    }

    #[test]
    fn prometheus_text() {
        let (state, ports) = fixture();
        let t = Telemetry::default();
        t.register(Arc::new(Fixed));
        t.observe_request("/dpu.v1.TenantService/CreateTenant", tonic::Code::Ok);
        t.observe_request("/dpu.v1.TenantService/CreateTenant", tonic::Code::Ok);
        t.observe_denied("/dpu.v1.TenantService/DeleteTenant", "cn:mon");
        t.observe_denied("/dpu.v1.TenantService/DeleteTenant", "cn:mon");
        t.observe_denied("other", "unknown");
        let text = t.render_prometheus(&state, &ports);
        assert!(
            text.contains("dpu_port_rx_packets_total{port=\"p0\"} 5\n"),
            "{text}"
        );
        assert!(text.contains("dpu_dropped_packets_total{reason=\"acl_deny\"} 3\n"));
        assert!(text.contains("dpu_tenants 2\n"));
        assert!(
            text.contains("dpu_flow_cache_lookups_total 100\n"),
            "{text}"
        );
        assert!(text.contains("dpu_flow_cache_hits_total 90\n"));
        assert!(text.contains("dpu_flow_cache_rests_total 1\n"));
        assert!(text.contains(
            "dpu_grpc_requests_total{method=\"/dpu.v1.TenantService/CreateTenant\",code=\"Ok\"} 2\n"
        ));
        assert!(text.contains(
            "dpu_grpc_denied_total{method=\"/dpu.v1.TenantService/DeleteTenant\",client=\"cn:mon\"} 2\n"
        ), "{text}");
        assert!(text.contains("dpu_grpc_denied_total{method=\"other\",client=\"unknown\"} 1\n"));
        let target = "\
# HELP dpu_nvmf_connections_accepted_total NVMe/TCP connections accepted.
# TYPE dpu_nvmf_connections_accepted_total counter
dpu_nvmf_connections_accepted_total 20
# HELP dpu_nvmf_open_connections NVMe/TCP connections open now, handshaking or connected.
# TYPE dpu_nvmf_open_connections gauge
dpu_nvmf_open_connections 3
# HELP dpu_endpoint_buffer_reserved_bytes Socket buffer bytes the storage endpoints' reserves set aside.
# TYPE dpu_endpoint_buffer_reserved_bytes gauge
dpu_endpoint_buffer_reserved_bytes 14
# HELP dpu_endpoint_buffer_shared_bytes Socket buffer bytes the storage endpoints hold beyond their reserves, out of storage.endpoint_buffer_memory.
# TYPE dpu_endpoint_buffer_shared_bytes gauge
dpu_endpoint_buffer_shared_bytes 15
# HELP dpu_nvmf_backend_in_flight_bytes Bytes of reads and writes in flight on RBD images and remote namespaces, out of storage.backend_in_flight_budget.
# TYPE dpu_nvmf_backend_in_flight_bytes gauge
dpu_nvmf_backend_in_flight_bytes 16
# HELP dpu_nvmf_connections_refused_total NVMe/TCP connections refused (at accept, or at Connect for the host limit), by the limit they met.
# TYPE dpu_nvmf_connections_refused_total counter
dpu_nvmf_connections_refused_total{reason=\"max_connections\"} 8
dpu_nvmf_connections_refused_total{reason=\"max_connections_per_host\"} 13
dpu_nvmf_connections_refused_total{reason=\"max_connections_per_address\"} 9
# HELP dpu_nvmf_connections_closed_total NVMe/TCP connections closed on a timeout, by timeout.
# TYPE dpu_nvmf_connections_closed_total counter
dpu_nvmf_connections_closed_total{reason=\"handshake_timeout\"} 5
dpu_nvmf_connections_closed_total{reason=\"pdu_timeout\"} 6
dpu_nvmf_connections_closed_total{reason=\"write_timeout\"} 7
# HELP dpu_nvmf_protocol_errors_total NVMe/TCP connections ended with a termination request for a protocol error.
# TYPE dpu_nvmf_protocol_errors_total counter
dpu_nvmf_protocol_errors_total 1
# HELP dpu_nvmf_connects_refused_total Fabrics Connect commands refused.
# TYPE dpu_nvmf_connects_refused_total counter
dpu_nvmf_connects_refused_total 2
# HELP dpu_nvmf_keep_alive_timeouts_total Controllers ended by their keep-alive timeout.
# TYPE dpu_nvmf_keep_alive_timeouts_total counter
dpu_nvmf_keep_alive_timeouts_total 4
# HELP dpu_nvmf_write_buffer_waits_total Writes whose data waited for write buffer budget before it was asked for.
# TYPE dpu_nvmf_write_buffer_waits_total counter
dpu_nvmf_write_buffer_waits_total 10
# HELP dpu_nvmf_controllers_revoked_total Controllers ended because their host or listener was revoked.
# TYPE dpu_nvmf_controllers_revoked_total counter
dpu_nvmf_controllers_revoked_total 11
# HELP dpu_nvmf_idle_timeouts_total Controllers without Keep Alive ended for going idle too long.
# TYPE dpu_nvmf_idle_timeouts_total counter
dpu_nvmf_idle_timeouts_total 12
# HELP dpu_nvmf_tls_handshakes_total Secure-channel (TLS 1.3 PSK) handshakes completed.
# TYPE dpu_nvmf_tls_handshakes_total counter
dpu_nvmf_tls_handshakes_total 17
# HELP dpu_nvmf_tls_refused_total Connections refused or closed before or in the TLS handshake, by reason: no key for the identity, a failed handshake, the handshake timeout, too many handshakes at once, clear text on a listener that requires TLS.
# TYPE dpu_nvmf_tls_refused_total counter
dpu_nvmf_tls_refused_total{reason=\"unknown_key\"} 18
dpu_nvmf_tls_refused_total{reason=\"failed\"} 19
dpu_nvmf_tls_refused_total{reason=\"timeout\"} 20
dpu_nvmf_tls_refused_total{reason=\"busy\"} 21
dpu_nvmf_tls_refused_total{reason=\"clear_text\"} 22
# HELP dpu_nvmf_tls_connects_refused_total Fabrics Connect commands refused for the secure channel, by reason: a host required to use TLS came in clear text, or its Connect named another host or subsystem than its TLS identity.
# TYPE dpu_nvmf_tls_connects_refused_total counter
dpu_nvmf_tls_connects_refused_total{reason=\"without_tls\"} 23
dpu_nvmf_tls_connects_refused_total{reason=\"identity_mismatch\"} 24
# HELP dpu_nvmf_poll_group_queues I/O queues the NVMe/TCP poll group serves now.
# TYPE dpu_nvmf_poll_group_queues gauge
dpu_nvmf_poll_group_queues{group=\"0\"} 2
dpu_nvmf_poll_group_queues{group=\"1\"} 0
";
        assert!(text.contains(target), "{text}");
        assert!(
            text.contains(
                "dpu_nvmf_qos_limit{subsystem=\"vol\",host=\"nqn.h\",limit=\"iops\"} 100\n"
            ) && text.contains(
                "dpu_nvmf_qos_throttled_commands_total{subsystem=\"vol\",host=\"nqn.h\"} 4\n"
            ),
            "{text}"
        );
        // Every sample line belongs to a family announced before it.
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(typed.contains(name), "{line}");
            }
        }
    }

    /// Authentication counts of a subsystem reach the snapshot and
    /// `/metrics`, one sample per result.
    #[test]
    fn subsystem_auth_counts() {
        struct Auth;
        impl CounterSource for Auth {
            fn collect(&self, out: &mut Counters) {
                let c = out.subsystems.entry("vol".into()).or_default();
                c.auth_succeeded += 4;
                c.auth_failed += 3;
            }
        }
        let (mut state, ports) = fixture();
        state.subsystems.insert(
            "vol".into(),
            crate::model::Subsystem {
                id: "vol".into(),
                nqn: "nqn.2024-01.io.example:vol".into(),
                serial_number: "s".into(),
                model_number: "m".into(),
                allow_any_host: true,
                allowed_hosts: Default::default(),
                max_namespaces: 1,
                create_time: Timestamp::now(),
                namespaces: BTreeMap::new(),
                listeners: BTreeMap::new(),
                auth_requirement: Default::default(),
                host_auth: BTreeMap::new(),
                host_qos: Default::default(),
                tls_requirement: Default::default(),
                host_tls: Default::default(),
            },
        );
        let t = Telemetry::default();
        t.register(Arc::new(Auth));
        let snap = t.snapshot(&state, &ports, None);
        assert_eq!(
            (
                snap.subsystems[0].auth_succeeded,
                snap.subsystems[0].auth_failed
            ),
            (4, 3)
        );
        let text = t.render_prometheus(&state, &ports);
        assert!(
            text.contains(
                "# TYPE dpu_nvmf_auth_total counter\n\
                 dpu_nvmf_auth_total{subsystem=\"vol\",result=\"succeeded\"} 4\n\
                 dpu_nvmf_auth_total{subsystem=\"vol\",result=\"failed\"} 3\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut m = Metrics::default();
        m.sample("x", &[("l", "a\"b\\c\nd")], 1);
        assert_eq!(m.out, "x{l=\"a\\\"b\\\\c\\nd\"} 1\n");
    }
}

//! `dpuctl`: the command-line client of dpu-service.
//!
//! Every RPC of `dpu.v1` is a subcommand. Output is a table for people, or
//! the canonical proto3 JSON with `--output json`. Exit codes:
//! 0 success, 1 other error, 2 usage error, 3 NOT_FOUND, 4 ALREADY_EXISTS,
//! 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION/ABORTED, 7 unreachable,
//! 8 timeout, 9 UNAUTHENTICATED/PERMISSION_DENIED.

#![forbid(unsafe_code)]

mod render;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use dpu_client::{
    exit_code, listener_name, namespace_name, parse_size, pb, port_name, rule_name, subsystem_name,
    tenant_name, ClientConfig, ClientError, DpuClient, TlsConfig,
};
use dpu_proto::pbjson_types::FieldMask;
use serde_json::Value;

const EXIT_CODES: &str = "Exit codes: 0 success, 1 other error, 2 usage error, 3 NOT_FOUND, \
4 ALREADY_EXISTS, 5 INVALID_ARGUMENT, 6 FAILED_PRECONDITION or ABORTED, 7 service unreachable, \
8 timeout, 9 UNAUTHENTICATED or PERMISSION_DENIED.";

#[derive(Debug, Parser)]
#[command(name = "dpuctl", version, about = "Command-line client of dpu-service (gRPC API dpu.v1).", after_help = EXIT_CODES)]
struct Cli {
    /// Service endpoint.
    #[arg(
        long,
        env = "DPU_ENDPOINT",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    endpoint: String,
    /// PEM CA bundle to verify the server (enables TLS).
    #[arg(long, env = "DPU_CA_CERT", global = true)]
    ca_cert: Option<PathBuf>,
    /// PEM client certificate (mutual TLS).
    #[arg(long, env = "DPU_CERT", global = true)]
    cert: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long, env = "DPU_KEY", global = true)]
    key: Option<PathBuf>,
    /// Server name to verify, if not the endpoint's host.
    #[arg(long, global = true)]
    tls_server_name: Option<String>,
    /// Seconds to wait for each call.
    #[arg(long, default_value_t = 10, global = true)]
    timeout: u64,
    /// Output format.
    #[arg(long, short, env = "DPU_OUTPUT", value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Version, build and capabilities of the service.
    Info,
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Data-plane ports.
    #[command(subcommand)]
    Port(PortCmd),
    /// Filter rules of a tenant.
    #[command(subcommand)]
    Rule(RuleCmd),
    /// NVMe-oF subsystems.
    #[command(subcommand)]
    Subsystem(SubsystemCmd),
    /// Namespaces of a subsystem.
    #[command(subcommand)]
    Namespace(NamespaceCmd),
    /// Listeners of a subsystem.
    #[command(subcommand)]
    Listener(ListenerCmd),
    /// A snapshot of all counters.
    Counters {
        /// Only this tenant's tenant and rule counters.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Streams counter snapshots.
    Watch {
        /// Only this tenant's tenant and rule counters.
        #[arg(long)]
        tenant: Option<String>,
        /// Milliseconds between snapshots.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u32,
        /// Stop after this many snapshots.
        #[arg(long)]
        count: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Policy {
    Allow,
    Deny,
}

#[derive(Debug, Args)]
struct TenantFields {
    /// Human-readable name.
    #[arg(long)]
    display_name: Option<String>,
    /// Verdict for packets no rule matches.
    #[arg(long, value_enum)]
    default_policy: Option<Policy>,
    /// Attach a port, or one VLAN of it: PORT or PORT.VLAN (repeatable).
    #[arg(long = "port")]
    ports: Vec<String>,
    /// Attach a VXLAN network on an uplink: UPLINK:VNI (repeatable).
    #[arg(long = "vxlan")]
    vxlans: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum TenantCmd {
    /// Creates a tenant.
    Create {
        /// Tenant ID.
        id: String,
        #[command(flatten)]
        fields: TenantFields,
    },
    /// Shows a tenant.
    Get {
        /// Tenant ID.
        id: String,
    },
    /// Lists tenants.
    List,
    /// Changes a tenant; only the fields given change.
    Update {
        /// Tenant ID.
        id: String,
        #[command(flatten)]
        fields: TenantFields,
        /// Remove every attachment (with --port/--vxlan: replace them).
        #[arg(long)]
        clear_attachments: bool,
    },
    /// Deletes a tenant.
    Delete {
        /// Tenant ID.
        id: String,
        /// Also delete its rules and release its attachments.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
enum PortCmd {
    /// Lists ports.
    List,
    /// Shows a port.
    Get {
        /// Port ID.
        id: String,
    },
    /// Attaches a port (or a VLAN of it) to a tenant.
    Attach {
        /// Port ID.
        port: String,
        /// Tenant ID.
        #[arg(long)]
        tenant: String,
        /// VLAN ID (0 or absent: the whole port).
        #[arg(long, default_value_t = 0)]
        vlan: u32,
    },
    /// Detaches a port (or a VLAN of it) from its tenant.
    Detach {
        /// Port ID.
        port: String,
        /// VLAN ID (0 or absent: the whole port).
        #[arg(long, default_value_t = 0)]
        vlan: u32,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RuleAction {
    Allow,
    Deny,
}

#[derive(Debug, Subcommand)]
enum RuleCmd {
    /// Adds a rule.
    Add {
        /// Tenant ID.
        tenant: String,
        /// Rule ID (assigned by the service if absent).
        #[arg(long)]
        id: Option<String>,
        /// Evaluation order, lower first.
        #[arg(long)]
        priority: u32,
        /// What a match does.
        #[arg(long, value_enum)]
        action: RuleAction,
        /// Source prefix (CIDR).
        #[arg(long)]
        src: Option<String>,
        /// Destination prefix (CIDR).
        #[arg(long)]
        dst: Option<String>,
        /// Source ports: PORT or FIRST-LAST.
        #[arg(long)]
        sport: Option<String>,
        /// Destination ports: PORT or FIRST-LAST.
        #[arg(long)]
        dport: Option<String>,
        /// IP protocol: tcp, udp, icmp, icmpv6, sctp or a number.
        #[arg(long)]
        proto: Option<String>,
        /// ICMP type.
        #[arg(long)]
        icmp_type: Option<u32>,
        /// ICMP code.
        #[arg(long)]
        icmp_code: Option<u32>,
        /// Track connections so replies pass (allow rules only).
        #[arg(long)]
        stateful: bool,
        /// Free-form description.
        #[arg(long, default_value = "")]
        description: String,
        /// Refuse unless the rule set is at this version.
        #[arg(long)]
        expect_version: Option<u64>,
    },
    /// Shows a rule.
    Get {
        /// Tenant ID.
        tenant: String,
        /// Rule ID.
        rule: String,
    },
    /// Deletes a rule.
    Delete {
        /// Tenant ID.
        tenant: String,
        /// Rule ID.
        rule: String,
        /// Refuse unless the rule set is at this version.
        #[arg(long)]
        expect_version: Option<u64>,
    },
    /// Lists a tenant's rules in evaluation order.
    List {
        /// Tenant ID.
        tenant: String,
    },
    /// Replaces a tenant's whole rule set from a JSON file.
    Replace {
        /// Tenant ID.
        tenant: String,
        /// JSON array of FilterRule objects (proto3 JSON); "-" reads stdin.
        #[arg(long)]
        file: PathBuf,
        /// Refuse unless the rule set is at this version.
        #[arg(long)]
        expect_version: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
enum SubsystemCmd {
    /// Creates a subsystem.
    Create {
        /// Subsystem ID.
        id: String,
        /// NVMe Qualified Name.
        #[arg(long)]
        nqn: String,
        /// Serial number (generated if absent).
        #[arg(long)]
        serial: Option<String>,
        /// Model number.
        #[arg(long)]
        model: Option<String>,
        /// Let any host connect.
        #[arg(long)]
        allow_any_host: bool,
        /// Allowed host NQN (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Largest namespace ID.
        #[arg(long)]
        max_namespaces: Option<u32>,
    },
    /// Shows a subsystem.
    Get {
        /// Subsystem ID.
        id: String,
    },
    /// Lists subsystems.
    List,
    /// Changes a subsystem; only the fields given change.
    Update {
        /// Subsystem ID.
        id: String,
        /// Let any host connect (true/false).
        #[arg(long)]
        allow_any_host: Option<bool>,
        /// Model number.
        #[arg(long)]
        model: Option<String>,
        /// Replace the allow list with these hosts (repeatable).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// Empty the allow list.
        #[arg(long)]
        clear_hosts: bool,
    },
    /// Deletes a subsystem.
    Delete {
        /// Subsystem ID.
        id: String,
        /// Also delete its namespaces and listeners.
        #[arg(long)]
        force: bool,
    },
    /// Allows a host NQN.
    AddHost {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
    },
    /// Removes a host NQN from the allow list.
    RemoveHost {
        /// Subsystem ID.
        id: String,
        /// Host NQN.
        nqn: String,
    },
}

#[derive(Debug, Subcommand)]
enum NamespaceCmd {
    /// Creates a namespace.
    Create {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID (lowest free if absent).
        #[arg(long)]
        nsid: Option<u32>,
        /// Memory-backed, of this size (e.g. 256M).
        #[arg(long, group = "backend", value_parser = parse_size)]
        ram: Option<u64>,
        /// File-backed, at this absolute path.
        #[arg(long, group = "backend")]
        file: Option<String>,
        /// Size of a file backend (default: the existing file's size).
        #[arg(long, value_parser = parse_size, requires = "file")]
        size: Option<u64>,
        /// Block-device-backed, at this path.
        #[arg(long, group = "backend")]
        block_device: Option<String>,
        /// Logical block size, 512 or 4096.
        #[arg(long)]
        block_size: Option<u32>,
        /// Namespace UUID (generated if absent).
        #[arg(long)]
        uuid: Option<String>,
    },
    /// Shows a namespace.
    Get {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
    },
    /// Lists a subsystem's namespaces.
    List {
        /// Subsystem ID.
        subsystem: String,
    },
    /// Resizes a RAM- or file-backed namespace.
    Resize {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
        /// New size (e.g. 1G).
        #[arg(value_parser = parse_size)]
        size: u64,
    },
    /// Deletes a namespace.
    Delete {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
    },
}

#[derive(Debug, Subcommand)]
enum ListenerCmd {
    /// Creates a listener.
    Create {
        /// Subsystem ID.
        subsystem: String,
        /// IP address to listen on.
        #[arg(long)]
        address: String,
        /// TCP port (default 4420).
        #[arg(long)]
        port: Option<u32>,
        /// Listener ID (derived from address and port if absent).
        #[arg(long)]
        id: Option<String>,
    },
    /// Lists a subsystem's listeners.
    List {
        /// Subsystem ID.
        subsystem: String,
    },
    /// Deletes a listener.
    Delete {
        /// Subsystem ID.
        subsystem: String,
        /// Listener ID.
        id: String,
    },
}

/// A failure of the command: from the service, or from the user's input.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("INVALID_ARGUMENT: {0}")]
    Input(String),
    #[error("{0}")]
    Other(String),
}

impl Failure {
    fn exit(&self) -> u8 {
        match self {
            Failure::Client(e) => exit_code(e),
            Failure::Input(_) => 5,
            Failure::Other(_) => 1,
        }
    }
}

/// What a command prints: JSON for machines, text for people.
struct Shown {
    json: Value,
    text: String,
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dpuctl: error: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dpuctl: error: {e}");
            ExitCode::from(e.exit())
        }
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Other(format!("reading {}: {e}", path.display())))
}

async fn connect(cli: &Cli) -> Result<DpuClient, Failure> {
    let tls = if cli.ca_cert.is_some() || cli.cert.is_some() || cli.endpoint.starts_with("https:") {
        Some(TlsConfig {
            ca_cert_pem: cli.ca_cert.as_ref().map(read).transpose()?,
            client_cert_pem: cli.cert.as_ref().map(read).transpose()?,
            client_key_pem: cli.key.as_ref().map(read).transpose()?,
            server_name: cli.tls_server_name.clone(),
        })
    } else {
        None
    };
    let timeout = Duration::from_secs(cli.timeout.max(1));
    let cfg = ClientConfig {
        endpoint: cli.endpoint.clone(),
        tls,
        timeout,
        connect_timeout: timeout,
        ..ClientConfig::default()
    };
    Ok(DpuClient::connect(cfg).await?)
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    let client = connect(cli).await?;
    if let Command::Watch {
        tenant,
        interval_ms,
        count,
    } = &cli.command
    {
        return watch(&client, cli.output, tenant.as_deref(), *interval_ms, *count).await;
    }
    let shown = execute(&client, &cli.command).await?;
    match cli.output {
        Format::Json => {
            let s = serde_json::to_string_pretty(&shown.json)
                .map_err(|e| Failure::Other(e.to_string()))?;
            println!("{s}");
        }
        Format::Table => print!("{}", shown.text),
    }
    Ok(())
}

async fn watch(
    client: &DpuClient,
    format: Format,
    tenant: Option<&str>,
    interval_ms: u32,
    count: Option<u64>,
) -> Result<(), Failure> {
    let req = pb::WatchCountersRequest {
        tenant: tenant.map(tenant_name).unwrap_or_default(),
        interval_ms,
    };
    let mut stream = client.watch_counters(req).await?;
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        let Some(snap) = stream.message().await.map_err(ClientError::from)? else {
            break;
        };
        seen += 1;
        match format {
            Format::Json => println!(
                "{}",
                serde_json::to_string(&snap).map_err(|e| Failure::Other(e.to_string()))?
            ),
            Format::Table => println!("{}", render::counters(&snap)),
        }
    }
    Ok(())
}

fn attachments(f: &TenantFields) -> Result<Vec<pb::Attachment>, Failure> {
    let mut out = Vec::new();
    for p in &f.ports {
        let (port, vlan) = match p.rsplit_once('.') {
            Some((port, v)) => {
                let vlan = v.parse().map_err(|_| {
                    Failure::Input(format!("--port {p:?}: VLAN {v:?} is not a number"))
                })?;
                (port, vlan)
            }
            None => (p.as_str(), 0),
        };
        out.push(pb::Attachment {
            kind: Some(pb::attachment::Kind::Port(pb::PortAttachment {
                port: port_name(port),
                vlan_id: vlan,
            })),
        });
    }
    for v in &f.vxlans {
        let (uplink, vni) = v
            .split_once(':')
            .ok_or_else(|| Failure::Input(format!("--vxlan {v:?}: expected UPLINK:VNI")))?;
        let vni = vni
            .parse()
            .map_err(|_| Failure::Input(format!("--vxlan {v:?}: VNI {vni:?} is not a number")))?;
        out.push(pb::Attachment {
            kind: Some(pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
                uplink: port_name(uplink),
                vni,
            })),
        });
    }
    Ok(out)
}

fn policy(p: Option<Policy>) -> i32 {
    match p {
        Some(Policy::Allow) => pb::DefaultPolicy::Allow as i32,
        Some(Policy::Deny) => pb::DefaultPolicy::Deny as i32,
        None => pb::DefaultPolicy::Unspecified as i32,
    }
}

fn port_range(flag: &str, s: Option<&str>) -> Result<Option<pb::PortRange>, Failure> {
    let Some(s) = s else { return Ok(None) };
    let num = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| Failure::Input(format!("{flag} {s:?}: {t:?} is not a port")))
    };
    let (first, last) = match s.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => (num(s)?, num(s)?),
    };
    Ok(Some(pb::PortRange { first, last }))
}

fn protocol(s: Option<&str>) -> Result<Option<u32>, Failure> {
    let Some(s) = s else { return Ok(None) };
    Ok(Some(match s.to_ascii_lowercase().as_str() {
        "icmp" => 1,
        "tcp" => 6,
        "udp" => 17,
        "icmpv6" | "ipv6-icmp" => 58,
        "sctp" => 132,
        n => n
            .parse()
            .map_err(|_| Failure::Input(format!("--proto {s:?}: not a protocol name or number")))?,
    }))
}

fn deleted(what: String) -> Shown {
    Shown {
        json: Value::Object(Default::default()),
        text: format!("deleted {what}\n"),
    }
}

fn version_line(json: Value, text: String, version: u64) -> Shown {
    Shown {
        json,
        text: format!("{text}rule set version {version}\n"),
    }
}

fn mask(paths: &[&str]) -> Option<FieldMask> {
    Some(FieldMask {
        paths: paths.iter().map(|p| p.to_string()).collect(),
    })
}

/// Follows page tokens until the end, collecting every item.
async fn all_pages<T, F, Fut>(mut page: F) -> Result<Vec<T>, Failure>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), ClientError>>,
{
    let mut items = Vec::new();
    let mut token = String::new();
    loop {
        let (mut got, next) = page(token).await?;
        items.append(&mut got);
        if next.is_empty() {
            return Ok(items);
        }
        token = next;
    }
}

async fn execute(c: &DpuClient, cmd: &Command) -> Result<Shown, Failure> {
    Ok(match cmd {
        Command::Info => {
            let i = c.get_service_info(pb::GetServiceInfoRequest {}).await?;
            Shown {
                json: json(&i),
                text: render::info(&i),
            }
        }
        Command::Counters { tenant } => {
            let s = c
                .get_counters(pb::GetCountersRequest {
                    tenant: tenant.as_deref().map(tenant_name).unwrap_or_default(),
                })
                .await?;
            Shown {
                json: json(&s),
                text: render::counters(&s),
            }
        }
        Command::Watch { .. } => unreachable_watch(),
        Command::Tenant(t) => tenant(c, t).await?,
        Command::Port(p) => port(c, p).await?,
        Command::Rule(r) => rule(c, r).await?,
        Command::Subsystem(s) => subsystem(c, s).await?,
        Command::Namespace(n) => namespace(c, n).await?,
        Command::Listener(l) => listener(c, l).await?,
    })
}

/// `watch` streams and is handled before `execute`.
fn unreachable_watch() -> Shown {
    Shown {
        json: Value::Null,
        text: String::new(),
    }
}

async fn tenant(c: &DpuClient, cmd: &TenantCmd) -> Result<Shown, Failure> {
    let one = |t: pb::Tenant| Shown {
        json: json(&t),
        text: render::tenants(std::slice::from_ref(&t)),
    };
    Ok(match cmd {
        TenantCmd::Create { id, fields } => {
            let t = pb::Tenant {
                display_name: fields.display_name.clone().unwrap_or_default(),
                attachments: attachments(fields)?,
                default_policy: policy(fields.default_policy),
                ..Default::default()
            };
            one(c
                .create_tenant(pb::CreateTenantRequest {
                    tenant_id: id.clone(),
                    tenant: Some(t),
                })
                .await?)
        }
        TenantCmd::Get { id } => one(c
            .get_tenant(pb::GetTenantRequest {
                name: tenant_name(id),
            })
            .await?),
        TenantCmd::List => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_tenants(pb::ListTenantsRequest {
                        page_size: 0,
                        page_token,
                    })
                    .await?;
                Ok((r.tenants, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::tenants(&all),
            }
        }
        TenantCmd::Update {
            id,
            fields,
            clear_attachments,
        } => {
            let mut paths = Vec::new();
            if fields.display_name.is_some() {
                paths.push("display_name");
            }
            if fields.default_policy.is_some() {
                paths.push("default_policy");
            }
            if *clear_attachments || !fields.ports.is_empty() || !fields.vxlans.is_empty() {
                paths.push("attachments");
            }
            if paths.is_empty() {
                return Err(Failure::Input(
                    "nothing to update: give --display-name, --default-policy, --port, --vxlan or --clear-attachments".into(),
                ));
            }
            let t = pb::Tenant {
                name: tenant_name(id),
                display_name: fields.display_name.clone().unwrap_or_default(),
                attachments: attachments(fields)?,
                default_policy: policy(fields.default_policy),
                ..Default::default()
            };
            one(c
                .update_tenant(pb::UpdateTenantRequest {
                    tenant: Some(t),
                    update_mask: mask(&paths),
                })
                .await?)
        }
        TenantCmd::Delete { id, force } => {
            c.delete_tenant(pb::DeleteTenantRequest {
                name: tenant_name(id),
                force: *force,
            })
            .await?;
            deleted(tenant_name(id))
        }
    })
}

async fn port(c: &DpuClient, cmd: &PortCmd) -> Result<Shown, Failure> {
    Ok(match cmd {
        PortCmd::List => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_ports(pb::ListPortsRequest {
                        page_size: 0,
                        page_token,
                    })
                    .await?;
                Ok((r.ports, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::ports(&all),
            }
        }
        PortCmd::Get { id } => {
            let p = c
                .get_port(pb::GetPortRequest {
                    name: port_name(id),
                })
                .await?;
            Shown {
                json: json(&p),
                text: render::ports(std::slice::from_ref(&p)),
            }
        }
        PortCmd::Attach { port, tenant, vlan } => {
            let t = c
                .attach_port(pb::AttachPortRequest {
                    port: port_name(port),
                    vlan_id: *vlan,
                    tenant: tenant_name(tenant),
                })
                .await?;
            Shown {
                json: json(&t),
                text: render::tenants(std::slice::from_ref(&t)),
            }
        }
        PortCmd::Detach { port, vlan } => {
            let t = c
                .detach_port(pb::DetachPortRequest {
                    port: port_name(port),
                    vlan_id: *vlan,
                })
                .await?;
            Shown {
                json: json(&t),
                text: render::tenants(std::slice::from_ref(&t)),
            }
        }
    })
}

async fn rule(c: &DpuClient, cmd: &RuleCmd) -> Result<Shown, Failure> {
    Ok(match cmd {
        RuleCmd::Add {
            tenant,
            id,
            priority,
            action,
            src,
            dst,
            sport,
            dport,
            proto,
            icmp_type,
            icmp_code,
            stateful,
            description,
            expect_version,
        } => {
            let rule = pb::FilterRule {
                priority: *priority,
                src_prefix: src.clone().unwrap_or_default(),
                dst_prefix: dst.clone().unwrap_or_default(),
                src_ports: port_range("--sport", sport.as_deref())?,
                dst_ports: port_range("--dport", dport.as_deref())?,
                ip_protocol: protocol(proto.as_deref())?,
                icmp_type: *icmp_type,
                icmp_code: *icmp_code,
                action: match action {
                    RuleAction::Allow => pb::RuleAction::Allow as i32,
                    RuleAction::Deny => pb::RuleAction::Deny as i32,
                },
                stateful: *stateful,
                description: description.clone(),
                ..Default::default()
            };
            let r = c
                .add_rule(pb::AddRuleRequest {
                    parent: tenant_name(tenant),
                    rule_id: id.clone().unwrap_or_default(),
                    rule: Some(rule),
                    expected_version: *expect_version,
                })
                .await?;
            let rules: Vec<pb::FilterRule> = r.rule.clone().into_iter().collect();
            version_line(json(&r), render::rules(&rules), r.rule_set_version)
        }
        RuleCmd::Get { tenant, rule } => {
            let r = c
                .get_rule(pb::GetRuleRequest {
                    name: rule_name(tenant, rule),
                })
                .await?;
            Shown {
                json: json(&r),
                text: render::rules(std::slice::from_ref(&r)),
            }
        }
        RuleCmd::Delete {
            tenant,
            rule,
            expect_version,
        } => {
            let r = c
                .delete_rule(pb::DeleteRuleRequest {
                    name: rule_name(tenant, rule),
                    expected_version: *expect_version,
                })
                .await?;
            version_line(
                json(&r),
                format!("deleted {}\n", rule_name(tenant, rule)),
                r.rule_set_version,
            )
        }
        RuleCmd::List { tenant } => {
            let parent = tenant_name(tenant);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_rules(pb::ListRulesRequest {
                            parent,
                            page_size: 0,
                            page_token,
                        })
                        .await?;
                    Ok((r.rules, r.next_page_token))
                }
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::rules(&all),
            }
        }
        RuleCmd::Replace {
            tenant,
            file,
            expect_version,
        } => {
            let bytes = if file.as_os_str() == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                    .map_err(|e| Failure::Other(format!("reading stdin: {e}")))?;
                b
            } else {
                read(file)?
            };
            let rules: Vec<pb::FilterRule> = serde_json::from_slice(&bytes).map_err(|e| {
                Failure::Input(format!(
                    "{}: not a JSON array of FilterRule: {e}",
                    file.display()
                ))
            })?;
            let r = c
                .replace_rules(pb::ReplaceRulesRequest {
                    parent: tenant_name(tenant),
                    rules,
                    expected_version: *expect_version,
                })
                .await?;
            version_line(
                json(&r),
                format!(
                    "replaced the rules of {}: {} rules\n",
                    tenant_name(tenant),
                    r.rule_count
                ),
                r.rule_set_version,
            )
        }
    })
}

async fn subsystem(c: &DpuClient, cmd: &SubsystemCmd) -> Result<Shown, Failure> {
    let one = |s: pb::Subsystem| Shown {
        json: json(&s),
        text: render::subsystems(std::slice::from_ref(&s)),
    };
    Ok(match cmd {
        SubsystemCmd::Create {
            id,
            nqn,
            serial,
            model,
            allow_any_host,
            hosts,
            max_namespaces,
        } => {
            let s = pb::Subsystem {
                nqn: nqn.clone(),
                serial_number: serial.clone().unwrap_or_default(),
                model_number: model.clone().unwrap_or_default(),
                allow_any_host: *allow_any_host,
                allowed_hosts: hosts.clone(),
                max_namespaces: max_namespaces.unwrap_or(0),
                ..Default::default()
            };
            one(c
                .create_subsystem(pb::CreateSubsystemRequest {
                    subsystem_id: id.clone(),
                    subsystem: Some(s),
                })
                .await?)
        }
        SubsystemCmd::Get { id } => one(c
            .get_subsystem(pb::GetSubsystemRequest {
                name: subsystem_name(id),
            })
            .await?),
        SubsystemCmd::List => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_subsystems(pb::ListSubsystemsRequest {
                        page_size: 0,
                        page_token,
                    })
                    .await?;
                Ok((r.subsystems, r.next_page_token))
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::subsystems(&all),
            }
        }
        SubsystemCmd::Update {
            id,
            allow_any_host,
            model,
            hosts,
            clear_hosts,
        } => {
            let mut paths = Vec::new();
            if allow_any_host.is_some() {
                paths.push("allow_any_host");
            }
            if model.is_some() {
                paths.push("model_number");
            }
            if *clear_hosts || !hosts.is_empty() {
                paths.push("allowed_hosts");
            }
            if paths.is_empty() {
                return Err(Failure::Input(
                    "nothing to update: give --allow-any-host, --model, --host or --clear-hosts"
                        .into(),
                ));
            }
            let s = pb::Subsystem {
                name: subsystem_name(id),
                allow_any_host: allow_any_host.unwrap_or(false),
                model_number: model.clone().unwrap_or_default(),
                allowed_hosts: hosts.clone(),
                ..Default::default()
            };
            one(c
                .update_subsystem(pb::UpdateSubsystemRequest {
                    subsystem: Some(s),
                    update_mask: mask(&paths),
                })
                .await?)
        }
        SubsystemCmd::Delete { id, force } => {
            c.delete_subsystem(pb::DeleteSubsystemRequest {
                name: subsystem_name(id),
                force: *force,
            })
            .await?;
            deleted(subsystem_name(id))
        }
        SubsystemCmd::AddHost { id, nqn } => one(c
            .add_host(pb::AddHostRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
            })
            .await?),
        SubsystemCmd::RemoveHost { id, nqn } => one(c
            .remove_host(pb::RemoveHostRequest {
                subsystem: subsystem_name(id),
                host_nqn: nqn.clone(),
            })
            .await?),
    })
}

async fn namespace(c: &DpuClient, cmd: &NamespaceCmd) -> Result<Shown, Failure> {
    let one = |n: pb::Namespace| Shown {
        json: json(&n),
        text: render::namespaces(std::slice::from_ref(&n)),
    };
    Ok(match cmd {
        NamespaceCmd::Create {
            subsystem,
            nsid,
            ram,
            file,
            size,
            block_device,
            block_size,
            uuid,
        } => {
            let backend = match (ram, file, block_device) {
                (Some(size_bytes), _, _) => pb::namespace::Backend::Ram(pb::RamBackend {
                    size_bytes: *size_bytes,
                }),
                (_, Some(path), _) => pb::namespace::Backend::File(pb::FileBackend {
                    path: path.clone(),
                    size_bytes: size.unwrap_or(0),
                }),
                (_, _, Some(path)) => pb::namespace::Backend::BlockDevice(pb::BlockDeviceBackend {
                    path: path.clone(),
                }),
                _ => {
                    return Err(Failure::Input(
                        "give one of --ram SIZE, --file PATH, --block-device PATH".into(),
                    ))
                }
            };
            let n = pb::Namespace {
                nsid: nsid.unwrap_or(0),
                backend: Some(backend),
                block_size: block_size.unwrap_or(0),
                uuid: uuid.clone().unwrap_or_default(),
                ..Default::default()
            };
            one(c
                .create_namespace(pb::CreateNamespaceRequest {
                    parent: subsystem_name(subsystem),
                    namespace: Some(n),
                })
                .await?)
        }
        NamespaceCmd::Get { subsystem, nsid } => one(c
            .get_namespace(pb::GetNamespaceRequest {
                name: namespace_name(subsystem, *nsid),
            })
            .await?),
        NamespaceCmd::List { subsystem } => {
            let parent = subsystem_name(subsystem);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_namespaces(pb::ListNamespacesRequest {
                            parent,
                            page_size: 0,
                            page_token,
                        })
                        .await?;
                    Ok((r.namespaces, r.next_page_token))
                }
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::namespaces(&all),
            }
        }
        NamespaceCmd::Resize {
            subsystem,
            nsid,
            size,
        } => one(c
            .resize_namespace(pb::ResizeNamespaceRequest {
                name: namespace_name(subsystem, *nsid),
                size_bytes: *size,
            })
            .await?),
        NamespaceCmd::Delete { subsystem, nsid } => {
            c.delete_namespace(pb::DeleteNamespaceRequest {
                name: namespace_name(subsystem, *nsid),
            })
            .await?;
            deleted(namespace_name(subsystem, *nsid))
        }
    })
}

async fn listener(c: &DpuClient, cmd: &ListenerCmd) -> Result<Shown, Failure> {
    Ok(match cmd {
        ListenerCmd::Create {
            subsystem,
            address,
            port,
            id,
        } => {
            let l = pb::Listener {
                transport: pb::Transport::Tcp as i32,
                address: address.clone(),
                port: port.unwrap_or(0),
                ..Default::default()
            };
            let l = c
                .create_listener(pb::CreateListenerRequest {
                    parent: subsystem_name(subsystem),
                    listener_id: id.clone().unwrap_or_default(),
                    listener: Some(l),
                })
                .await?;
            Shown {
                json: json(&l),
                text: render::listeners(std::slice::from_ref(&l)),
            }
        }
        ListenerCmd::List { subsystem } => {
            let parent = subsystem_name(subsystem);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_listeners(pb::ListListenersRequest {
                            parent,
                            page_size: 0,
                            page_token,
                        })
                        .await?;
                    Ok((r.listeners, r.next_page_token))
                }
            })
            .await?;
            Shown {
                json: json(&all),
                text: render::listeners(&all),
            }
        }
        ListenerCmd::Delete { subsystem, id } => {
            c.delete_listener(pb::DeleteListenerRequest {
                name: listener_name(subsystem, id),
            })
            .await?;
            deleted(listener_name(subsystem, id))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_parse() {
        assert_eq!(
            port_range("--dport", Some("80-443")).unwrap(),
            Some(pb::PortRange {
                first: 80,
                last: 443
            })
        );
        assert_eq!(
            port_range("--dport", Some("22")).unwrap(),
            Some(pb::PortRange {
                first: 22,
                last: 22
            })
        );
        assert!(port_range("--dport", Some("x")).is_err());
        assert_eq!(protocol(Some("TCP")).unwrap(), Some(6));
        assert_eq!(protocol(Some("47")).unwrap(), Some(47));
        assert!(protocol(Some("gre")).is_err());
        let f = TenantFields {
            display_name: None,
            default_policy: None,
            ports: vec!["p0.100".into(), "pf0vf0".into()],
            vxlans: vec!["p0:5001".into()],
        };
        let a = attachments(&f).unwrap();
        assert_eq!(a.len(), 3);
        assert!(
            matches!(&a[0].kind, Some(pb::attachment::Kind::Port(p)) if p.port == "ports/p0" && p.vlan_id == 100)
        );
        assert!(matches!(&a[2].kind, Some(pb::attachment::Kind::Vxlan(v)) if v.vni == 5001));
        let bad = TenantFields {
            vxlans: vec!["p0".into()],
            ports: vec![],
            display_name: None,
            default_policy: None,
        };
        assert!(matches!(attachments(&bad), Err(Failure::Input(_))));
    }
}

//! `dpuctl`: the command-line client of dpu-service.
//!
//! Every RPC of `dpu.v1` is a subcommand. Output is a table for people, or
//! the canonical proto3 JSON with `--output json`. Exit codes are those of
//! [`dpu_client::exit_code`], plus 2 for a malformed command line and 5 for
//! a value `dpuctl` cannot parse (see [`EXIT_CODES`]).

#![forbid(unsafe_code)]

mod render;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use dpu_client::{
    code_name, exit_code, listener_name, namespace_name, parse_size, pb, port_name, rule_name,
    subsystem_name, tenant_name, ClientConfig, ClientError, DpuClient, ServingStatus, TlsConfig,
};
use dpu_proto::pbjson_types::FieldMask;
use dpu_proto::text::{port_attachment, port_range, protocol, rate_limit};
use serde_json::Value;

/// Exit codes, as `--help` shows them.
const EXIT_CODES: &str = "\
Resource IDs may be bare (blue) or full names (tenants/blue). List commands show every page.
Errors go to stderr as `dpuctl: error: CODE: message`.

Exit codes:
  0  success
  1  other error
  2  usage error (unknown command or flag, missing argument)
  3  NOT_FOUND
  4  ALREADY_EXISTS
  5  INVALID_ARGUMENT, also a value dpuctl cannot parse (SIZE, port range, number...)
  6  FAILED_PRECONDITION or ABORTED (e.g. a stale --expect-version)
  7  UNAVAILABLE: service unreachable
  8  DEADLINE_EXCEEDED: no answer within --timeout
  9  UNAUTHENTICATED or PERMISSION_DENIED";

/// Exit code of a value `dpuctl` cannot parse.
const EXIT_INVALID: u8 = 5;

#[derive(Debug, Parser)]
#[command(
    name = "dpuctl",
    version,
    about = "Command-line client of dpu-service (gRPC API dpu.v1).",
    after_long_help = EXIT_CODES
)]
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
    #[arg(long, env = "DPU_CERT", global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long, env = "DPU_KEY", global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// Server name to verify, if not the endpoint's host.
    #[arg(long, global = true)]
    tls_server_name: Option<String>,
    /// Seconds to wait for each call.
    #[arg(long, default_value_t = 10, global = true, value_parser = clap::value_parser!(u64).range(1..))]
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
    /// Asks the gRPC health service; exits non-zero unless SERVING (a
    /// container health check or a probe).
    Health {
        /// A service name such as "dpu.v1.StorageService"; empty: the server.
        #[arg(long, default_value = "")]
        service: String,
    },
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
    /// Attach a port, or one VLAN of it: PORT or PORT.VLAN (repeatable),
    /// optionally with anti-spoofing: `,mac=MAC` and `,ip=PREFIX` (each
    /// repeatable) list the only source MACs and IP prefixes it may send
    /// from, e.g. `pf0vf0,mac=02:00:00:00:00:01,ip=10.0.0.1/32`.
    #[arg(
        long = "port",
        value_name = "PORT[.VLAN][,mac=MAC][,ip=PREFIX]",
        value_parser = port_attachment
    )]
    ports: Vec<pb::Attachment>,
    /// Attach a VXLAN network on an uplink: UPLINK:VNI, or
    /// UPLINK:VNI:VTEP[,VTEP...] with the remote VTEPs that get its
    /// flooded frames (repeatable).
    #[arg(long = "vxlan", value_name = "UPLINK:VNI[:VTEPS]", value_parser = vxlan_attachment)]
    vxlans: Vec<pb::Attachment>,
}

/// Paging of a list command; every page is fetched either way.
#[derive(Debug, Args)]
struct Paging {
    /// Items per request (0: the service's default).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    page_size: i32,
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
    List(Paging),
    /// Changes a tenant; only the fields given change.
    #[command(group(
        ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["display_name", "default_policy", "ports", "vxlans", "clear_attachments"])
    ))]
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
    List(Paging),
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
        #[arg(long, value_name = "A[-B]", value_parser = port_range)]
        sport: Option<pb::PortRange>,
        /// Destination ports: PORT or FIRST-LAST.
        #[arg(long, value_name = "A[-B]", value_parser = port_range)]
        dport: Option<pb::PortRange>,
        /// IP protocol: tcp, udp, icmp, icmpv6, sctp or a number.
        #[arg(long, value_parser = protocol)]
        proto: Option<u32>,
        /// ICMP type.
        #[arg(long)]
        icmp_type: Option<u32>,
        /// ICMP code.
        #[arg(long)]
        icmp_code: Option<u32>,
        /// Track connections so replies pass (allow rules only).
        #[arg(long)]
        stateful: bool,
        /// Most traffic the rule lets through (allow rules only): packets
        /// or bits per second with an optional k/M/G/T prefix, e.g.
        /// `1000pps`, `2.5kpps`, `10Mbps`.
        #[arg(long, value_name = "RATE", value_parser = rate_limit)]
        rate_limit: Option<pb::RateLimit>,
        /// Depth of the rate limit's bucket: packets for a pps limit, bytes
        /// for a bps one (default a tenth of a second's worth).
        #[arg(long, requires = "rate_limit")]
        burst: Option<u64>,
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
        #[command(flatten)]
        paging: Paging,
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
    List(Paging),
    /// Changes a subsystem; only the fields given change.
    #[command(group(
        ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["allow_any_host", "model", "hosts", "clear_hosts"])
    ))]
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
    /// Creates a namespace backed by RAM, a file or a block device.
    #[command(group(ArgGroup::new("backend").required(true)))]
    Create {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID (lowest free if absent).
        #[arg(long)]
        nsid: Option<u32>,
        /// Memory-backed, of this size (e.g. 256M).
        #[arg(long, group = "backend", value_name = "SIZE", value_parser = parse_size)]
        ram: Option<u64>,
        /// File-backed, at this absolute path.
        #[arg(long, group = "backend", value_name = "PATH")]
        file: Option<String>,
        /// Size of a file backend (default: the existing file's size).
        #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "file")]
        size: Option<u64>,
        /// Block-device-backed, at this path.
        #[arg(long, group = "backend", value_name = "PATH")]
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
        #[command(flatten)]
        paging: Paging,
    },
    /// Resizes a RAM- or file-backed namespace.
    Resize {
        /// Subsystem ID.
        subsystem: String,
        /// Namespace ID.
        nsid: u32,
        /// New size (e.g. 1G).
        #[arg(value_name = "SIZE", value_parser = parse_size)]
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
        #[command(flatten)]
        paging: Paging,
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
    #[error("{}", client_message(.0))]
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
            Failure::Input(_) => EXIT_INVALID,
            Failure::Other(_) => 1,
        }
    }
}

/// `CODE: message`, also for failures the transport rather than the
/// service reported.
fn client_message(e: &ClientError) -> String {
    match (e, e.code()) {
        (ClientError::Status { .. }, _) | (_, None) => e.to_string(),
        (_, Some(code)) => format!("{}: {e}", code_name(code)),
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return bad_command_line(e),
    };
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

/// Reports a command line clap refused: a value that does not parse is
/// INVALID_ARGUMENT (exit 5), anything else a usage error (exit 2); `--help`
/// and `--version` print and succeed.
fn bad_command_line(e: clap::Error) -> ExitCode {
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        let code = e.exit_code();
        // Nothing sensible is left to do if the terminal is gone.
        let _ = e.print();
        return ExitCode::from(u8::try_from(code).unwrap_or(2));
    }
    let text = e.render().to_string();
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    eprintln!(
        "dpuctl: error: INVALID_ARGUMENT: {}",
        first.strip_prefix("error: ").unwrap_or(first)
    );
    for line in lines {
        eprintln!("{line}");
    }
    ExitCode::from(EXIT_INVALID)
}

fn read(path: &PathBuf) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Other(format!("reading {}: {e}", path.display())))
}

async fn connect(cli: &Cli) -> Result<DpuClient, Failure> {
    let wants_tls = cli.ca_cert.is_some()
        || cli.cert.is_some()
        || cli.key.is_some()
        || cli.endpoint.starts_with("https:");
    let tls = if wants_tls {
        let ca = cli.ca_cert.as_ref().ok_or_else(|| {
            Failure::Other(
                "TLS needs --ca-cert (the CA that signed the service's certificate)".into(),
            )
        })?;
        if !cli.endpoint.starts_with("https:") {
            return Err(Failure::Other(format!(
                "TLS flags need an https:// --endpoint, not {:?}",
                cli.endpoint
            )));
        }
        Some(TlsConfig {
            ca_cert_pem: read(ca)?,
            client_cert_pem: cli.cert.as_ref().map(read).transpose()?,
            client_key_pem: cli.key.as_ref().map(read).transpose()?,
            server_name: cli.tls_server_name.clone(),
        })
    } else {
        None
    };
    let timeout = Duration::from_secs(cli.timeout);
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

/// `--vxlan UPLINK:VNI[:VTEP,...]`.
fn vxlan_attachment(s: &str) -> Result<pb::Attachment, String> {
    let (uplink, rest) = s
        .split_once(':')
        .filter(|(u, _)| !u.is_empty())
        .ok_or("expected UPLINK:VNI[:VTEP,...]")?;
    let (vni, vteps) = rest.split_once(':').unwrap_or((rest, ""));
    let vni = vni
        .parse()
        .map_err(|_| format!("VNI {vni:?} is not a number"))?;
    Ok(pb::Attachment {
        kind: Some(pb::attachment::Kind::Vxlan(pb::VxlanAttachment {
            uplink: port_name(uplink),
            vni,
            remote_vteps: vteps
                .split(',')
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect(),
        })),
    })
}

/// Every attachment given, ports first.
fn attachments(f: &TenantFields) -> Vec<pb::Attachment> {
    f.ports.iter().chain(&f.vxlans).cloned().collect()
}

fn policy(p: Option<Policy>) -> i32 {
    match p {
        Some(Policy::Allow) => pb::DefaultPolicy::Allow as i32,
        Some(Policy::Deny) => pb::DefaultPolicy::Deny as i32,
        None => pb::DefaultPolicy::Unspecified as i32,
    }
}

/// `--sport`/`--dport`: `PORT` or `FIRST-LAST` (the service checks the order).
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
        Command::Health { service } => {
            let status = c.health(service).await?;
            if status != ServingStatus::Serving {
                return Err(Failure::Other(format!(
                    "{}: {}",
                    if service.is_empty() {
                        "server"
                    } else {
                        service
                    },
                    status.as_str_name()
                )));
            }
            Shown {
                json: serde_json::json!({ "status": status.as_str_name() }),
                text: format!("{}\n", status.as_str_name()),
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
                attachments: attachments(fields),
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
        TenantCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_tenants(pb::ListTenantsRequest {
                        page_size: *page_size,
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
                attachments: attachments(fields),
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
        PortCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_ports(pb::ListPortsRequest {
                        page_size: *page_size,
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
            rate_limit,
            burst,
            description,
            expect_version,
        } => {
            let rate_limit = rate_limit.map(|l| pb::RateLimit {
                burst: burst.unwrap_or(0),
                ..l
            });
            let rule = pb::FilterRule {
                priority: *priority,
                src_prefix: src.clone().unwrap_or_default(),
                dst_prefix: dst.clone().unwrap_or_default(),
                src_ports: *sport,
                dst_ports: *dport,
                ip_protocol: *proto,
                icmp_type: *icmp_type,
                icmp_code: *icmp_code,
                action: match action {
                    RuleAction::Allow => pb::RuleAction::Allow as i32,
                    RuleAction::Deny => pb::RuleAction::Deny as i32,
                },
                stateful: *stateful,
                description: description.clone(),
                rate_limit,
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
        RuleCmd::List { tenant, paging } => {
            let parent = tenant_name(tenant);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_rules(pb::ListRulesRequest {
                            parent,
                            page_size: paging.page_size,
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
        SubsystemCmd::List(Paging { page_size }) => {
            let all = all_pages(|page_token| async move {
                let r = c
                    .list_subsystems(pb::ListSubsystemsRequest {
                        page_size: *page_size,
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
        NamespaceCmd::List { subsystem, paging } => {
            let parent = subsystem_name(subsystem);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_namespaces(pb::ListNamespacesRequest {
                            parent,
                            page_size: paging.page_size,
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
        ListenerCmd::List { subsystem, paging } => {
            let parent = subsystem_name(subsystem);
            let all = all_pages(|page_token| {
                let parent = parent.clone();
                async move {
                    let r = c
                        .list_listeners(pb::ListListenersRequest {
                            parent,
                            page_size: paging.page_size,
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

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("dpuctl").chain(args.iter().copied()))
    }

    #[test]
    fn values_parse() {
        // PORT[.VLAN], ranges, protocols and rates: see dpu_proto::text.
        assert!(
            matches!(vxlan_attachment("p0:5001").unwrap().kind, Some(pb::attachment::Kind::Vxlan(v)) if v.uplink == "ports/p0" && v.vni == 5001)
        );
        assert!(
            matches!(vxlan_attachment("p0:7:192.0.2.2,192.0.2.3").unwrap().kind, Some(pb::attachment::Kind::Vxlan(v)) if v.vni == 7 && v.remote_vteps == ["192.0.2.2", "192.0.2.3"])
        );
        assert!(vxlan_attachment("p0").is_err());
        assert!(vxlan_attachment(":5").is_err());
    }

    #[test]
    fn command_lines() {
        let cli = parse(&[
            "tenant", "create", "blue", "--port", "pf0vf0", "--vxlan", "p0:7", "--port", "p0.100",
        ])
        .unwrap();
        let Command::Tenant(TenantCmd::Create { fields, .. }) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(attachments(fields).len(), 3);
        assert_eq!(cli.output, Format::Table);
        assert_eq!(cli.timeout, 10);

        let cli = parse(&["-o", "json", "tenant", "list", "--page-size", "2"]).unwrap();
        assert_eq!(cli.output, Format::Json);
        assert!(matches!(
            cli.command,
            Command::Tenant(TenantCmd::List(Paging { page_size: 2 }))
        ));

        let cli = parse(&["namespace", "create", "vol", "--ram", "64M"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Namespace(NamespaceCmd::Create { ram: Some(n), .. }) if n == 64 << 20
        ));
    }

    #[test]
    fn bad_values_are_invalid_argument_and_bad_usage_is_2() {
        let kind = |args: &[&str]| parse(args).map(|_| ()).unwrap_err().kind();
        let value = [ErrorKind::ValueValidation, ErrorKind::InvalidValue];
        // Exit 5: values the CLI must parse.
        for args in [
            &["namespace", "create", "vol", "--ram", "12X"][..],
            &["namespace", "resize", "vol", "1", "lots"],
            &[
                "rule",
                "add",
                "t",
                "--priority",
                "1",
                "--action",
                "allow",
                "--dport",
                "http",
            ],
            &["rule", "add", "t", "--priority", "1", "--action", "maybe"],
            &["tenant", "create", "t", "--vxlan", "p0"],
            &["tenant", "list", "--page-size=-1"],
        ] {
            assert!(value.contains(&kind(args)), "{args:?}: {:?}", kind(args));
        }
        // Exit 2: malformed command lines.
        for args in [
            &["tenant", "frobnicate"][..],
            &["namespace", "create", "vol"],
            &["namespace", "create", "vol", "--ram", "1M", "--file", "/x"],
            &["tenant", "update", "t"],
            &["subsystem", "update", "s"],
            &["--cert", "c.pem", "info"],
        ] {
            assert!(!value.contains(&kind(args)), "{args:?}: {:?}", kind(args));
        }
    }

    #[test]
    fn transport_failures_name_their_code() {
        let e = Failure::from(ClientError::Timeout(Duration::from_secs(3)));
        assert!(e.to_string().starts_with("DEADLINE_EXCEEDED: "), "{e}");
        assert_eq!(e.exit(), 8);
        let e = Failure::from(ClientError::Status {
            code: tonic::Code::NotFound,
            message: "tenants/x not found".into(),
        });
        assert_eq!(e.to_string(), "NOT_FOUND: tenants/x not found");
        assert_eq!(e.exit(), 3);
    }
}

//! `dpuctl`: the command-line client of dpu-service.
//!
//! Every RPC of `dpu.v1` is a subcommand. Output is a table for people, or
//! the canonical proto3 JSON with `--output json`. Exit codes are those of
//! [`dpu_client::exit_code`], plus 2 for a malformed command line and 5 for
//! a value `dpuctl` cannot parse (see [`EXIT_CODES`]).

#![forbid(unsafe_code)]

mod cluster;
mod common;
mod counters;
mod info;
mod listener;
mod namespace;
mod port;
mod qos;
mod render;
mod rule;
mod subsystem;
mod table;
mod tenant;
mod volume;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand, ValueEnum};
use dpu_client::{code_name, exit_code, ClientConfig, ClientError, DpuClient, TlsConfig};
use serde_json::Value;

use crate::common::{read, Shown};

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
  9  UNAUTHENTICATED or PERMISSION_DENIED
  10 RESOURCE_EXHAUSTED: past a configured cap (the message names its key)";

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
    Health(info::HealthArgs),
    /// Tenants.
    #[command(subcommand)]
    Tenant(tenant::TenantCmd),
    /// Data-plane ports.
    #[command(subcommand)]
    Port(port::PortCmd),
    /// Filter rules of a tenant.
    #[command(subcommand)]
    Rule(rule::RuleCmd),
    /// NVMe-oF subsystems, their allowed hosts, the hosts' DH-HMAC-CHAP
    /// secrets (`set-auth --dhchap-secret-file`) and TLS keys
    /// (`set-tls-key --psk-file`).
    #[command(subcommand)]
    Subsystem(subsystem::SubsystemCmd),
    /// Namespaces of a subsystem.
    #[command(subcommand)]
    Namespace(namespace::NamespaceCmd),
    /// Volumes: named stores (RAM, a file, a block device, a null store)
    /// that a namespace is made on by naming them (`namespace create
    /// --volume`).
    #[command(subcommand)]
    Volume(volume::VolumeCmd),
    /// Storage clusters (Ceph) whose RBD images back namespaces; their
    /// cephx keys come from keyring files (`--keyring-file`).
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Listeners of a subsystem.
    #[command(subcommand)]
    Listener(listener::ListenerCmd),
    /// A snapshot of all counters.
    Counters(counters::CountersArgs),
    /// Streams counter snapshots.
    Watch(counters::WatchArgs),
    /// Flow offload: established connections in the flow hardware in
    /// front of the cores.
    #[command(subcommand)]
    Offload(counters::OffloadCmd),
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
            // The message may quote the service.
            eprintln!("dpuctl: error: {}", table::escape(&e.to_string()));
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
    if let Command::Watch(args) = &cli.command {
        return counters::watch(&client, cli.output, args).await;
    }
    let shown = execute(&client, &cli.command).await?;
    match cli.output {
        Format::Json => {
            let s = serde_json::to_string_pretty(&shown.json)
                .map_err(|e| Failure::Other(e.to_string()))?;
            println!("{}", table::json_safe(&s));
        }
        Format::Table => print!("{}", table::terminal_safe(&shown.text)),
    }
    Ok(())
}

async fn execute(c: &DpuClient, cmd: &Command) -> Result<Shown, Failure> {
    Ok(match cmd {
        Command::Info => info::info(c).await?,
        Command::Health(args) => info::health(c, args).await?,
        Command::Counters(args) => counters::counters(c, args).await?,
        Command::Watch(_) => unreachable_watch(),
        Command::Offload(counters::OffloadCmd::Status) => counters::offload_status(c).await?,
        Command::Tenant(t) => tenant::execute(c, t).await?,
        Command::Port(p) => port::execute(c, p).await?,
        Command::Rule(r) => rule::execute(c, r).await?,
        Command::Subsystem(s) => subsystem::execute(c, s).await?,
        Command::Namespace(n) => namespace::execute(c, n).await?,
        Command::Volume(v) => volume::execute(c, v).await?,
        Command::Cluster(k) => cluster::execute(c, k).await?,
        Command::Listener(l) => listener::execute(c, l).await?,
    })
}

/// `watch` streams and is handled before `execute`.
fn unreachable_watch() -> Shown {
    Shown {
        json: Value::Null,
        text: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterCmd;
    use crate::common::Paging;
    use crate::namespace::NamespaceCmd;
    use crate::subsystem::SubsystemCmd;
    use crate::tenant::{attachments, TenantCmd};

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("dpuctl").chain(args.iter().copied()))
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

        let cli = parse(&[
            "namespace",
            "create",
            "vol",
            "--rbd",
            "rbd/img1",
            "--cluster",
            "ceph1",
        ])
        .unwrap();
        let Command::Namespace(NamespaceCmd::Create {
            rbd: Some((pool, image)),
            cluster: Some(cluster),
            ..
        }) = &cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (pool.as_str(), image.as_str(), cluster.as_str()),
            ("rbd", "img1", "ceph1")
        );

        let cli = parse(&[
            "namespace",
            "create",
            "vol",
            "--remote",
            "10.0.0.1:4420",
            "--remote",
            "[fd00::1]:4421",
            "--remote-nqn",
            "nqn.2024-01.io.example:far",
            "--remote-nsid",
            "7",
            "--host-nqn",
            "nqn.2024-01.io.example:dpu",
            "--dhchap-secret-file",
            "far.key",
            "--io-timeout-ms",
            "2000",
            "--connect-timeout-ms",
            "500",
            "--queue-depth",
            "64",
        ])
        .unwrap();
        let Command::Namespace(NamespaceCmd::Create {
            remote, ram: None, ..
        }) = &cli.command
        else {
            panic!("{cli:?}")
        };
        let paths: Vec<String> = remote.paths.iter().map(ToString::to_string).collect();
        assert_eq!(paths, ["10.0.0.1:4420", "[fd00::1]:4421"]);
        assert_eq!(
            (
                remote.nqn.as_deref(),
                remote.nsid,
                remote.host_nqn.as_deref(),
                remote.io_timeout_ms,
                remote.connect_timeout_ms,
                remote.queue_depth
            ),
            (
                Some("nqn.2024-01.io.example:far"),
                Some(7),
                Some("nqn.2024-01.io.example:dpu"),
                Some(2000),
                Some(500),
                Some(64)
            )
        );
        assert_eq!(
            remote.dhchap_secret_file.as_deref(),
            Some(std::path::Path::new("far.key"))
        );

        // QoS: each flag a limit, sizes for bandwidths; none clears.
        let cli = parse(&[
            "namespace",
            "set-qos",
            "vol",
            "2",
            "--iops",
            "1000",
            "--read-iops",
            "600",
            "--write-iops",
            "400",
            "--bandwidth",
            "1G",
            "--read-bandwidth",
            "200M",
            "--write-bandwidth",
            "4096",
        ])
        .unwrap();
        let Command::Namespace(NamespaceCmd::SetQos {
            subsystem,
            nsid: 2,
            qos,
        }) = &cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!(subsystem, "vol");
        assert_eq!(
            qos.limits(),
            dpu_client::pb::QosLimits {
                iops: 1000,
                read_iops: 600,
                write_iops: 400,
                bandwidth: 1 << 30,
                read_bandwidth: 200 << 20,
                write_bandwidth: 4096,
            }
        );
        let cli = parse(&["namespace", "set-qos", "vol", "2"]).unwrap();
        let Command::Namespace(NamespaceCmd::SetQos { qos, .. }) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(qos.limits(), dpu_client::pb::QosLimits::default(), "clears");
        let cli = parse(&[
            "subsystem",
            "set-host-qos",
            "vol",
            "nqn.2014-08.org.nvmexpress:uuid:h1",
            "--write-iops",
            "50",
        ])
        .unwrap();
        let Command::Subsystem(SubsystemCmd::SetHostQos { id, nqn, qos }) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (
                id.as_str(),
                nqn.as_str(),
                qos.limits().write_iops,
                qos.limits().iops
            ),
            ("vol", "nqn.2014-08.org.nvmexpress:uuid:h1", 50, 0)
        );
        let cli = parse(&[
            "tenant",
            "set-storage-qos",
            "blue",
            "--iops",
            "5000",
            "--write-bandwidth",
            "100M",
        ])
        .unwrap();
        let Command::Tenant(TenantCmd::SetStorageQos { id, qos }) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (id.as_str(), qos.limits()),
            (
                "blue",
                dpu_client::pb::QosLimits {
                    iops: 5000,
                    write_bandwidth: 100 << 20,
                    ..Default::default()
                }
            )
        );
        let cli = parse(&["tenant", "set-storage-qos", "tenants/blue"]).unwrap();
        let Command::Tenant(TenantCmd::SetStorageQos { qos, .. }) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(qos.limits(), dpu_client::pb::QosLimits::default(), "clears");
        let cli = parse(&["namespace", "create", "vol", "--ram", "1M", "--iops", "10"]).unwrap();
        let Command::Namespace(NamespaceCmd::Create { qos, .. }) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(qos.on_create().map(|q| q.iops), Some(10));

        let cli = parse(&[
            "cluster",
            "create",
            "ceph1",
            "--mon",
            "127.0.0.1:6789",
            "--mon",
            "[v2:10.0.0.2:3300,v1:10.0.0.2:6789]",
            "--user",
            "dpu",
            "--keyring-file",
            "/etc/ceph/ceph.client.dpu.keyring",
            "--op-timeout",
            "30",
        ])
        .unwrap();
        let Command::Cluster(ClusterCmd::Create {
            mons,
            keyring_file: Some(_),
            op_timeout: Some(30),
            connect_timeout: None,
            ..
        }) = &cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!(mons.len(), 2);
        for args in [
            &["cluster", "update", "ceph1", "--keyring-file", "k"][..],
            &["cluster", "update", "ceph1", "--no-key"],
            &["cluster", "get", "ceph1"],
            &["cluster", "list"],
            &["cluster", "delete", "clusters/ceph1"],
        ] {
            parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    /// Volumes: each store a flag, sizes parsed; a namespace is made on a
    /// volume or a null store as on any other backend.
    #[test]
    fn volume_command_lines() {
        use crate::volume::VolumeCmd;
        let cli = parse(&[
            "volume",
            "create",
            "v1",
            "--ram",
            "64M",
            "--block-size",
            "4096",
            "--uuid",
            "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f",
        ])
        .unwrap();
        let Command::Volume(VolumeCmd::Create {
            id,
            ram: Some(ram),
            file: None,
            block_device: None,
            null: None,
            block_size: Some(4096),
            uuid: Some(uuid),
            ..
        }) = &cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (id.as_str(), *ram, uuid.as_str()),
            ("v1", 64 << 20, "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f")
        );
        let cli = parse(&["volume", "create", "volumes/v2", "--null", "1T"]).unwrap();
        assert!(matches!(
            &cli.command,
            Command::Volume(VolumeCmd::Create { id, null: Some(n), ram: None, block_size: None, .. })
                if id == "volumes/v2" && *n == 1 << 40
        ));
        let cli = parse(&[
            "volume",
            "create",
            "v3",
            "--file",
            "/srv/v3.img",
            "--size",
            "4K",
        ])
        .unwrap();
        assert!(matches!(
            &cli.command,
            Command::Volume(VolumeCmd::Create { file: Some(f), size: Some(4096), .. })
                if f == "/srv/v3.img"
        ));
        let cli = parse(&["volume", "create", "v4", "--block-device", "/dev/nvme0n1"]).unwrap();
        assert!(matches!(
            &cli.command,
            Command::Volume(VolumeCmd::Create { block_device: Some(d), size: None, .. })
                if d == "/dev/nvme0n1"
        ));
        let cli = parse(&["volume", "resize", "v1", "1G"]).unwrap();
        assert!(matches!(
            &cli.command,
            Command::Volume(VolumeCmd::Resize { id, size }) if id == "v1" && *size == 1 << 30
        ));
        let cli = parse(&["-o", "json", "volume", "list", "--page-size", "3"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCmd::List(Paging { page_size: 3 }))
        ));
        assert!(matches!(
            parse(&["volume", "get", "v1"]).unwrap().command,
            Command::Volume(VolumeCmd::Get { .. })
        ));
        assert!(matches!(
            parse(&["volume", "delete", "volumes/v1"]).unwrap().command,
            Command::Volume(VolumeCmd::Delete { .. })
        ));

        let cli = parse(&["namespace", "create", "vol", "--volume", "v1"]).unwrap();
        assert!(matches!(
            &cli.command,
            Command::Namespace(NamespaceCmd::Create { volume: Some(v), ram: None, null: None, .. })
                if v == "v1"
        ));
        let cli = parse(&["namespace", "create", "vol", "--null", "16G"]).unwrap();
        assert!(matches!(
            &cli.command,
            Command::Namespace(NamespaceCmd::Create { null: Some(n), volume: None, .. })
                if *n == 16 << 30
        ));
    }

    /// The secure channel's flags: a host's key from a file, the TLS
    /// requirement where the authentication requirement is set, a
    /// listener's secure channel.
    #[test]
    fn tls_command_lines() {
        use crate::listener::{ListenerCmd, SecureChannelArg};
        use crate::subsystem::{DerivationArg, TlsArg};
        let cli = parse(&[
            "subsystem",
            "set-tls-key",
            "vol",
            "nqn.2014-08.org.nvmexpress:uuid:h",
            "--psk-file",
            "h.psk",
        ])
        .unwrap();
        let Command::Subsystem(SubsystemCmd::SetTlsKey {
            id,
            nqn,
            psk_file,
            v0_derivation,
        }) = &cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!(
            (id.as_str(), nqn.as_str(), psk_file.as_path()),
            (
                "vol",
                "nqn.2014-08.org.nvmexpress:uuid:h",
                std::path::Path::new("h.psk")
            )
        );
        assert_eq!(*v0_derivation, DerivationArg::Spec, "the default");
        let with = |d: &str| {
            parse(&[
                "subsystem",
                "set-tls-key",
                "vol",
                "nqn.h",
                "--psk-file",
                "h.psk",
                "--v0-derivation",
                d,
            ])
        };
        let cli = with("compat").unwrap();
        assert!(matches!(
            cli.command,
            Command::Subsystem(SubsystemCmd::SetTlsKey {
                v0_derivation: DerivationArg::Compat,
                ..
            })
        ));
        assert!(matches!(
            with("spec").unwrap().command,
            Command::Subsystem(SubsystemCmd::SetTlsKey {
                v0_derivation: DerivationArg::Spec,
                ..
            })
        ));
        assert!(with("legacy").is_err());
        let cli = parse(&["subsystem", "clear-tls-key", "vol", "nqn.h"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Subsystem(SubsystemCmd::ClearTlsKey { .. })
        ));
        let cli = parse(&["subsystem", "update", "vol", "--tls", "required"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Subsystem(SubsystemCmd::Update {
                tls: Some(TlsArg::Required),
                ..
            })
        ));
        let cli = parse(&[
            "subsystem",
            "create",
            "vol",
            "--nqn",
            "nqn.2024-01.io.example:vol",
            "--tls",
            "hosts-with-key",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Subsystem(SubsystemCmd::Create {
                tls: Some(TlsArg::HostsWithKey),
                ..
            })
        ));
        let cli = parse(&[
            "listener",
            "create",
            "vol",
            "--address",
            "127.0.0.1",
            "--secure-channel",
            "allowed",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Listener(ListenerCmd::Create {
                secure_channel: Some(SecureChannelArg::Allowed),
                ..
            })
        ));
    }

    #[test]
    fn bad_values_are_invalid_argument_and_bad_usage_is_2() {
        let kind = |args: &[&str]| parse(args).map(|_| ()).unwrap_err().kind();
        let value = [ErrorKind::ValueValidation, ErrorKind::InvalidValue];
        // Exit 5: values the CLI must parse.
        for args in [
            &["namespace", "create", "vol", "--ram", "12X"][..],
            &["namespace", "set-qos", "vol", "1", "--iops", "1k"],
            &["tenant", "set-storage-qos", "blue", "--read-iops", "many"],
            &["tenant", "set-storage-qos", "blue", "--bandwidth", "1.5G"],
            &["namespace", "set-qos", "vol", "1", "--iops=-1"],
            &[
                "namespace",
                "set-qos",
                "vol",
                "1",
                "--read-bandwidth",
                "1.5G",
            ],
            &[
                "subsystem",
                "set-host-qos",
                "vol",
                "nqn.h",
                "--bandwidth",
                "fast",
            ],
            &["namespace", "resize", "vol", "1", "lots"],
            &["namespace", "create", "vol", "--null", "big"],
            &["volume", "create", "v", "--ram", "12X"],
            &["volume", "create", "v", "--null=-1"],
            &[
                "volume",
                "create",
                "v",
                "--ram",
                "1M",
                "--block-size",
                "1024",
            ],
            &["volume", "resize", "v", "lots"],
            &["volume", "list", "--page-size=-1"],
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
            &["subsystem", "update", "s", "--auth", "sometimes"],
            &["subsystem", "update", "s", "--tls", "sometimes"],
            &[
                "listener",
                "create",
                "vol",
                "--address",
                "127.0.0.1",
                "--secure-channel",
                "tls",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--rbd",
                "img1",
                "--cluster",
                "c",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--rbd",
                "rbd/a/b",
                "--cluster",
                "c",
            ],
            &[
                "cluster",
                "create",
                "c",
                "--mon",
                "m",
                "--user",
                "u",
                "--op-timeout=soon",
            ],
            // A path is ADDR:PORT, IPv6 in brackets.
            &[
                "namespace",
                "create",
                "vol",
                "--remote",
                "fd00::1:4420",
                "--remote-nqn",
                "n",
                "--remote-nsid",
                "1",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--remote",
                "far.example:4420",
                "--remote-nqn",
                "n",
                "--remote-nsid",
                "1",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--remote",
                "10.0.0.1:4420",
                "--remote-nqn",
                "n",
                "--remote-nsid",
                "one",
            ],
        ] {
            assert!(value.contains(&kind(args)), "{args:?}: {:?}", kind(args));
        }
        // Exit 2: malformed command lines.
        for args in [
            &["tenant", "frobnicate"][..],
            &["namespace", "create", "vol"],
            &["namespace", "create", "vol", "--ram", "1M", "--file", "/x"],
            // One backend each, a volume or a null store included.
            &[
                "namespace",
                "create",
                "vol",
                "--volume",
                "v1",
                "--ram",
                "1M",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--null",
                "1M",
                "--volume",
                "v1",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--null",
                "1M",
                "--rbd",
                "rbd/i",
                "--cluster",
                "c",
            ],
            &["volume", "create", "v"],
            &["volume", "create", "v", "--ram", "1M", "--null", "1M"],
            &[
                "volume",
                "create",
                "v",
                "--null",
                "1M",
                "--block-device",
                "/dev/x",
            ],
            &["volume", "create", "v", "--ram", "1M", "--size", "2M"],
            &[
                "namespace",
                "create",
                "vol",
                "--volume",
                "v1",
                "--size",
                "2M",
            ],
            &["namespace", "create", "vol", "--ram", "1M", "--size", "2M"],
            &["volume", "create", "--ram", "1M"],
            &["volume", "resize", "v"],
            &["volume", "get"],
            &["tenant", "update", "t"],
            &["subsystem", "update", "s"],
            &["--cert", "c.pem", "info"],
            // An image needs its cluster, and one backend only.
            &["namespace", "create", "vol", "--rbd", "rbd/img1"],
            &[
                "namespace",
                "create",
                "vol",
                "--rbd",
                "rbd/i",
                "--cluster",
                "c",
                "--ram",
                "1M",
            ],
            // A remote needs its subsystem and NSID; its settings need a
            // remote, and it is one backend.
            &["namespace", "create", "vol", "--remote", "10.0.0.1:4420"],
            &[
                "namespace",
                "create",
                "vol",
                "--remote",
                "10.0.0.1:4420",
                "--remote-nqn",
                "n",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--ram",
                "1M",
                "--remote-nqn",
                "n",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--ram",
                "1M",
                "--queue-depth",
                "8",
            ],
            &[
                "namespace",
                "create",
                "vol",
                "--ram",
                "1M",
                "--remote",
                "10.0.0.1:4420",
                "--remote-nqn",
                "n",
                "--remote-nsid",
                "1",
            ],
            // A cluster needs monitors and a user; an update something to change.
            &["cluster", "create", "c", "--user", "u"],
            &["cluster", "create", "c", "--mon", "m"],
            &["cluster", "update", "c"],
            &["cluster", "update", "c", "--no-key", "--keyring-file", "k"],
            // A secret is required, given once: inline or from a file.
            &[
                "subsystem",
                "set-auth",
                "s",
                "nqn.2014-08.org.nvmexpress:uuid:h",
            ],
            // A TLS key comes from a file only, never the command line.
            &["subsystem", "set-tls-key", "s", "nqn.h"],
            &["subsystem", "set-tls-key", "s", "nqn.h", "--psk", "x"],
            &[
                "subsystem",
                "set-auth",
                "s",
                "nqn.2014-08.org.nvmexpress:uuid:h",
                "--dhchap-secret",
                "x",
                "--dhchap-secret-file",
                "f",
            ],
            &[
                "subsystem",
                "set-auth",
                "s",
                "nqn.2014-08.org.nvmexpress:uuid:h",
                "--dhchap-secret-file",
                "f",
                "--dhchap-ctrl-secret",
                "x",
                "--dhchap-ctrl-secret-file",
                "g",
            ],
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

//! The command line of `dpu-service`: its flags, each also read from an
//! environment variable, which override the configuration file.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use serde::Deserialize;

/// Command line of `dpu-service`. Every flag also reads an environment
/// variable and overrides the configuration file.
#[derive(Debug, Parser)]
#[command(
    name = "dpu-service",
    version,
    about = "Per-tenant switching and an NVMe/TCP target for DPUs, driven over gRPC."
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, short, env = "DPU_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC listen address (overrides grpc.listen).
    #[arg(long, env = "DPU_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,
    /// Plain-text gRPC health-only listen address (overrides grpc.health_listen); "off" disables it.
    #[arg(long, env = "DPU_HEALTH_LISTEN")]
    pub health_listen: Option<String>,
    /// Prometheus metrics listen address (overrides metrics.listen); "off" disables it.
    #[arg(long, env = "DPU_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Directory of the persisted state (overrides state.dir).
    #[arg(long, env = "DPU_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log format (overrides log.format).
    #[arg(long, env = "DPU_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. "info" or "dpu_control=debug" (overrides log.level).
    #[arg(long, env = "DPU_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// PEM server certificate; enables TLS (overrides grpc.tls_cert).
    #[arg(long, env = "DPU_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the server certificate (overrides grpc.tls_key).
    #[arg(long, env = "DPU_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle; clients must present a certificate it signed (mTLS).
    #[arg(long, env = "DPU_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Allow plain-text gRPC on a non-loopback address.
    #[arg(long, env = "DPU_ALLOW_INSECURE_REMOTE")]
    pub allow_insecure_remote: bool,
    /// Run without the data plane: every port is for the API only (driver
    /// "none"), whatever the configuration says. For machines where the
    /// ports' devices cannot be opened, e.g. TAP ports without root.
    #[arg(long, env = "DPU_NO_DATAPLANE")]
    pub no_dataplane: bool,
    /// Check the configuration and the state file, then exit.
    #[arg(long)]
    pub check_config: bool,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

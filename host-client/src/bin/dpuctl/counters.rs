//! `dpuctl counters` and `dpuctl watch`: one snapshot of the counters, or a
//! stream of them.

use dpu_client::{pb, tenant_name, ClientError, DpuClient};

use crate::common::{json, Shown};
use crate::{render, Failure, Format};

/// The arguments of `dpuctl counters`.
#[derive(Debug, clap::Args)]
pub struct CountersArgs {
    /// Only this tenant's tenant and rule counters.
    #[arg(long)]
    pub tenant: Option<String>,
}

/// The arguments of `dpuctl watch`.
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// Only this tenant's tenant and rule counters.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Milliseconds between snapshots.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u32,
    /// Stop after this many snapshots.
    #[arg(long)]
    pub count: Option<u64>,
}

/// `dpuctl offload`.
#[derive(Debug, clap::Subcommand)]
pub enum OffloadCmd {
    /// The provider, the hardware table's use, the flows offloaded and
    /// refused, and each tenant's flows and what they carried.
    Status,
}

/// `dpuctl offload status`: the offload part of the counters. Fails when
/// the service runs without offload.
pub async fn offload_status(c: &DpuClient) -> Result<Shown, Failure> {
    let s = c.get_counters(pb::GetCountersRequest::default()).await?;
    let Some(o) = s.offload else {
        return Err(Failure::Other(
            "flow offload is off (dataplane.offload.provider = \"none\")".into(),
        ));
    };
    Ok(Shown {
        json: json(&o),
        text: render::offload(&o),
    })
}

/// `dpuctl counters`.
pub async fn counters(c: &DpuClient, args: &CountersArgs) -> Result<Shown, Failure> {
    let s = c
        .get_counters(pb::GetCountersRequest {
            tenant: args.tenant.as_deref().map(tenant_name).unwrap_or_default(),
        })
        .await?;
    Ok(Shown {
        json: json(&s),
        text: render::counters(&s),
    })
}

/// `dpuctl watch`: prints each snapshot as it comes, in `format`.
pub async fn watch(client: &DpuClient, format: Format, args: &WatchArgs) -> Result<(), Failure> {
    let WatchArgs {
        tenant,
        interval_ms,
        count,
    } = args;
    let req = pb::WatchCountersRequest {
        tenant: tenant.as_deref().map(tenant_name).unwrap_or_default(),
        interval_ms: *interval_ms,
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
                crate::table::json_safe(
                    &serde_json::to_string(&snap).map_err(|e| Failure::Other(e.to_string()))?
                )
            ),
            Format::Table => println!("{}", crate::table::terminal_safe(&render::counters(&snap))),
        }
    }
    Ok(())
}

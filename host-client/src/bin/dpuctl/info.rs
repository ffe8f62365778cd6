//! `dpuctl info` and `dpuctl health`: what the service is, and whether it
//! serves.

use dpu_client::{pb, DpuClient, ServingStatus};

use crate::common::{json, Shown};
use crate::{render, Failure};

/// The arguments of `dpuctl health`.
#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// A service name such as "dpu.v1.StorageService"; empty: the server.
    #[arg(long, default_value = "")]
    pub service: String,
}

/// `dpuctl info`.
pub async fn info(c: &DpuClient) -> Result<Shown, Failure> {
    let i = c.get_service_info(pb::GetServiceInfoRequest {}).await?;
    Ok(Shown {
        json: json(&i),
        text: render::info(&i),
    })
}

/// `dpuctl health`.
pub async fn health(c: &DpuClient, args: &HealthArgs) -> Result<Shown, Failure> {
    let service = &args.service;
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
    Ok(Shown {
        json: serde_json::json!({ "status": status.as_str_name() }),
        text: format!("{}\n", status.as_str_name()),
    })
}

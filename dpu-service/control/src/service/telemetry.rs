//! `dpu.v1.TelemetryService`.

use std::pin::Pin;
use std::time::Duration;

use dpu_proto::v1 as pb;
use dpu_proto::v1::telemetry_service_server::TelemetryService;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::Api;
use crate::error::{ControlError, Result};
use crate::validate;

impl Api {
    fn tenant_filter(&self, field: &str, tenant: &str) -> Result<Option<String>> {
        if tenant.is_empty() {
            return Ok(None);
        }
        let id = validate::name(field, tenant, "tenants")?;
        self.ctl.state.snapshot().tenant(id)?;
        Ok(Some(id.to_string()))
    }

    fn counters(&self, tenant: Option<&str>) -> pb::CounterSnapshot {
        self.ctl
            .telemetry
            .snapshot(&self.ctl.state.snapshot(), &self.ctl.ports, tenant)
    }
}

/// The stream type of `WatchCounters`.
pub type CounterStream = Pin<Box<dyn Stream<Item = Result<pb::CounterSnapshot, Status>> + Send>>;

#[tonic::async_trait]
impl TelemetryService for Api {
    async fn get_counters(
        &self,
        req: Request<pb::GetCountersRequest>,
    ) -> Result<Response<pb::CounterSnapshot>, Status> {
        self.read("/dpu.v1.TelemetryService/GetCounters", async {
            let tenant = self.tenant_filter("tenant", &req.get_ref().tenant)?;
            Ok(self.counters(tenant.as_deref()))
        })
        .await
    }

    type WatchCountersStream = CounterStream;

    async fn watch_counters(
        &self,
        req: Request<pb::WatchCountersRequest>,
    ) -> Result<Response<CounterStream>, Status> {
        self.read("/dpu.v1.TelemetryService/WatchCounters", async {
            let req = req.into_inner();
            let tenant = self.tenant_filter("tenant", &req.tenant)?;
            let ms = match req.interval_ms {
                0 => 1000,
                100..=60_000 => req.interval_ms,
                v => {
                    return Err(ControlError::invalid(
                        "interval_ms",
                        format!("{v} is not in 100..=60000"),
                    ))
                }
            };
            let api = self.clone();
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(u64::from(ms)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if tx.send(Ok(api.counters(tenant.as_deref()))).await.is_err() {
                        break; // The client went away.
                    }
                }
            });
            let stream: CounterStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
            Ok(stream)
        })
        .await
    }
}

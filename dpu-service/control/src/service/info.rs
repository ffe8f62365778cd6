//! `dpu.v1.InfoService`.

use dpu_proto::v1 as pb;
use dpu_proto::v1::info_service_server::InfoService;
use tonic::{Request, Response, Status};

use super::Api;
use crate::convert;

#[tonic::async_trait]
impl InfoService for Api {
    async fn get_service_info(
        &self,
        _req: Request<pb::GetServiceInfoRequest>,
    ) -> Result<Response<pb::ServiceInfo>, Status> {
        self.read("/dpu.v1.InfoService/GetServiceInfo", async {
            let f = &self.ctl.facts;
            Ok(pb::ServiceInfo {
                version: f.version.clone(),
                api_version: dpu_proto::API_VERSION.to_string(),
                target_triple: f.target_triple.clone(),
                dpdk_version: f.dpdk_version.clone(),
                dataplane_driver: f.dataplane_driver.clone(),
                capabilities: f.capabilities.clone(),
                start_time: Some(convert::timestamp(f.start_time)),
                hostname: f.hostname.clone(),
            })
        })
        .await
    }
}

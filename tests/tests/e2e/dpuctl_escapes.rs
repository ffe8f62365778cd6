//! `dpuctl` against a hostile service: values that carry terminal escape
//! sequences (a window retitle, a screen clear, a C1 CSI, a bidi
//! override, a line break that would forge a table row) come out escaped
//! in table output and in error messages, and as JSON escapes with
//! `--output json`. The real service refuses such text on input; this
//! stands in for whatever put it there (a state file edited by hand, an
//! older version, a compromised peer).

use std::net::SocketAddr;
use std::process::Command;

use anyhow::Result;
use dpu_e2e::binary;
use dpu_proto::v1 as pb;
use dpu_proto::v1::tenant_service_server::{TenantService, TenantServiceServer};
use tonic::{Request, Response, Status};

const HOSTILE: &str = "ok\x1b]0;pwned\x07\x1b[2J\u{9b}31m\nforged  row\u{202e}\x7f";

/// Answers every read with a tenant named with [`HOSTILE`] text, and every
/// delete with an error quoting it.
struct Hostile;

fn tenant() -> pb::Tenant {
    pb::Tenant {
        name: "tenants/evil".into(),
        display_name: HOSTILE.into(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl TenantService for Hostile {
    async fn create_tenant(
        &self,
        _: Request<pb::CreateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        Err(Status::unimplemented("read only"))
    }

    async fn get_tenant(
        &self,
        _: Request<pb::GetTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        Ok(Response::new(tenant()))
    }

    async fn list_tenants(
        &self,
        _: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        Ok(Response::new(pb::ListTenantsResponse {
            tenants: vec![tenant(), tenant()],
            next_page_token: String::new(),
        }))
    }

    async fn update_tenant(
        &self,
        _: Request<pb::UpdateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        Err(Status::unimplemented("read only"))
    }

    async fn delete_tenant(
        &self,
        _: Request<pb::DeleteTenantRequest>,
    ) -> Result<Response<pb::DeleteTenantResponse>, Status> {
        Err(Status::failed_precondition(format!("no: {HOSTILE}")))
    }

    async fn set_tenant_storage_qos(
        &self,
        _: Request<pb::SetTenantStorageQosRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        Err(Status::failed_precondition(format!("no: {HOSTILE}")))
    }
}

/// True for a character a terminal acts on, bar the line break.
fn acts_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[tokio::test]
async fn values_from_the_service_cannot_drive_the_terminal() -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TenantServiceServer::new(Hostile))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let dpuctl = binary("dpuctl")?;
    let run = |args: &[&str]| {
        let mut cmd = Command::new(&dpuctl);
        cmd.arg("--endpoint")
            .arg(format!("http://{addr}"))
            .args(args);
        async move { tokio::task::spawn_blocking(move || cmd.output()).await? }
    };

    for args in [&["tenant", "list"][..], &["tenant", "get", "evil"]] {
        let out = run(args).await?;
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8(out.stdout)?;
        assert!(!text.chars().any(acts_on_terminal), "{args:?}: {text:?}");
        assert!(
            text.contains(r"ok\x1b]0;pwned\x07\x1b[2J\x9b31m\nforged  row\u{202e}\x7f"),
            "{args:?}: {text}"
        );
        // One header and one line per tenant: the line break forged no row.
        let tenants = if args[1] == "list" { 2 } else { 1 };
        assert_eq!(text.lines().count(), 1 + tenants, "{args:?}: {text}");
    }

    let out = run(&["--output", "json", "tenant", "get", "evil"]).await?;
    let text = String::from_utf8(out.stdout)?;
    assert!(!text.chars().any(acts_on_terminal), "{text:?}");
    let v: serde_json::Value = serde_json::from_str(&text)?;
    assert_eq!(v["displayName"], HOSTILE, "JSON keeps the value exactly");

    let out = run(&["tenant", "delete", "evil"]).await?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert!(!err.chars().any(acts_on_terminal), "{err:?}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(r"no: ok\x1b]0;pwned"), "{err}");
    server.abort();
    Ok(())
}

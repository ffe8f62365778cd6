//! Fuzzes the checks of OPI's NVMe front end with arbitrary bytes decoded
//! as the protobuf requests a client sends (`opi_api.storage.v1`): the
//! first byte picks `CreateNvmeSubsystemRequest`,
//! `UpdateNvmeSubsystemRequest`, `CreateNvmeControllerRequest` or
//! `UpdateNvmeNamespaceRequest`, the rest is the message.
//!
//! Every spec goes through `subsystem_spec` or `controller_spec` (Ok or an
//! error naming an OPI field, never a panic), every update mask through
//! `update_paths`. What is accepted must be what `dpu.v1` accepts too (a
//! subsystem's NQN, serial and model numbers, a listener's address and
//! port) and come back through the OPI view unchanged (NQN and one allowed
//! host; address and port). A namespace's name gives an ID or an NSID in
//! range; an accepted namespace spec is a namespace `dpu.v1` accepts, and
//! its OPI view checks as the same spec, with no field changed. Run with
//! `fuzz/run.sh opi_proto` from the repository root.

use dpu_control::service::opi::{
    controller_spec, controller_to_opi, subsystem_spec, subsystem_to_opi, update_paths,
};
use dpu_control::service::opi_namespace::{self, changed_field, namespace_key, namespace_to_opi};
use dpu_control::validate;
use dpu_proto::opi::storage::v1 as opi;
use prost::Message;

/// Checks one subsystem spec, and what an accepted one becomes.
fn subsystem(spec: opi::NvmeSubsystemSpec) {
    let Ok((mut sub, psk)) = subsystem_spec("nvme_subsystem.spec", spec.clone()) else {
        return;
    };
    validate::nqn("nqn", &sub.nqn).expect("an accepted NQN is dpu.v1's");
    for (v, max) in [(&sub.serial_number, 20), (&sub.model_number, 40)] {
        if !v.is_empty() {
            validate::ascii_id("id", v, max).expect("an accepted serial or model is dpu.v1's");
        }
    }
    assert!(sub.max_namespaces <= 1024);
    assert_eq!(psk.is_some(), !spec.psk.is_empty());
    assert!(
        psk.is_none() || !spec.hostnqn.is_empty(),
        "a key without its host"
    );
    sub.name = "subsystems/s".into();
    let back = subsystem_to_opi(sub).spec.expect("the view has a spec");
    assert_eq!(back.nqn, spec.nqn);
    assert_eq!(back.hostnqn, spec.hostnqn);
    assert!(back.psk.is_empty(), "a key shown back");
}

/// Checks one namespace update: its name, mask and spec, and what an
/// accepted spec becomes.
fn namespace(r: opi::UpdateNvmeNamespaceRequest) {
    if let Ok((_, opi_namespace::Key::Nsid(n))) = namespace_key(
        "name",
        &r.nvme_namespace
            .as_ref()
            .map(|n| n.name.clone())
            .unwrap_or_default(),
    ) {
        assert!((1..=validate::MAX_NAMESPACES).contains(&n));
    }
    let Ok(paths) = opi_namespace::update_paths(r.update_mask.as_ref()) else {
        return;
    };
    let Some(spec) = r.nvme_namespace.and_then(|n| n.spec) else {
        return;
    };
    let Ok(checked) = opi_namespace::Spec::check("nvme_namespace.spec", &spec) else {
        return;
    };
    if checked.volume.is_none() {
        // A create refuses it; an update takes it as no change.
        return;
    }
    let mut ours = checked.namespace("opi-ns".into());
    let (n, has_uuid, has_nguid) =
        validate::namespace("namespace", &ours, "").expect("an accepted spec is dpu.v1's");
    assert_eq!(
        (has_uuid, has_nguid),
        (checked.uuid.is_some(), checked.nguid.is_some())
    );
    assert_eq!(
        (n.nsid, n.eui64, n.namespace_id.as_str()),
        (checked.nsid, checked.eui64, "opi-ns")
    );
    ours.name = format!("subsystems/s/namespaces/{}", ours.nsid);
    assert_eq!(changed_field(&paths, &checked, &ours), None);
    let view = namespace_to_opi(ours.clone());
    assert_eq!(view.name, "nvmeSubsystems/s/nvmeNamespaces/opi-ns");
    let back = opi_namespace::Spec::check("s", &view.spec.expect("the view has a spec"))
        .expect("the view checks");
    assert_eq!(
        (back.nsid, back.uuid, back.nguid, back.eui64),
        (checked.nsid, checked.uuid, checked.nguid, checked.eui64)
    );
    assert_eq!(
        back.volume.map(|v| v.0),
        checked.volume.map(|v| v.0),
        "the view lost the volume"
    );
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Some((&kind, msg)) = data.split_first() else {
        return;
    };
    match kind % 4 {
        0 => {
            if let Ok(r) = opi::CreateNvmeSubsystemRequest::decode(msg) {
                let _ = validate::id("nvme_subsystem_id", &r.nvme_subsystem_id);
                if let Some(spec) = r.nvme_subsystem.and_then(|s| s.spec) {
                    subsystem(spec);
                }
            }
        }
        1 => {
            if let Ok(r) = opi::UpdateNvmeSubsystemRequest::decode(msg) {
                if let Ok(paths) = update_paths(r.update_mask.as_ref()) {
                    assert!(!paths.is_empty() && paths.iter().all(|p| p.starts_with("spec.")));
                }
                if let Some(spec) = r.nvme_subsystem.and_then(|s| s.spec) {
                    subsystem(spec);
                }
            }
        }
        3 => {
            if let Ok(r) = opi::UpdateNvmeNamespaceRequest::decode(msg) {
                namespace(r);
            }
        }
        _ => {
            let Ok(r) = opi::CreateNvmeControllerRequest::decode(msg) else {
                return;
            };
            let Some(spec) = r.nvme_controller.and_then(|c| c.spec) else {
                return;
            };
            let Ok(mut l) = controller_spec("nvme_controller.spec", spec) else {
                return;
            };
            let addr: std::net::IpAddr = l.address.parse().expect("an accepted address parses");
            assert!(l.port <= 65535);
            // dpu.v1 checks the listener too (it may refuse an address it
            // does not serve on); never a panic.
            let _ = validate::listener("listener", "", &l);
            l.name = "subsystems/s/listeners/l".into();
            let port = l.port;
            let c = controller_to_opi(l);
            match c.spec.and_then(|s| s.endpoint) {
                Some(opi::nvme_controller_spec::Endpoint::FabricsId(f)) => {
                    assert_eq!(f.traddr.parse::<std::net::IpAddr>().ok(), Some(addr));
                    assert_eq!(f.trsvcid, port.to_string());
                }
                other => panic!("the view lost its endpoint: {other:?}"),
            }
        }
    }
}

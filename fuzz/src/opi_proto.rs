//! Fuzzes the checks of OPI's NVMe front end with arbitrary bytes decoded
//! as the protobuf requests a client sends (`opi_api.storage.v1`): the
//! first byte picks `CreateNvmeSubsystemRequest`,
//! `UpdateNvmeSubsystemRequest` or `CreateNvmeControllerRequest`, the rest
//! is the message.
//!
//! Every spec goes through `subsystem_spec` or `controller_spec` (Ok or an
//! error naming an OPI field, never a panic), every update mask through
//! `update_paths`. What is accepted must be what `dpu.v1` accepts too (a
//! subsystem's NQN, serial and model numbers, a listener's address and
//! port) and come back through the OPI view unchanged (NQN and one allowed
//! host; address and port). Run with `fuzz/run.sh opi_proto` from the
//! repository root.

use dpu_control::service::opi::{
    controller_spec, controller_to_opi, subsystem_spec, subsystem_to_opi, update_paths,
};
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

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Some((&kind, msg)) = data.split_first() else {
        return;
    };
    match kind % 3 {
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

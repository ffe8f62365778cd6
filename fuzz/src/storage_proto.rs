//! Fuzzes the checks of `dpu.v1`'s volumes and the namespaces made on
//! them with arbitrary bytes decoded as the protobuf requests a client
//! sends: the first byte picks `CreateVolumeRequest` or
//! `CreateNamespaceRequest`, the rest is the message.
//!
//! Every request goes through `validate::volume` or
//! `validate::namespace` (Ok or an error naming a field, never a panic).
//! What is accepted must be a store of one of a volume's four kinds, in
//! whole blocks of 512 or 4096 bytes, and read back through the API's
//! answer (`convert::volume`) as the same volume; a namespace naming a
//! volume carries a well-formed volume ID and the block size it asked
//! for (0: the volume's). Run with `fuzz/run.sh storage_proto` from the
//! repository root.

use dpu_control::model::Backend;
use dpu_control::{convert, validate};
use dpu_proto::v1 as pb;
use prost::Message;

/// The host NQN a remote backend without one takes.
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000f022";

/// Checks one volume to create, and what an accepted one becomes.
fn volume(r: pb::CreateVolumeRequest) {
    let Some(v) = r.volume else {
        return;
    };
    let Ok((vol, given_uuid)) = validate::volume("volume", &r.volume_id, &v) else {
        return;
    };
    assert_eq!(given_uuid, !v.uuid.is_empty());
    assert!(matches!(vol.block_size, 512 | 4096), "{vol:?}");
    let block = u64::from(vol.block_size);
    match &vol.backend {
        Backend::Ram { size_bytes } | Backend::Null { size_bytes } => {
            assert!(*size_bytes > 0 && size_bytes % block == 0, "{vol:?}")
        }
        Backend::File {
            path, size_bytes, ..
        } => assert!(path.starts_with('/') && size_bytes % block == 0, "{vol:?}"),
        Backend::BlockDevice { path } => assert!(path.starts_with('/'), "{vol:?}"),
        other => panic!("a volume of another kind: {other:?}"),
    }
    if !vol.id.is_empty() {
        validate::volume_id("volume_id", &vol.id).expect("an accepted volume ID");
    }
    // The API's answer for it is accepted again as the same store.
    let out = convert::volume(&vol, None);
    let (again, _) =
        validate::volume("volume", &r.volume_id, &out).expect("an answered volume is accepted");
    assert_eq!(again.backend, vol.backend);
    assert_eq!(again.block_size, vol.block_size);
}

/// Checks one namespace to create.
fn namespace(r: pb::CreateNamespaceRequest) {
    let Some(n) = r.namespace else {
        return;
    };
    let Ok((ns, _, _)) = validate::namespace("namespace", &n, HOST) else {
        return;
    };
    match &ns.backend {
        Backend::Volume { id } => {
            validate::volume_id("volume", id).expect("an accepted volume reference");
            assert_eq!(
                ns.block_size, n.block_size,
                "a volume's namespace keeps what it asked"
            );
        }
        _ => assert!(matches!(ns.block_size, 512 | 4096), "{ns:?}"),
    }
}

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    let Some((&kind, msg)) = data.split_first() else {
        return;
    };
    if kind % 2 == 0 {
        if let Ok(r) = pb::CreateVolumeRequest::decode(msg) {
            volume(r);
        }
    } else if let Ok(r) = pb::CreateNamespaceRequest::decode(msg) {
        namespace(r);
    }
}

//! Namespaces backed by remote NVMe/TCP namespaces, as far as the daemon
//! is concerned: the host NQN the service connects to remote targets with
//! when a namespace names none ([`default_host_nqn`]), and the probe that
//! opens a remote namespace before the control plane stores it
//! ([`probe`], behind [`dpu_control::service::StoreProbe::probe_remote`]),
//! and the listing of a remote subsystem's namespaces ([`list_namespaces`],
//! behind [`dpu_control::service::StoreProbe::probe_remote_namespaces`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dpu_control::model::RemoteNamespace;
use dpu_control::service::{RemoteNamespaceInfo, MAX_LISTED_REMOTE_NAMESPACES};
use dpu_nvmeof::backend::{Backend, RemoteBackend};
use dpu_nvmeof::host::{self, Controller, ControllerOptions, HostIdentity, QueueOptions, Transfer};

/// Where the machine's ID is read from.
pub const MACHINE_ID: &str = "/etc/machine-id";
/// The file in the state directory that keeps the host UUID of a machine
/// without a machine ID.
pub const HOST_ID_FILE: &str = "host-id";
/// What a host NQN of the UUID form starts with (NVMe base specification,
/// "NVMe Qualified Names").
const UUID_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// The host NQN remote namespaces created without one connect with:
/// `configured` (`storage.host_nqn`) when set; else
/// `nqn.2014-08.org.nvmexpress:uuid:<UUID>` with the 32 hex digits of
/// `machine_id` (`/etc/machine-id`) as the UUID; else with a UUID kept in
/// `<state_dir>/host-id`, made at the first start; else, without a state
/// directory (whose namespaces do not outlive the process either), with a
/// UUID of this run's. Logs which.
///
/// # Errors
/// If the state directory's `host-id` cannot be read or made, or does
/// not hold a UUID (naming the file).
pub fn default_host_nqn(
    configured: Option<&str>,
    machine_id: &Path,
    state_dir: Option<&Path>,
) -> Result<String> {
    if let Some(nqn) = configured {
        tracing::info!(
            host_nqn = nqn,
            "remote namespaces' host NQN: storage.host_nqn"
        );
        return Ok(nqn.to_string());
    }
    if let Some(uuid) = std::fs::read_to_string(machine_id)
        .ok()
        .and_then(|t| uuid_of_hex(t.trim()))
    {
        let nqn = format!("{UUID_NQN}{uuid}");
        tracing::info!(host_nqn = %nqn, source = %machine_id.display(), "remote namespaces' host NQN: the machine's ID");
        return Ok(nqn);
    }
    let Some(dir) = state_dir else {
        let nqn = format!("{UUID_NQN}{}", uuid_text(&random_uuid()?));
        tracing::warn!(host_nqn = %nqn, "no machine ID and no state directory: remote namespaces' host NQN is this run's own");
        return Ok(nqn);
    };
    let file = dir.join(HOST_ID_FILE);
    let uuid = kept_uuid(&file)?;
    let nqn = format!("{UUID_NQN}{uuid}");
    tracing::info!(host_nqn = %nqn, source = %file.display(), "remote namespaces' host NQN: the state directory's host ID");
    Ok(nqn)
}

/// The UUID in `file`, made (mode 0600) when there is none.
fn kept_uuid(file: &Path) -> Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let at = || file.display().to_string();
    match std::fs::File::open(file) {
        Ok(f) => {
            let mut text = String::new();
            // A UUID and a line break; anything much longer is not one.
            f.take(64).read_to_string(&mut text).with_context(at)?;
            match uuid_of_hex(&text.trim().replace('-', "")) {
                Some(u) => Ok(u),
                None => bail!(
                    "{}: does not hold a UUID; remove it to have a new one made",
                    at()
                ),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let uuid = uuid_text(&random_uuid()?);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
                .with_context(|| format!("creating {}", at()))?;
            writeln!(f, "{uuid}")
                .and_then(|()| f.sync_all())
                .with_context(|| format!("writing {}", at()))?;
            Ok(uuid)
        }
        Err(e) => Err(e).with_context(at),
    }
}

/// `hex`, 32 hex digits, as a UUID in its text form (lower case), or
/// `None` if it is not that.
fn uuid_of_hex(hex: &str) -> Option<String> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let h = hex.to_ascii_lowercase();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

fn uuid_text(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    uuid_of_hex(&hex).unwrap_or(hex)
}

/// A random (version 4) UUID.
fn random_uuid() -> Result<[u8; 16]> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom for a host UUID")?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Ok(b)
}

/// Opens remote namespace `r` as the target would and checks that a
/// namespace of `block_size`-byte blocks can be served on it: at least
/// one block, and a multiple of the remote's own block size. The
/// connection is closed again; the target makes its own.
///
/// # Errors
/// Why it cannot be opened (naming what failed), or served.
pub fn probe(r: &RemoteNamespace, block_size: u32) -> Result<(), String> {
    let b = RemoteBackend::open(&r.spec()).map_err(|e| {
        // The control plane names the remote namespace itself.
        let text = e.to_string();
        let named = format!("remote namespace {} nsid {}: ", r.subnqn, r.nsid);
        text.strip_prefix(&named)
            .map_or(text.clone(), str::to_string)
    })?;
    if let Some(store) = b.store_block_size() {
        if store == 0 || !block_size.is_multiple_of(store) {
            return Err(format!(
                "the remote namespace's blocks are {store} bytes: block size {block_size} is not \
                 a multiple of them"
            ));
        }
    }
    if b.len() < u64::from(block_size) {
        return Err(format!(
            "the remote namespace is {} bytes, less than one {block_size}-byte block",
            b.len()
        ));
    }
    Ok(())
}

/// Longest wait for one path's connection, and for each command on it,
/// while listing a remote subsystem's namespaces (less when the bound
/// leaves less).
const LIST_STEP: Duration = Duration::from_secs(3);
/// Bytes of Identify data.
const IDENTIFY_LEN: usize = 4096;
/// Identify CNS values: namespace, active namespace list, namespace
/// identification descriptors.
const CNS_NAMESPACE: u8 = 0x00;
const CNS_ACTIVE_LIST: u8 = 0x02;
const CNS_DESCRIPTORS: u8 = 0x03;
/// Identify Namespace offsets of the NGUID and the EUI-64.
const NGUID_AT: usize = 104;
const EUI64_AT: usize = 120;
/// Namespace identifier type of a UUID descriptor.
const NIDT_UUID: u8 = 3;

/// Connects to the remote subsystem `subnqn` as `host_nqn` through the
/// first of `paths` that answers and answers its active namespaces in
/// NSID order (at most [`MAX_LISTED_REMOTE_NAMESPACES`]), each with its
/// NGUID and EUI-64 (Identify Namespace), its UUID (the identification
/// descriptors, when the remote answers them) and its size. Each step
/// waits at most [`LIST_STEP`], and the whole at most `bound`. The
/// connection is dropped afterwards (no shutdown is awaited).
///
/// # Errors
/// No path answered (naming each and what it answered), or `bound`
/// passed.
pub fn list_namespaces(
    paths: &[SocketAddr],
    subnqn: &str,
    host_nqn: &str,
    bound: Duration,
) -> Result<Vec<RemoteNamespaceInfo>, String> {
    let deadline = Instant::now() + bound;
    let host = HostIdentity::new(host_nqn, dpu_nvmeof::target::host_id_of(host_nqn));
    let mut why = Vec::with_capacity(paths.len());
    for addr in paths {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            why.push(format!("{addr}: not tried, out of time"));
            continue;
        }
        match list_on(*addr, &host, subnqn, left.min(LIST_STEP), deadline) {
            Ok(v) => return Ok(v),
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    if paths.is_empty() {
        return Err("no path to connect through".into());
    }
    Err(format!("no path answered ({})", why.join("; ")))
}

/// [`list_namespaces`] on one path, each step within `step`.
fn list_on(
    addr: SocketAddr,
    host: &HostIdentity,
    subnqn: &str,
    step: Duration,
    deadline: Instant,
) -> Result<Vec<RemoteNamespaceInfo>, String> {
    let text = |e: host::Error| e.to_string();
    let stream = TcpStream::connect_timeout(&addr, step).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let opts = ControllerOptions {
        kato: Duration::ZERO,
        queue: QueueOptions {
            entries: 4,
            timeout: Some(step),
            ..QueueOptions::default()
        },
    };
    let mut c = Controller::connect(stream, host, subnqn, &opts).map_err(text)?;
    let identify = |c: &mut Controller<TcpStream>, cns: u8, nsid: u32| {
        if Instant::now() >= deadline {
            return Err("out of time".to_string());
        }
        c.admin()
            .call(
                host::identify(cns, nsid),
                Transfer::Read(vec![0; IDENTIFY_LEN]),
            )
            .map(|done| done.data)
            .map_err(text)
    };
    let list = identify(&mut c, CNS_ACTIVE_LIST, 0)?;
    let nsids: Vec<u32> = list
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .take_while(|&n| n != 0)
        .take(MAX_LISTED_REMOTE_NAMESPACES)
        .collect();
    let mut out = Vec::with_capacity(nsids.len());
    for nsid in nsids {
        let id = identify(&mut c, CNS_NAMESPACE, nsid)?;
        let size = match host::NamespaceSize::parse(&id, nsid) {
            Ok(s) => s,
            // Gone since the list was read.
            Err(host::Error::InactiveNamespace { .. }) => continue,
            Err(e) => return Err(format!("namespace {nsid}: {e}")),
        };
        let mut info = RemoteNamespaceInfo {
            nsid,
            block_size: size.block_size,
            blocks: size.blocks,
            ..Default::default()
        };
        if let Some(b) = id.get(NGUID_AT..NGUID_AT + 16) {
            info.nguid.copy_from_slice(b);
        }
        if let Some(b) = id.get(EUI64_AT..EUI64_AT + 8) {
            info.eui64.copy_from_slice(b);
        }
        // A remote without the descriptors gives no UUID.
        if let Ok(d) = identify(&mut c, CNS_DESCRIPTORS, nsid) {
            info.uuid = descriptor_uuid(&d).unwrap_or_default();
        }
        out.push(info);
    }
    Ok(out)
}

/// The UUID in a Namespace Identification Descriptor list, if any.
fn descriptor_uuid(d: &[u8]) -> Option<[u8; 16]> {
    let mut at = 0;
    while let Some(&[nidt, nidl, _, _]) = d.get(at..at + 4) {
        if nidt == 0 {
            return None;
        }
        let len = usize::from(nidl);
        let id = d.get(at + 4..at + 4 + len)?;
        if nidt == NIDT_UUID && len == 16 {
            let mut u = [0u8; 16];
            u.copy_from_slice(id);
            return Some(u);
        }
        at += 4 + len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configured NQN wins; else the machine's ID, as a UUID.
    #[test]
    fn configured_then_machine_id() {
        let dir = tempfile::tempdir().unwrap();
        let id = dir.path().join("machine-id");
        std::fs::write(&id, "0123456789ABCDEF0123456789abcdef\n").unwrap();
        assert_eq!(
            default_host_nqn(Some("nqn.2024-01.io.example:me"), &id, None).unwrap(),
            "nqn.2024-01.io.example:me"
        );
        assert_eq!(
            default_host_nqn(None, &id, None).unwrap(),
            "nqn.2014-08.org.nvmexpress:uuid:01234567-89ab-cdef-0123-456789abcdef"
        );
        assert!(!dir.path().join(HOST_ID_FILE).exists(), "nothing written");
    }

    /// Without a machine ID (or with one that is not 32 hex digits, as
    /// "uninitialized" early in a boot), the state directory keeps one
    /// UUID across starts; without either, each run has its own.
    #[test]
    fn without_a_machine_id_the_state_directory_keeps_one() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("no-machine-id");
        let odd = dir.path().join("machine-id");
        std::fs::write(&odd, "uninitialized\n").unwrap();
        let first = default_host_nqn(None, &none, Some(dir.path())).unwrap();
        assert!(first.starts_with(UUID_NQN), "{first}");
        let uuid = &first[UUID_NQN.len()..];
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert_eq!(&uuid[14..15], "4", "a version 4 UUID: {uuid}");
        dpu_control::validate::nqn("n", &first).unwrap();
        assert_eq!(
            default_host_nqn(None, &odd, Some(dir.path())).unwrap(),
            first,
            "kept across starts"
        );
        let file = dir.path().join(HOST_ID_FILE);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&file, "not a uuid\n").unwrap();
        let e = format!(
            "{:#}",
            default_host_nqn(None, &none, Some(dir.path())).unwrap_err()
        );
        assert!(e.contains("host-id: does not hold a UUID"), "{e}");
        let a = default_host_nqn(None, &none, None).unwrap();
        let b = default_host_nqn(None, &none, None).unwrap();
        assert_ne!(a, b);
        dpu_control::validate::nqn("n", &a).unwrap();
    }

    /// A remote that answers on none of its paths is refused within the
    /// connect timeouts, naming each path.
    #[test]
    fn a_remote_that_does_not_answer_is_named() {
        // Ports nothing listens on.
        let closed = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap()
        };
        let (a, b) = (closed(), closed());
        let r = RemoteNamespace {
            paths: vec![a, b],
            subnqn: "nqn.2024-01.io.example:far".into(),
            nsid: 1,
            host_nqn: "nqn.2024-01.io.example:me".into(),
            dhchap_secret: None,
            io_timeout_ms: 1_000,
            connect_timeout_ms: 1_000,
            queue_depth: 2,
        };
        let t = std::time::Instant::now();
        let e = probe(&r, 512).unwrap_err();
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            t.elapsed()
        );
        for p in [a, b] {
            assert!(e.contains(&p.to_string()), "{p}: {e}");
        }
        assert!(
            !e.starts_with("remote namespace"),
            "named once, by the caller: {e}"
        );
    }

    /// The UUID descriptor is found after the others; a list without one,
    /// or cut short, has none.
    #[test]
    fn the_uuid_descriptor_is_read() {
        let d = dpu_nvmeof::identify::namespace_descriptors(Some([1; 8]), [2; 16], [3; 16]);
        assert_eq!(descriptor_uuid(&d), Some([3; 16]));
        let d = dpu_nvmeof::identify::namespace_descriptors(None, [2; 16], [0; 16]);
        assert_eq!(descriptor_uuid(&d), None);
        let mut cut = dpu_nvmeof::identify::namespace_descriptors(None, [2; 16], [3; 16]);
        cut.truncate(30);
        assert_eq!(descriptor_uuid(&cut), None);
    }

    /// A subsystem that answers on none of its paths is refused within
    /// the bound, naming each path.
    #[test]
    fn listing_a_remote_that_does_not_answer_names_each_path() {
        let closed = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap()
        };
        let (a, b) = (closed(), closed());
        let t = Instant::now();
        let e = list_namespaces(
            &[a, b],
            "nqn.2024-01.io.example:far",
            "nqn.2024-01.io.example:me",
            Duration::from_secs(5),
        )
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        for p in [a, b] {
            assert!(e.contains(&p.to_string()), "{p}: {e}");
        }
        let e = list_namespaces(&[a], "n", "h", Duration::ZERO).unwrap_err();
        assert!(e.contains("out of time"), "{e}");
    }
}

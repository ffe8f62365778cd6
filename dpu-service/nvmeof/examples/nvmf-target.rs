//! A bare NVMe/TCP target for benchmarks: the same target and transport the
//! daemon runs, without the control plane. Serves one subsystem with one
//! namespace to any host until killed.
//!
//! ```text
//! cargo run --release -p dpu-nvmeof --example nvmf-target -- \
//!     [--listen 127.0.0.1:4420] [--ram 1G | --null 1G] [--nqn NQN] \
//!     [--io-cpus 2,3] [--poll-groups N] [--qos-iops N] [--qos-bandwidth 200M] \
//!     [--tls-key HOSTNQN=FILE [--secure-channel required|allowed] [--tls-v0 compat]]
//! cargo run --release -p dpu-nvmeof --example nvmf-target -- \
//!     --rbd POOL/IMAGE --mon-host MONS --ceph-user USER [--ceph-key-file F]
//! cargo run --release -p dpu-nvmeof --example nvmf-target -- \
//!     --remote ADDR:PORT [--remote ADDR:PORT]... --remote-nqn NQN \
//!     [--remote-nsid 1] [--host-nqn NQN] [--remote-queue-depth 128]
//! ```
//!
//! `--rbd` serves an RBD image of a Ceph cluster (monitors `--mon-host`,
//! as Ceph's `mon_host` takes them; the user's key alone in
//! `--ceph-key-file`, or a cluster without cephx), the feature `rbd`.
//!
//! `--remote` serves namespace `--remote-nsid` (default 1) of subsystem
//! `--remote-nqn` of another NVMe/TCP target, reached as `--host-nqn`
//! (default [`HOST_NQN`]) on the paths given, in order of preference (up
//! to four; the next takes over when one fails), with at most
//! `--remote-queue-depth` commands in flight to it (default 128). The
//! namespace served has 512-byte blocks, so the remote's must have 512
//! too: one of 4096-byte blocks is refused with an error saying so.
//!
//! `--qos-iops` and `--qos-bandwidth` limit the namespace's commands and
//! bytes per second, all hosts together ([`dpu_nvmeof::qos`]); a limit
//! never reached measures what the limiter costs.
//!
//! `--tls-key HOSTNQN=FILE` (repeatable) gives host HOSTNQN the TLS
//! pre-shared key in FILE (the interchange format, `NVMeTLSkey-1:01:..:`)
//! and makes the listener speak TLS: `--secure-channel` `required` (the
//! default with a key) or `allowed` (clear text too, for hosts without
//! one). The key's host must then use TLS. `--tls-v0 compat` derives the
//! TLS PSK of version 0 identities as libnvme long did (Debian 13's
//! nvme-cli 2.13; see [`dpu_nvmeof::dpu_tls::Derivation`]); version 1
//! identities say which derivation their host used.
//!
//! `--io-cpus` is the daemon's `storage.io_cpus`: one I/O poll group pinned
//! to each CPU listed, the transport's other threads off them.
//! `--poll-groups` is `storage.poll_groups`: how many unpinned I/O poll
//! groups run when no I/O CPUs are given (default: one per CPU the process
//! may use). Neither places a remote namespace's initiator thread
//! (`nvmf-remote`): it may run on any CPU the process may, so `taskset` the
//! whole process to keep a remote namespace's work on given CPUs.

use std::collections::BTreeSet;
use std::time::Duration;

use dpu_nvmeof::dpu_tls::{ConfiguredPsk, Derivation};
use dpu_nvmeof::qos::QosLimits;
use dpu_nvmeof::target::RemoteNamespace;
use dpu_nvmeof::{
    BackendSpec, NamespaceConfig, RbdCluster, SecureChannel, SubsystemConfig, Target, TargetConfig,
    TcpConfig, TcpTransport,
};

/// The host NQN `--remote` connects with unless `--host-nqn` names one.
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6470752d-7365-7276-6963-652d62656e63";

/// Block size of the namespace served.
const BLOCK_SIZE: u32 = 512;

/// Reports a bad argument or setup and exits.
fn fail(msg: &str) -> ! {
    eprintln!("nvmf-target: {msg}");
    std::process::exit(2);
}

/// A comma-separated list of CPU numbers, e.g. "2,3".
fn cpus(s: &str) -> Vec<usize> {
    s.split(',')
        .map(|c| {
            c.trim().parse().unwrap_or_else(|_| {
                fail(&format!(
                    "--io-cpus takes CPU numbers such as 2,3, not {s:?}"
                ))
            })
        })
        .collect()
}

fn size(s: &str) -> u64 {
    let (n, m) = match s.as_bytes().last() {
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(m))
        .unwrap_or_else(|| fail(&format!("{s:?} is not a size such as 1G")))
}

fn main() {
    // Before any thread starts: they all leave SIGTERM to `wait` below.
    let term = dpu_os::signal::Termination::block()
        .unwrap_or_else(|e| fail(&format!("cannot block SIGTERM: {e}")));
    let mut listen = "127.0.0.1:4420".to_string();
    let mut nqn = "nqn.2024-01.io.dpu-service:dev".to_string();
    let mut tls_keys: Vec<(String, ConfiguredPsk)> = Vec::new();
    let mut channel: Option<SecureChannel> = None;
    let mut v0 = Derivation::Spec;
    let mut backend = BackendSpec::Ram { size: 1 << 30 };
    let mut tcp = TcpConfig::default();
    let (mut rbd, mut mon_host, mut user, mut key) = (None, None, "admin".to_string(), None);
    let (mut remote, mut remote_nqn, mut remote_nsid) = (Vec::new(), None, 1u32);
    let (mut host_nqn, mut remote_qd) = (HOST_NQN.to_string(), None);
    let mut qos = QosLimits::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args
            .next()
            .unwrap_or_else(|| fail(&format!("{a} needs a value")));
        match a.as_str() {
            "--listen" => listen = v,
            "--nqn" => nqn = v,
            "--ram" => backend = BackendSpec::Ram { size: size(&v) },
            "--null" => backend = BackendSpec::Null { size: size(&v) },
            "--io-cpus" => tcp.io_cpus = cpus(&v),
            "--rbd" => rbd = Some(v),
            "--mon-host" => mon_host = Some(v),
            "--ceph-user" => user = v,
            "--ceph-key-file" => {
                let k = std::fs::read_to_string(&v)
                    .unwrap_or_else(|e| fail(&format!("--ceph-key-file {v}: {e}")));
                key = Some(k.trim().to_string());
            }
            "--remote" => remote.push(
                v.parse()
                    .unwrap_or_else(|_| fail(&format!("--remote takes ADDR:PORT, not {v:?}"))),
            ),
            "--remote-nqn" => remote_nqn = Some(v),
            "--remote-nsid" => {
                remote_nsid = v
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--remote-nsid takes an NSID, not {v:?}")))
            }
            "--host-nqn" => host_nqn = v,
            "--remote-queue-depth" => {
                remote_qd = Some(v.parse().unwrap_or_else(|_| {
                    fail(&format!("--remote-queue-depth takes a count, not {v:?}"))
                }))
            }
            "--qos-iops" => {
                qos.iops = v
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--qos-iops takes a count, not {v:?}")))
            }
            "--qos-bandwidth" => qos.bandwidth = size(&v),
            "--tls-key" => {
                let (host, file) = v
                    .split_once('=')
                    .unwrap_or_else(|| fail(&format!("--tls-key takes HOSTNQN=FILE, not {v:?}")));
                let text = std::fs::read_to_string(file)
                    .unwrap_or_else(|e| fail(&format!("--tls-key {file}: {e}")));
                let key = ConfiguredPsk::parse(&text)
                    .unwrap_or_else(|e| fail(&format!("--tls-key {file}: {e}")));
                tls_keys.push((host.to_string(), key));
            }
            "--tls-v0" => {
                v0 = match v.as_str() {
                    "spec" => Derivation::Spec,
                    "compat" => Derivation::Compat,
                    _ => fail(&format!("--tls-v0 takes spec or compat, not {v:?}")),
                }
            }
            "--secure-channel" => {
                channel = Some(v.parse().unwrap_or_else(|e: String| fail(&e)));
            }
            "--poll-groups" => {
                tcp.poll_groups = v
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--poll-groups takes a count, not {v:?}")))
            }
            _ => fail(&format!("unknown argument {a}")),
        }
    }
    if let Some(r) = rbd {
        let (pool, image) = r
            .split_once('/')
            .unwrap_or_else(|| fail(&format!("--rbd takes POOL/IMAGE, not {r:?}")));
        backend = BackendSpec::Rbd {
            cluster: RbdCluster {
                name: "bench".into(),
                mon_host: mon_host.unwrap_or_else(|| fail("--rbd needs --mon-host")),
                user,
                key,
                op_timeout: Duration::from_secs(30),
                connect_timeout: Duration::from_secs(10),
            },
            pool: pool.into(),
            image: image.into(),
        };
    }
    if !remote.is_empty() {
        if matches!(backend, BackendSpec::Rbd { .. }) {
            fail("--remote and --rbd each name the namespace served: give one");
        }
        let nqn = remote_nqn.unwrap_or_else(|| fail("--remote needs --remote-nqn"));
        let mut spec = RemoteNamespace::new(remote, &nqn, remote_nsid, &host_nqn);
        if let Some(qd) = remote_qd {
            spec.queue_depth = qd;
        }
        spec.validate().unwrap_or_else(|e| fail(&e));
        backend = BackendSpec::Remote(spec);
    } else if remote_nqn.is_some() {
        fail("--remote-nqn needs --remote ADDR:PORT");
    }
    let addr = listen
        .parse()
        .unwrap_or_else(|_| fail(&format!("--listen takes HOST:PORT, not {listen:?}")));
    let config = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: nqn.clone(),
            serial: "bench".into(),
            model: "dpu-service".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 32,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size: BLOCK_SIZE,
                uuid: [1; 16],
                nguid: [2; 16],
                backend,
                qos,
            }],
            listeners: vec![addr],
            host_qos: Default::default(),
        }],
        discovery: None,
    };
    let target = Target::new();
    if let Some(e) = target.apply(&config).first() {
        fail(&e.to_string());
    }
    for (host, key) in tls_keys.iter() {
        target.set_tls_key(&nqn, host, Some(key.clone().with_v0_derivation(v0)));
    }
    let channel = channel.unwrap_or(if tls_keys.is_empty() {
        SecureChannel::None
    } else {
        SecureChannel::Required
    });
    target.set_secure_channel(addr, channel);
    let transport =
        TcpTransport::with_config(target.clone(), &tcp).unwrap_or_else(|e| fail(&e.to_string()));
    if let Some((a, e)) = transport.set_listeners(&config.listen_addrs()).first() {
        fail(&format!("listen {a}: {e}"));
    }
    println!("serving {nqn} on {listen}");
    let _ = term.wait();
    // Stopped here, not killed: the backend closes (an RBD image releases
    // its lock for the next client at once).
    transport.shutdown();
    target.apply(&TargetConfig {
        subsystems: Vec::new(),
        discovery: None,
    });
    drop((transport, target));
    if !dpu_nvmeof::backend::wait_closed(Duration::from_secs(60)) {
        fail("the backend did not close within 60 s");
    }
}

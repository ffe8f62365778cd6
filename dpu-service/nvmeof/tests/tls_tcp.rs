//! The secure channel through the TCP transport: a host with its key
//! connects over TLS 1.3 and does I/O (both cipher suites, both identity
//! versions), hosts and hellos that must not get in are refused and
//! counted, a listener that allows TLS serves clear text too, and a flood
//! of silent TLS connections holds a bounded place while a host keeps
//! its I/O.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dpu_nvmeof::dpu_tls::{ConfiguredPsk, Connector, PskHash};
use dpu_nvmeof::host::{self, Controller, ControllerOptions, Error, HostIdentity, Transfer, Wire};
use dpu_nvmeof::{BackendSpec, NamespaceConfig, SecureChannel, SubsystemConfig, Target};
use dpu_nvmeof::{TargetConfig, TcpTransport};

const NQN: &str = "nqn.2024-01.io.example:tls";
const OTHER_NQN: &str = "nqn.2024-01.io.example:tls-other";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-tls";
const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

fn subsystem(nqn: &str, listeners: Vec<SocketAddr>) -> SubsystemConfig {
    SubsystemConfig {
        nqn: nqn.into(),
        serial: "SN-TLS".into(),
        model: "tls".into(),
        allow_any_host: true,
        allowed_hosts: BTreeSet::new(),
        max_namespaces: 4,
        namespaces: vec![NamespaceConfig {
            eui64: None,
            nsid: 1,
            block_size: 512,
            uuid: [1; 16],
            nguid: [2; 16],
            backend: BackendSpec::Ram { size: 4 << 20 },
            qos: Default::default(),
        }],
        listeners,
        host_qos: Default::default(),
    }
}

/// A target serving NQN and OTHER_NQN on one listener that speaks TLS as
/// `channel`, HOST holding KEY on NQN (and `key384` on OTHER_NQN).
fn target(channel: SecureChannel) -> (Target, TcpTransport, SocketAddr) {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let t = Target::new();
    let errors = t.apply(&TargetConfig {
        subsystems: vec![subsystem(NQN, vec![addr]), subsystem(OTHER_NQN, vec![addr])],
        discovery: None,
    });
    assert!(errors.is_empty(), "{errors:?}");
    t.set_secure_channel(addr, channel);
    t.set_tls_key(NQN, HOST, Some(ConfiguredPsk::parse(KEY).unwrap()));
    t.set_tls_key(OTHER_NQN, HOST, Some(key384()));
    let tr = TcpTransport::new(t.clone());
    assert!(tr.set_listeners(&BTreeSet::from([addr])).is_empty());
    (t, tr, addr)
}

fn key384() -> ConfiguredPsk {
    ConfiguredPsk::new(&[0x5a; 48], Some(PskHash::Sha384)).unwrap()
}

fn opts() -> ControllerOptions {
    let mut o = ControllerOptions::default();
    o.queue.timeout = Some(Duration::from_secs(10));
    // As nvmf-perf: PDUs of up to 4 MiB of data.
    o.queue.max_data = 1 << 22;
    o
}

fn me() -> HostIdentity {
    HostIdentity::new(HOST, [9; 16])
}

fn dial(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A TLS session to `addr` as `hostnqn` with `key`, naming `subnqn`.
fn tls(
    addr: SocketAddr,
    key: &ConfiguredPsk,
    version: u8,
    hostnqn: &str,
    subnqn: &str,
) -> Result<dpu_nvmeof::dpu_tls::Session, String> {
    Connector::for_key(key, version, hostnqn, subnqn)
        .unwrap()
        .connect(dial(addr))
        .map_err(|e| e.to_string())
}

/// Writes a pattern through an I/O queue in 8 KiB commands (in the
/// capsule) and reads it back in one 64 KiB command (several TLS records).
fn io_round_trip<W: Wire, V: Wire>(mut c: Controller<W>, wire: V, seed: u8) {
    c.set_io_queues(1).unwrap();
    let mut q = c.io_queue(wire, 1, 32).unwrap();
    let data: Vec<u8> = (0..64 * 1024)
        .map(|i| (i as u8).wrapping_mul(seed))
        .collect();
    for (i, chunk) in data.chunks(8192).enumerate() {
        let w = q
            .call(
                host::write(1, 8 + 16 * i as u64, 15),
                Transfer::Write(chunk.to_vec()),
            )
            .unwrap();
        assert_eq!(w.cqe.status >> 1, 0, "write");
    }
    let r = q
        .call(host::read(1, 8, 127), Transfer::Read(vec![0; data.len()]))
        .unwrap();
    assert_eq!(r.cqe.status >> 1, 0, "read");
    assert!(r.data == data, "the data read back differs");
}

#[test]
fn a_host_with_its_key_does_io_over_tls() {
    let (t, _tr, addr) = target(SecureChannel::Required);
    let key = ConfiguredPsk::parse(KEY).unwrap();
    for version in [0, 1] {
        let s = tls(addr, &key, version, HOST, NQN).unwrap();
        assert_eq!(s.cipher(), "TLS_AES_128_GCM_SHA256");
        let c = Controller::connect(s, &me(), NQN, &opts()).unwrap();
        let q = tls(addr, &key, version, HOST, NQN).unwrap();
        io_round_trip(c, q, 3 + version);
    }
    // The SHA-384 suite, on the other subsystem.
    let s = tls(addr, &key384(), 1, HOST, OTHER_NQN).unwrap();
    assert_eq!(s.cipher(), "TLS_AES_256_GCM_SHA384");
    let c = Controller::connect(s, &me(), OTHER_NQN, &opts()).unwrap();
    io_round_trip(c, tls(addr, &key384(), 1, HOST, OTHER_NQN).unwrap(), 5);
    assert_eq!(t.stats().tls.handshakes.load(Ordering::Relaxed), 6);
}

#[test]
fn hosts_that_must_not_get_in_are_refused_and_counted() {
    let (t, _tr, addr) = target(SecureChannel::Required);
    let tls_stats = &t.stats().tls;
    let key = ConfiguredPsk::parse(KEY).unwrap();

    // Clear text on a listener that requires TLS: closed before the ICReq
    // is answered.
    let e = Controller::connect(dial(addr), &me(), NQN, &opts()).unwrap_err();
    assert!(matches!(e, Error::Closed | Error::Io(_)), "{e}");
    eventually(|| tls_stats.clear_text_refused.load(Ordering::Relaxed) == 1);

    // A wrong key: the handshake fails.
    let wrong = ConfiguredPsk::new(&[1; 32], Some(PskHash::Sha256)).unwrap();
    assert!(tls(addr, &wrong, 0, HOST, NQN).is_err());
    eventually(|| tls_stats.failed.load(Ordering::Relaxed) == 1);

    // A host without a key: refused by its identity.
    assert!(tls(
        addr,
        &key,
        1,
        "nqn.2014-08.org.nvmexpress:uuid:stranger",
        NQN
    )
    .is_err());
    eventually(|| tls_stats.refused_unknown_key.load(Ordering::Relaxed) == 1);

    // A session for one subsystem cannot Connect to another (HOST's key
    // on OTHER_NQN would make an identity for OTHER_NQN).
    let s = tls(addr, &key, 1, HOST, NQN).unwrap();
    let e = Controller::connect(s, &me(), OTHER_NQN, &opts()).unwrap_err();
    assert!(matches!(e, Error::Status { .. }), "{e}");
    // Nor as another host.
    let s = tls(addr, &key, 1, HOST, NQN).unwrap();
    let other = HostIdentity::new("nqn.2014-08.org.nvmexpress:uuid:someone-else", [8; 16]);
    assert!(Controller::connect(s, &other, NQN, &opts()).is_err());
    assert_eq!(
        tls_stats.connects_identity_mismatch.load(Ordering::Relaxed),
        2
    );

    // A hello that never finishes: closed at the handshake timeout.
    let mut half = dial(addr);
    half.write_all(&[0x16, 3, 1, 0, 200, 1]).unwrap();
    half.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 16];
    let _ = std::io::Read::read(&mut half, &mut b);
    assert!(t0.elapsed() < Duration::from_secs(12), "{:?}", t0.elapsed());
    eventually(|| tls_stats.timeouts.load(Ordering::Relaxed) == 1);
}

#[test]
fn an_allowing_listener_serves_clear_text_but_not_to_hosts_that_must_use_tls() {
    let (t, _tr, addr) = target(SecureChannel::Allowed);
    // A host without a key comes in clear text.
    let stranger = HostIdentity::new("nqn.2014-08.org.nvmexpress:uuid:clear", [7; 16]);
    let c = Controller::connect(dial(addr), &stranger, NQN, &opts()).unwrap();
    io_round_trip(c, dial(addr), 9);
    // HOST has a key on NQN: in clear text its Connect is refused.
    let e = Controller::connect(dial(addr), &me(), NQN, &opts()).unwrap_err();
    assert!(matches!(e, Error::Status { .. }), "{e}");
    assert_eq!(
        t.stats().tls.connects_without_tls.load(Ordering::Relaxed),
        1
    );
    // Over TLS it gets in.
    let key = ConfiguredPsk::parse(KEY).unwrap();
    let c =
        Controller::connect(tls(addr, &key, 0, HOST, NQN).unwrap(), &me(), NQN, &opts()).unwrap();
    io_round_trip(c, tls(addr, &key, 0, HOST, NQN).unwrap(), 11);
    // Unless the subsystem lets it in either way.
    t.set_tls_required(NQN, Some(false));
    Controller::connect(dial(addr), &me(), NQN, &opts()).unwrap();
}

/// Many connections from one address that start a hello and stop: at
/// most 64 (the per-address bound) are held, the rest closed at once, and
/// a host from another address connects and does its TLS I/O meanwhile.
#[test]
fn a_flood_of_stalled_hellos_holds_a_bounded_place() {
    let (t, _tr, addr) = target(SecureChannel::Required);
    let flooder: IpAddr = "127.0.0.2".parse().unwrap();
    let mut flood = Vec::new();
    for _ in 0..300 {
        let mut s = dial_from(flooder, addr);
        let _ = s.write_all(&[0x16, 3, 1, 0, 200, 1]);
        flood.push(s);
    }
    eventually(|| t.stats().tls.busy.load(Ordering::Relaxed) >= 300 - 64);
    let key = ConfiguredPsk::parse(KEY).unwrap();
    let c =
        Controller::connect(tls(addr, &key, 1, HOST, NQN).unwrap(), &me(), NQN, &opts()).unwrap();
    io_round_trip(c, tls(addr, &key, 1, HOST, NQN).unwrap(), 13);
    assert_eq!(t.stats().tls.busy.load(Ordering::Relaxed), 300 - 64);
    drop(flood);
}

/// A TCP connection to `addr` from source address `src`.
fn dial_from(src: IpAddr, addr: SocketAddr) -> TcpStream {
    use rustix::net::{bind, connect, socket, AddressFamily, SocketType};
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    bind(&fd, &SocketAddr::new(src, 0)).unwrap();
    connect(&fd, &addr).unwrap();
    TcpStream::from(fd)
}

fn eventually(mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "not within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

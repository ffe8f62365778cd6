//! The secure channel on an endpoint: a host of the harness that speaks
//! TLS through its own detached session, clear text where TLS is
//! required or allowed, and handshakes that stall or are garbage.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use dpu_nvmeof::auth::pool::DhPool;
use dpu_nvmeof::dpu_tls::{
    ConfiguredPsk, Connector, Detached, Handshake, PskHash, Session as TlsSession, Step,
};
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::Cqe;
use dpu_nvmeof::{host, SecureChannel, Target};
use smoltcp::iface::SocketHandle;
use smoltcp::socket::tcp;

use crate::testing::*;

const MIB: u64 = 1 << 20;

fn key() -> ConfiguredPsk {
    ConfiguredPsk::new(&[0x5a; 32], Some(PskHash::Sha256)).unwrap()
}

/// A target whose listener on the endpoint speaks TLS as `channel`, with
/// [`key`] for [`HOSTNQN`] on [`NQN`].
fn tls_target(channel: SecureChannel) -> Target {
    let t = target(8 * MIB);
    t.set_secure_channel(SocketAddr::new(EP_IP.into(), PORT), channel);
    t.set_tls_key(NQN, HOSTNQN, Some(key()));
    t
}

/// The pair, the endpoint running its handshakes on a pool of one thread.
fn pair(t: &Target) -> Pair {
    let mut p = Pair::new(config(1500), t.clone());
    p.ep.set_dh_pool(Arc::new(DhPool::new(1, 4).unwrap()));
    p
}

fn tls(t: &Target) -> &dpu_nvmeof::target::TlsStats {
    &t.stats().tls
}

/// A host socket from `port`, connected.
fn connected(p: &mut Pair, port: u16) -> SocketHandle {
    let h = p.open(port, 1 << 20);
    assert!(p.run(STEPS, |p| p.socket(h).state() == tcp::State::Established));
    h
}

/// Sends what `out` holds; returns how much went.
fn send(p: &mut Pair, h: SocketHandle, out: &[u8]) -> usize {
    p.socket(h).send_slice(out).unwrap_or(0)
}

/// The host's TLS session on `h`, made by `c` (None: refused).
fn handshake(p: &mut Pair, h: SocketHandle, c: &Connector) -> Option<TlsSession<Detached>> {
    drive(p, h, c.start(Detached).unwrap())
}

/// Drives the host's handshake `shake` on `h` to its end.
fn drive(
    p: &mut Pair,
    h: SocketHandle,
    mut shake: Handshake<Detached>,
) -> Option<TlsSession<Detached>> {
    let mut buf = vec![0; 64 << 10];
    for _ in 0..STEPS {
        let step = shake.step();
        let n = send(p, h, shake.output());
        shake.sent(n);
        match step {
            Ok(Step::Done) if shake.output().is_empty() => return Some(shake.finish()),
            Ok(_) => {}
            Err(_) => return None,
        }
        p.step();
        let s = p.socket(h);
        if s.can_recv() {
            let n = s.recv_slice(&mut buf).unwrap();
            shake.feed(&buf[..n]);
        } else if !s.is_active() {
            return None;
        } else {
            pool_pace();
        }
    }
    None
}

/// Waits a little in real time: the endpoint's steps run on a pool
/// thread while the harness's clock is simulated, and a round without
/// traffic moves that clock by a millisecond, so an idle loop must not
/// run the clock past the handshake timeout while the pool works.
fn pool_pace() {
    std::thread::sleep(Duration::from_micros(200));
}

/// Seals `bytes` and sends them.
fn write(p: &mut Pair, h: SocketHandle, s: &mut TlsSession<Detached>, bytes: &[u8]) {
    use std::io::Write;
    s.write_all(bytes).unwrap();
    while !s.output().is_empty() {
        let n = send(p, h, s.output());
        s.sent(n);
        p.step();
    }
}

/// The next PDU from the endpoint, opened from TLS records (None: the
/// connection ended first).
fn next_pdu(
    p: &mut Pair,
    h: SocketHandle,
    s: &mut TlsSession<Detached>,
    inbox: &mut Vec<u8>,
) -> Option<Option<Cqe>> {
    let limits = Limits {
        digests: Digests::default(),
        max_data: 1 << 20,
    };
    let mut buf = vec![0; 64 << 10];
    for _ in 0..STEPS {
        if let Ok(Some((pdu, n))) = pdu::decode_controller(inbox, &limits) {
            let cqe = match pdu {
                ControllerPdu::CapsuleResp { cqe } => Some(cqe),
                _ => None,
            };
            inbox.drain(..n);
            return Some(cqe);
        }
        p.step();
        let sock = p.socket(h);
        if sock.can_recv() {
            let n = sock.recv_slice(&mut buf).unwrap();
            s.feed(&buf[..n]);
        } else if !sock.is_active() {
            return None;
        } else {
            pool_pace();
        }
        loop {
            match s.read_available(&mut buf) {
                Ok(0) => return None,
                Ok(n) => inbox.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
    }
    None
}

/// ICReq, ICResp and an admin Connect naming `hostnqn`, over TLS.
fn connect_over_tls(
    p: &mut Pair,
    h: SocketHandle,
    s: &mut TlsSession<Detached>,
    hostnqn: &str,
) -> Option<Cqe> {
    let mut inbox = Vec::new();
    let mut b = Vec::new();
    host::ic_req(&mut b, Digests::default());
    write(p, h, s, &b);
    next_pdu(p, h, s, &mut inbox)?;
    let mut b = Vec::new();
    let data = host::connect_data([7; 16], 0xffff, NQN, hostnqn);
    pdu::encode_capsule_cmd(
        &mut b,
        Digests::default(),
        &host::connect(3, 0, 32, 0),
        &data,
    );
    write(p, h, s, &b);
    next_pdu(p, h, s, &mut inbox)?
}

/// A host with the key handshakes on the pool (TLS_AES_128_GCM_SHA256)
/// and connects under its identity; naming another host in the Connect
/// over that session is refused, as in the kernel transport.
#[test]
fn a_host_with_its_key_connects_over_tls() {
    let t = tls_target(SecureChannel::Required);
    let mut p = pair(&t);
    let c = Connector::for_key(&key(), 1, HOSTNQN, NQN).unwrap();

    let h = connected(&mut p, 40000);
    let mut s = handshake(&mut p, h, &c).expect("the handshake completes");
    assert_eq!(s.cipher(), "TLS_AES_128_GCM_SHA256");
    let cqe = connect_over_tls(&mut p, h, &mut s, HOSTNQN).expect("a CapsuleResp");
    assert_eq!(cqe.status, 0, "{cqe:?}");
    assert_eq!(tls(&t).handshakes.load(Ordering::Relaxed), 1);
    // Quiet, the session gives its buffers back at the next tick.
    assert!(p.ep.tls_buffer_bytes() > 0);
    p.now += Duration::from_millis(200);
    assert!(p.run(STEPS, |p| p.ep.tls_buffer_bytes() == 0));

    let h2 = connected(&mut p, 40001);
    let mut s2 = handshake(&mut p, h2, &c).expect("the handshake completes");
    let cqe = connect_over_tls(&mut p, h2, &mut s2, "nqn.2014-08.org.nvmexpress:uuid:other");
    assert!(cqe.is_none_or(|c| c.status != 0), "{cqe:?}");
    assert_eq!(
        tls(&t).connects_identity_mismatch.load(Ordering::Relaxed),
        1
    );
}

/// A step the pool's full queue does not take waits for room, and the
/// handshake completes once the pool has some: a burst of hosts is
/// served in turn, not refused.
#[test]
fn a_handshake_waits_for_room_on_a_full_pool() {
    let t = tls_target(SecureChannel::Required);
    let mut p = Pair::new(config(1500), t.clone());
    let pool = Arc::new(DhPool::new(1, 1).unwrap());
    p.ep.set_dh_pool(pool.clone());
    // The pool's thread held, and its queue of one taken.
    let owner = Arc::new(());
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    pool.run_for(Arc::downgrade(&owner), move || {
        let _ = started_tx.send(());
        let _ = held.recv_timeout(Duration::from_secs(30));
    })
    .unwrap();
    started.recv_timeout(Duration::from_secs(30)).unwrap();
    pool.run_for(Arc::downgrade(&owner), || {}).unwrap();

    let h = connected(&mut p, 40000);
    let c = Connector::for_key(&key(), 1, HOSTNQN, NQN).unwrap();
    let mut shake = c.start(Detached).unwrap();
    // The ClientHello, made and sent.
    assert_ne!(shake.step().unwrap(), Step::Done);
    let n = send(&mut p, h, shake.output());
    shake.sent(n);
    for _ in 0..200 {
        p.step();
    }
    assert!(!p.socket(h).can_recv(), "no answer while the pool is full");
    assert_eq!(p.ep.open_connections(), 1, "the connection waits");
    drop(release);
    let mut s = drive(&mut p, h, shake).expect("the handshake completes");
    let cqe = connect_over_tls(&mut p, h, &mut s, HOSTNQN).expect("a CapsuleResp");
    assert_eq!(cqe.status, 0, "{cqe:?}");
    assert_eq!(tls(&t).busy.load(Ordering::Relaxed), 0);
}

/// A wrong key and an unknown host are refused at the handshake, each
/// counted, and their connections closed.
#[test]
fn wrong_keys_are_refused_and_counted() {
    let t = tls_target(SecureChannel::Required);
    let mut p = pair(&t);
    let wrong = ConfiguredPsk::new(&[0x11; 32], Some(PskHash::Sha256)).unwrap();
    for (port, c) in [
        (40000, Connector::for_key(&wrong, 0, HOSTNQN, NQN).unwrap()),
        (
            40001,
            Connector::for_key(&key(), 1, "nqn.2014-08.org.nvmexpress:uuid:nobody", NQN).unwrap(),
        ),
    ] {
        let h = connected(&mut p, port);
        assert!(handshake(&mut p, h, &c).is_none());
        assert!(p.run(STEPS, |p| !p.socket(h).is_active()));
    }
    assert_eq!(tls(&t).failed.load(Ordering::Relaxed), 1);
    assert_eq!(tls(&t).refused_unknown_key.load(Ordering::Relaxed), 1);
    assert_eq!(tls(&t).handshakes.load(Ordering::Relaxed), 0);
    assert!(p.run(STEPS, |p| p.ep.open_connections() == 0));
}

/// Clear text: refused (counted) where TLS is required, served where it
/// is allowed; a host with a key is still refused at its Connect there.
#[test]
fn clear_text_where_tls_is_required_or_allowed() {
    let t = tls_target(SecureChannel::Required);
    let mut p = pair(&t);
    assert!(NvmeHost::open(&mut p, 40000).is_err());
    assert_eq!(tls(&t).clear_text_refused.load(Ordering::Relaxed), 1);

    let t = tls_target(SecureChannel::Allowed);
    let mut p = pair(&t);
    let mut a = NvmeHost::open(&mut p, 40000).expect("clear text is allowed");
    let cqe = a.connect(&mut p, 0, 0xffff);
    assert_ne!(cqe.status, 0, "a host with a key must use TLS");
    assert_eq!(tls(&t).connects_without_tls.load(Ordering::Relaxed), 1);
    t.set_tls_key(NQN, HOSTNQN, None);
    let (_admin, _cntlid) = NvmeHost::admin(&mut p, 40001);
}

/// A hello that never ends holds its connection for the handshake
/// timeout, then is closed and counted; a handshake record longer than
/// TLS allows fails at once. The steps run on the endpoint's thread here
/// (no pool), so the simulated clock measures them.
#[test]
fn stalled_and_garbage_handshakes_end() {
    let t = tls_target(SecureChannel::Allowed);
    let mut p = Pair::new(config(1500), t.clone());
    let h = connected(&mut p, 40000);
    assert_eq!(send(&mut p, h, &[0x16, 0x03, 0x01]), 3);
    let start = p.now;
    assert!(p.run(STEPS, |p| !p.socket(h).is_active()));
    let took = p.now - start;
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(12),
        "{took:?}"
    );
    assert_eq!(tls(&t).timeouts.load(Ordering::Relaxed), 1);

    let h = connected(&mut p, 40001);
    // A handshake record longer than TLS allows.
    let junk = [0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(send(&mut p, h, &junk), junk.len());
    let start = p.now;
    // Closed at once: the host sees the endpoint's FIN.
    assert!(p.run(STEPS, |p| p.socket(h).state() != tcp::State::Established));
    assert!(
        p.now - start < Duration::from_secs(1),
        "{:?}",
        p.now - start
    );
    assert_eq!(tls(&t).failed.load(Ordering::Relaxed), 1);
    assert!(p.run(STEPS, |p| p.ep.open_connections() == 0));
}

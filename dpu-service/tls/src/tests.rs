use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::*;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const SUB: &str = "nqn.2014-08.org.nvmexpress:uuid:36ebf5a9-1df9-47b3-a6d0-e9ba32e428a2";
const SPEC_KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

fn key384() -> ConfiguredPsk {
    ConfiguredPsk::new(&[0x42; 48], Some(PskHash::Sha384)).unwrap()
}

/// An acceptor knowing `key` for HOST on SUB only.
fn acceptor(key: ConfiguredPsk) -> Acceptor {
    Acceptor::new(Arc::new(move |sub: &str, host: &str| {
        (sub == SUB && host == HOST).then(|| key.clone())
    }))
    .unwrap()
}

/// Serves one connection: the handshake (non-blocking, as the target
/// drives it), then echoes everything back until the host closes.
fn serve(acc: Acceptor) -> (u16, thread::JoinHandle<Result<Session, HandshakeError>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut h = acc.start(s).unwrap();
        loop {
            match h.step()? {
                Step::Done => break,
                _ => thread::sleep(Duration::from_millis(1)),
            }
        }
        let mut session = h.finish();
        let mut buf = vec![0; 64 * 1024];
        let mut echo = Vec::new();
        loop {
            match session.read_available(&mut buf) {
                Ok(0) => break,
                Ok(n) => echo.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            while !echo.is_empty() {
                match session.write_vectored(&[IoSlice::new(&echo)]) {
                    Ok(n) => {
                        echo.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if echo.is_empty() {
                let _ = session.flush_pending()?;
            }
            thread::sleep(Duration::from_micros(100));
        }
        Ok(session)
    });
    (port, t)
}

/// What [`serve_detached`] ends with: the session and the most
/// ciphertext it held.
type Served = Result<(Session<Detached>, usize), HandshakeError>;

/// As [`serve`], with the session [`Detached`]: this thread moves the
/// ciphertext between the socket and the session, in pieces of at most
/// `piece` bytes, as a TCP/IP stack of the caller's own would. Returns
/// the most ciphertext the session held to send at once.
fn serve_detached(acc: Acceptor, piece: usize) -> (u16, thread::JoinHandle<Served>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut buf = vec![0; piece];
        // Reads what the socket has (None: closed).
        let take = |s: &mut TcpStream, buf: &mut [u8]| match s.read(buf) {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(0),
            Err(e) => panic!("{e}"),
        };
        let send = |s: &mut TcpStream, out: &[u8]| -> usize {
            match s.write(&out[..out.len().min(piece)]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => panic!("{e}"),
            }
        };
        let mut h = acc.start(Detached).unwrap();
        loop {
            let step = h.step()?;
            while !h.output().is_empty() {
                let n = send(&mut s, h.output());
                h.sent(n);
            }
            if step == Step::Done {
                break;
            }
            match take(&mut s, &mut buf) {
                None => return Err(HandshakeError::Tls("closed".into())),
                Some(0) => thread::sleep(Duration::from_millis(1)),
                Some(n) => h.feed(&buf[..n]),
            }
        }
        let mut session = h.finish();
        let mut plain = vec![0; 64 * 1024];
        let mut echo = Vec::new();
        let mut most = 0;
        loop {
            match take(&mut s, &mut buf) {
                None => break,
                Some(n) => session.feed(&buf[..n]),
            }
            loop {
                match session.read_available(&mut plain) {
                    Ok(0) => break,
                    Ok(n) => echo.extend_from_slice(&plain[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
            }
            while !echo.is_empty() {
                match session.write_vectored(&[IoSlice::new(&echo)]) {
                    Ok(n) => {
                        echo.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.into()),
                }
                most = most.max(session.output().len());
                let n = send(&mut s, session.output());
                session.sent(n);
            }
            let n = send(&mut s, session.output());
            session.sent(n);
            thread::sleep(Duration::from_micros(100));
        }
        Ok((session, most))
    });
    (port, t)
}

fn dial(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn hosts_with_the_key_get_both_cipher_suites_and_identity_versions() {
    for (key, suite) in [
        (
            ConfiguredPsk::parse(SPEC_KEY).unwrap(),
            "TLS_AES_128_GCM_SHA256",
        ),
        (key384(), "TLS_AES_256_GCM_SHA384"),
    ] {
        for version in [0, 1] {
            let (port, server) = serve(acceptor(key.clone()));
            let c = Connector::for_key(&key, version, HOST, SUB).unwrap();
            let mut s = c.connect(dial(port)).unwrap();
            assert_eq!(s.cipher(), suite);
            // More than a record, both ways, through a non-blocking echo.
            let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
            let mut got = Vec::new();
            for chunk in data.chunks(50_000) {
                s.write_all(chunk).unwrap();
                s.flush().unwrap();
                let mut buf = vec![0; chunk.len()];
                s.read_exact(&mut buf).unwrap();
                got.extend_from_slice(&buf);
            }
            assert!(got == data, "the echo differs");
            // Quiet, the session gives its buffers back; it works on.
            assert!(s.buffer_capacity() > 0);
            s.release_idle_buffers();
            assert_eq!(s.buffer_capacity(), 0);
            s.write_all(b"again").unwrap();
            let mut again = [0u8; 5];
            s.read_exact(&mut again).unwrap();
            assert_eq!(&again, b"again");
            s.shutdown();
            drop(s);
            let served = server.join().unwrap().unwrap();
            let id = served.identity().unwrap();
            assert_eq!(
                (id.version, &*id.hostnqn, &*id.subnqn),
                (version, HOST, SUB)
            );
            assert_eq!(id.hash, key.hash());
        }
    }
}

/// A detached session (its ciphertext moved by the caller, in pieces as
/// small as 1 byte) handshakes and echoes as one on a socket does, and
/// holds at most one batch of records to send.
#[test]
fn detached_sessions_handshake_and_carry_data_whatever_the_pieces() {
    let key = key384();
    for piece in [1, 1500, 64 * 1024] {
        let (port, server) = serve_detached(acceptor(key.clone()), piece);
        let c = Connector::for_key(&key, 1, HOST, SUB).unwrap();
        let mut s = c.connect(dial(port)).unwrap();
        let data: Vec<u8> = (0..(if piece == 1 { 3_000 } else { 300_000 }) as u32)
            .map(|i| (i * 13 % 251) as u8)
            .collect();
        let mut got = Vec::new();
        for chunk in data.chunks(70_000) {
            s.write_all(chunk).unwrap();
            s.flush().unwrap();
            let mut buf = vec![0; chunk.len()];
            s.read_exact(&mut buf).unwrap();
            got.extend_from_slice(&buf);
        }
        assert!(got == data, "piece {piece}: the echo differs");
        s.shutdown();
        drop(s);
        let (served, most) = server.join().unwrap().unwrap();
        assert_eq!(served.identity().unwrap().hostnqn, HOST);
        assert_eq!(served.cipher(), "TLS_AES_256_GCM_SHA384");
        assert!(
            most <= TX_BATCH + 32 * 64,
            "piece {piece}: {most} bytes held"
        );
    }
}

/// Fed a wrong key's hello, a detached handshake fails as one on a socket
/// does, and says nothing to send before it is fed.
#[test]
fn detached_handshakes_refuse_what_socket_ones_refuse() {
    let key = ConfiguredPsk::parse(SPEC_KEY).unwrap();
    let wrong = ConfiguredPsk::new(&[9; 32], Some(PskHash::Sha256)).unwrap();
    let (port, server) = serve_detached(acceptor(key), 4096);
    let c = Connector::for_key(&wrong, 0, HOST, SUB).unwrap();
    assert!(c.connect(dial(port)).is_err());
    let e = server.join().unwrap().unwrap_err();
    assert_eq!(e.reason(), "handshake_failed", "{e}");
    let (port, server) = serve_detached(acceptor(ConfiguredPsk::parse(SPEC_KEY).unwrap()), 4096);
    let c = Connector::for_key(&wrong, 1, HOST, SUB).unwrap();
    assert!(c.connect(dial(port)).is_err());
    let e = server.join().unwrap().unwrap_err();
    assert_eq!(e.reason(), "bad_identity", "{e}");
    let mut h = acceptor(key384()).start(Detached).unwrap();
    assert_eq!(h.step().unwrap(), Step::Read);
    assert!(h.output().is_empty());
}

#[test]
fn a_wrong_key_an_unknown_host_and_no_key_are_refused() {
    let key = ConfiguredPsk::parse(SPEC_KEY).unwrap();
    let wrong = ConfiguredPsk::new(&[9; 32], Some(PskHash::Sha256)).unwrap();

    // Version 0 carries no digest: the handshake itself finds the key wrong.
    let (port, server) = serve(acceptor(key.clone()));
    let c = Connector::for_key(&wrong, 0, HOST, SUB).unwrap();
    assert!(c.connect(dial(port)).is_err());
    let e = server.join().unwrap().unwrap_err();
    assert_eq!(e.reason(), "handshake_failed", "{e}");

    // Version 1's digest names the wrong key before the handshake does.
    let (port, server) = serve(acceptor(key.clone()));
    let c = Connector::for_key(&wrong, 1, HOST, SUB).unwrap();
    assert!(c.connect(dial(port)).is_err());
    let e = server.join().unwrap().unwrap_err();
    assert_eq!(e.reason(), "bad_identity", "{e}");
    assert!(e.to_string().contains("does not match"), "{e}");

    // Another host, with a key of its own, has none here.
    let (port, server) = serve(acceptor(key.clone()));
    let c = Connector::for_key(&key, 0, "nqn.other-host", SUB).unwrap();
    assert!(c.connect(dial(port)).is_err());
    let e = server.join().unwrap().unwrap_err();
    assert_eq!(e.reason(), "unknown_key", "{e}");
    assert!(e.to_string().contains("nqn.other-host"), "{e}");

    // A host of the right key but another hash's suite.
    let (port, server) = serve(acceptor(key384()));
    let c = Connector::for_key(&key, 0, HOST, SUB).unwrap();
    assert!(c.connect(dial(port)).is_err());
    assert!(server.join().unwrap().is_err());

    // Clear text where TLS is spoken: an NVMe/TCP ICReq.
    let (port, server) = serve(acceptor(key));
    let mut s = dial(port);
    let mut icreq = [0u8; 128];
    icreq[..8].copy_from_slice(&[0, 0, 128, 0, 128, 0, 0, 0]);
    s.write_all(&icreq).unwrap();
    let e = server.join().unwrap().unwrap_err();
    assert_eq!(e.reason(), "handshake_failed", "{e}");
}

/// `openssl s_client`, a client not built from this crate, with the TLS
/// PSK and identity derived here.
#[test]
fn openssl_s_client_connects_with_the_derived_psk() {
    let key = ConfiguredPsk::parse(SPEC_KEY).unwrap();
    let (identity, psk) = key.tls_psk(0, HOST, SUB);
    let hex: String = psk.key.iter().map(|b| format!("{b:02x}")).collect();
    let (port, server) = serve(acceptor(key));
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256", "-psk"])
        .arg(&hex)
        .arg("-psk_identity")
        .arg(&identity)
        .args(["-quiet", "-no_ign_eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl, from Debian's openssl package");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ping over TLS\n").unwrap();
    // The echo comes back before stdin closes.
    let mut stdout = child.stdout.take().unwrap();
    let mut got = [0u8; 14];
    stdout.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping over TLS\n");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = server.join().unwrap().unwrap();
    assert_eq!(served.cipher(), "TLS_AES_128_GCM_SHA256");
    assert_eq!(served.identity().unwrap().to_string(), identity);
}

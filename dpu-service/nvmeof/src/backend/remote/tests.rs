//! The remote backend against this crate's own target, in-process over
//! loopback TCP, with a proxy between them that can stop forwarding (a
//! remote that hangs) or cut every connection (a path that fails).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::*;
use crate::backend::suite::eventually;
use crate::backend::watch;
use crate::backend::{is_out_of_range, is_unavailable};
use crate::target::{BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use crate::tcp::{TcpConfig, TcpTransport};

const NQN: &str = "nqn.2024-01.io.example:remote-backend";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7e7e7e7e-0000-4000-8000-000000000001";
const MIB: u64 = 1 << 20;

/// A remote target: one RAM namespace of `size` bytes and `block`-byte
/// blocks, on a loopback port of its own.
struct Remote {
    target: Target,
    _transport: TcpTransport,
    addr: SocketAddr,
    cfg: TargetConfig,
}

impl Remote {
    fn start(size: u64, block: u32) -> Self {
        let target = Target::new();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut cfg = TargetConfig {
            subsystems: vec![SubsystemConfig {
                nqn: NQN.into(),
                serial: "SN-REMOTE".into(),
                model: "remote".into(),
                allow_any_host: true,
                allowed_hosts: BTreeSet::new(),
                max_namespaces: 4,
                namespaces: vec![NamespaceConfig {
                    eui64: None,
                    nsid: 1,
                    block_size: block,
                    uuid: [3; 16],
                    nguid: [4; 16],
                    backend: BackendSpec::Ram { size },
                    qos: Default::default(),
                }],
                listeners: vec![any],
                host_qos: Default::default(),
            }],
            discovery: None,
        };
        let transport = TcpTransport::with_config(
            target.clone(),
            &TcpConfig {
                poll_groups: 1,
                ..TcpConfig::default()
            },
        )
        .unwrap();
        assert!(transport.set_listeners(&cfg.listen_addrs()).is_empty());
        let addr = transport.bound()[&any];
        cfg.subsystems[0].listeners = vec![addr];
        assert!(target.apply(&cfg).is_empty());
        Self {
            target,
            _transport: transport,
            addr,
            cfg,
        }
    }

    fn resize(&mut self, size: u64) {
        self.cfg.subsystems[0].namespaces[0].backend = BackendSpec::Ram { size };
        assert!(self.target.apply(&self.cfg).is_empty());
    }
}

/// A TCP proxy in front of `upstream` that can hold every byte (a hung
/// remote) or cut every connection and refuse new ones (a failed path).
struct Proxy {
    addr: SocketAddr,
    held: Arc<AtomicBool>,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (held, cut, stop) = (Arc::default(), Arc::default(), Arc::default());
        let (h, c, s): (Arc<AtomicBool>, Arc<AtomicBool>, Arc<AtomicBool>) =
            (Arc::clone(&held), Arc::clone(&cut), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) if !c.load(Ordering::Relaxed) => {
                        let Ok(up) = TcpStream::connect(upstream) else {
                            continue;
                        };
                        for (from, to) in [
                            (down.try_clone().unwrap(), up.try_clone().unwrap()),
                            (up, down),
                        ] {
                            let (h, c, s) = (h.clone(), c.clone(), s.clone());
                            std::thread::spawn(move || pipe(from, to, &h, &c, &s));
                        }
                    }
                    Ok((down, _)) => drop(down),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            addr,
            held,
            cut,
            stop,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` until either ends, holding bytes while `held`,
/// ending both when `cut` or `stop`.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    held: &AtomicBool,
    cut: &AtomicBool,
    stop: &AtomicBool,
) {
    from.set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap();
    let mut buf = vec![0u8; 256 << 10];
    let over = || cut.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed);
    loop {
        if over() {
            break;
        }
        if held.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Bytes read as the hold began are held too.
                while held.load(Ordering::Relaxed) && !over() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

fn spec(paths: Vec<SocketAddr>) -> RemoteNamespace {
    let mut s = RemoteNamespace::new(paths, NQN, 1, HOST);
    s.io_timeout = Duration::from_secs(1);
    s.connect_timeout = Duration::from_secs(1);
    s.queue_depth = 16;
    s
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8 ^ seed | 1)
        .collect()
}

fn read(b: &RemoteBackend, offset: u64, n: usize) -> io::Result<Vec<u8>> {
    let mut v = vec![0xEE; n];
    b.read_at(offset, &mut v).map(|()| v)
}

/// Starts `io` and waits for its result.
fn run(b: &RemoteBackend, io: Io) -> io::Result<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    b.start(io, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(20)).expect("an answer")
}

#[test]
fn serves_a_namespace_of_another_target() {
    let remote = Remote::start(8 * MIB, 512);
    let b = RemoteBackend::open(&spec(vec![remote.addr])).unwrap();
    assert_eq!(
        (b.kind(), b.len(), b.store_block_size()),
        ("remote", 8 * MIB, Some(512))
    );
    assert!(b.asynchronous() && b.reachable());

    // 3 MiB: cut at the remote's MDTS (512 KiB) both ways.
    let data = pattern(1, 3 * MIB as usize);
    b.write_at(512, &data, true).unwrap();
    assert_eq!(read(&b, 512, data.len()).unwrap(), data);
    assert_eq!(read(&b, 0, 512).unwrap(), vec![0; 512]);
    b.flush().unwrap();

    // Zeroing and deallocating read back as zeros; the neighbours stay.
    b.write_zeroes(4096, 8192).unwrap();
    b.deallocate(MIB, MIB).unwrap();
    let back = read(&b, 512, data.len()).unwrap();
    let mut want = data.clone();
    want[4096 - 512..4096 - 512 + 8192].fill(0);
    want[MIB as usize - 512..2 * MIB as usize - 512].fill(0);
    assert_eq!(back, want);

    // Beyond the end, and not in whole blocks: errors, not I/O.
    let e = read(&b, 8 * MIB - 512, 1024).unwrap_err();
    assert!(is_out_of_range(&e), "{e}");
    let e = b.write_at(100, &[1; 512], false).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(b.resize(MIB).is_err());
}

#[test]
fn many_operations_at_once_complete_in_any_order() {
    let remote = Remote::start(64 * MIB, 4096);
    let b = Arc::new(RemoteBackend::open(&spec(vec![remote.addr])).unwrap());
    // More than the queue's depth: the rest wait their turn.
    let n = 300usize;
    let (tx, rx) = mpsc::channel();
    for i in 0..n {
        let tx = tx.clone();
        let len = 4096 * (1 + i % 40);
        b.start(
            Io::Write {
                offset: (i as u64) * 40 * 4096,
                data: pattern(i as u8, len),
                fua: false,
            },
            Box::new(move |r| tx.send((i, r)).unwrap()),
        );
    }
    for _ in 0..n {
        let (i, r) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(
            r.unwrap(),
            pattern(i as u8, 4096 * (1 + i % 40)),
            "write {i} hands its data back"
        );
    }
    for i in (0..n).step_by(7) {
        let len = 4096 * (1 + i % 40);
        let got = run(
            &b,
            Io::Read {
                offset: (i as u64) * 40 * 4096,
                buf: vec![0; len],
            },
        )
        .unwrap();
        assert_eq!(got, pattern(i as u8, len));
    }
    assert_eq!(
        (
            b.shared.ops.load(Ordering::Acquire),
            b.shared.bytes.load(Ordering::Acquire)
        ),
        (0, 0)
    );
}

/// A poll group's thread that starts operations is lent the I/O queue's
/// socket (through the backend's poller) and completes them itself when
/// it is readable; the initiator thread stops reading it meanwhile, and
/// reads it again once the group has forgotten the backend.
#[test]
fn a_poll_group_that_starts_operations_reads_their_completions_itself() {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let remote = Remote::start(8 * MIB, 512);
    let b = RemoteBackend::open(&spec(vec![remote.addr])).unwrap();
    std::thread::spawn(move || {
        let me = std::thread::current().id();
        watch::serve_here();
        let n = 40;
        let (tx, rx) = mpsc::channel();
        let mut on_me = 0;
        let mut watched = None;
        for i in 0..n {
            let tx = tx.clone();
            b.start(
                Io::Write {
                    offset: i * 4096,
                    data: pattern(i as u8, 4096),
                    fua: false,
                },
                Box::new(move |r| tx.send((std::thread::current().id(), r)).unwrap()),
            );
            if let Some(r) = watch::take_new().pop() {
                assert_eq!(b.shared.watchers.load(Ordering::Acquire), 1);
                watched = Some(r);
            }
            let r = watched.as_ref().expect("the backend asked to be watched");
            // What a poll group does: wait for the poller, then read
            // (the initiator thread may have read what came first).
            let deadline = Instant::now() + Duration::from_secs(20);
            let (thread, result) = loop {
                if let Ok(got) = rx.try_recv() {
                    break got;
                }
                assert!(Instant::now() < deadline, "completion {i} in time");
                let fd = r.ready_fd();
                let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                let t = Timespec {
                    tv_sec: 0,
                    tv_nsec: 10_000_000,
                };
                if poll(&mut fds, Some(&t)).unwrap() == 1 {
                    r.on_ready();
                }
            };
            result.unwrap();
            on_me += usize::from(thread == me);
        }
        // The initiator thread sweeps too (every 50 ms while commands are
        // out); a group that answers the poller at once finds nearly all.
        assert!(
            on_me >= n as usize / 2,
            "{on_me} of {n} on the group's thread"
        );
        assert!(watch::take_new().is_empty(), "watched once");

        // Another poll group starting operations is not lent the queue
        // while this one reads it (its completions are handed to it).
        let b = Arc::new(b);
        let other = b.clone();
        std::thread::spawn(move || {
            watch::serve_here();
            let data = run(
                &other,
                Io::Read {
                    offset: 0,
                    buf: vec![0; 4096],
                },
            )
            .unwrap();
            assert_eq!(data, pattern(0, 4096));
            assert!(watch::take_new().is_empty(), "one group reads the queue");
        })
        .join()
        .unwrap();
        assert_eq!(b.shared.watchers.load(Ordering::Acquire), 1);

        // Forgotten: the initiator thread reads the queue again, at once.
        let r = watched.take().unwrap();
        watch::forget_here(r.watch_id());
        r.unwatched();
        drop(r);
        assert_eq!(b.shared.watchers.load(Ordering::Acquire), 0);
        std::thread::spawn(move || {
            for i in 0..n {
                assert_eq!(read(&b, i * 4096, 4096).unwrap(), pattern(i as u8, 4096));
            }
        })
        .join()
        .unwrap();
    })
    .join()
    .unwrap();
}

#[test]
fn the_size_follows_the_remote() {
    let mut remote = Remote::start(4 * MIB, 512);
    let b = RemoteBackend::open(&spec(vec![remote.addr])).unwrap();
    let told = Arc::new(AtomicUsize::new(0));
    let t = told.clone();
    b.on_resize(Box::new(move || {
        t.fetch_add(1, Ordering::Relaxed);
    }));
    remote.resize(6 * MIB);
    eventually("the new size", || b.len() == 6 * MIB);
    assert_eq!(told.load(Ordering::Relaxed), 1);
    b.write_at(5 * MIB, &[9; 4096], false).unwrap();
}

#[test]
fn a_hung_remote_is_an_answer_within_the_timeout_and_io_resumes() {
    let remote = Remote::start(4 * MIB, 512);
    let proxy = Proxy::start(remote.addr);
    let b = RemoteBackend::open(&spec(vec![proxy.addr])).unwrap();
    b.write_at(0, &[5; 4096], false).unwrap();

    proxy.held.store(true, Ordering::Relaxed);
    let t = Instant::now();
    let e = run(
        &b,
        Io::Read {
            offset: 0,
            buf: vec![0; 4096],
        },
    )
    .map(|_| ())
    .unwrap_err();
    let took = t.elapsed();
    assert!(is_unavailable(&e), "{e}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(!b.reachable());
    // While it is down, an operation waits for a connection, at most the
    // I/O timeout and the attempt under way, then fails.
    let t = Instant::now();
    let e = run(&b, Io::Flush).unwrap_err();
    let took = t.elapsed();
    assert!(is_unavailable(&e), "{e}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "{took:?}"
    );

    proxy.held.store(false, Ordering::Relaxed);
    eventually("reachable again", || b.reachable());
    assert_eq!(read(&b, 0, 4096).unwrap(), vec![5; 4096]);
}

#[test]
fn an_outage_shorter_than_the_timeout_is_a_pause() {
    let remote = Remote::start(4 * MIB, 512);
    let proxy = Proxy::start(remote.addr);
    let mut s = spec(vec![proxy.addr]);
    s.io_timeout = Duration::from_secs(5);
    let b = RemoteBackend::open(&s).unwrap();
    b.write_at(0, &[8; 512], false).unwrap();
    proxy.cut.store(true, Ordering::Relaxed);
    eventually("the cut seen", || {
        !b.reachable() || run(&b, Io::Flush).is_err()
    });
    let (tx, rx) = mpsc::channel();
    b.start(
        Io::Read {
            offset: 0,
            buf: vec![0; 512],
        },
        Box::new(move |r| tx.send(r).unwrap()),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(rx.try_recv().is_err(), "it waits");
    proxy.cut.store(false, Ordering::Relaxed);
    let got = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(got, vec![8; 512]);
    assert!(b.reachable());
}

/// An operation started while the connection is down is answered when
/// its wait ends, even while an attempt to connect again hangs for longer.
#[test]
fn waiting_operations_are_answered_while_a_connection_attempt_hangs() {
    let remote = Remote::start(4 * MIB, 512);
    let proxy = Proxy::start(remote.addr);
    let mut s = spec(vec![proxy.addr]);
    s.connect_timeout = Duration::from_secs(4);
    let b = RemoteBackend::open(&s).unwrap();
    b.write_at(0, &[5; 512], false).unwrap();
    // Held: the command in flight times out, and so does every attempt
    // to connect again, after 4 s each.
    proxy.held.store(true, Ordering::Relaxed);
    assert!(is_unavailable(&run(&b, Io::Flush).unwrap_err()));
    let t = Instant::now();
    let e = run(&b, Io::Flush).unwrap_err();
    let took = t.elapsed();
    assert!(is_unavailable(&e), "{e}");
    assert!(took < Duration::from_millis(1800), "{took:?}");
    proxy.held.store(false, Ordering::Relaxed);
    eventually("reachable again", || b.reachable());
    assert_eq!(read(&b, 0, 512).unwrap(), vec![5; 512]);
}

#[test]
fn a_second_path_takes_over() {
    let remote = Remote::start(4 * MIB, 512);
    let (p1, p2) = (Proxy::start(remote.addr), Proxy::start(remote.addr));
    let b = RemoteBackend::open(&spec(vec![p1.addr, p2.addr])).unwrap();
    b.write_at(0, &[6; 512], false).unwrap();
    assert_eq!(b.shared.path.load(Ordering::Acquire), 0);
    p1.cut.store(true, Ordering::Relaxed);
    eventually("reachable on the second path", || {
        b.reachable() && b.shared.path.load(Ordering::Acquire) == 1
    });
    assert_eq!(read(&b, 0, 512).unwrap(), vec![6; 512]);
}

/// Once the first path answers again, the namespace goes back to it
/// without failing what is in flight meanwhile, and closes the second.
#[test]
fn the_first_path_takes_over_again_once_it_answers() {
    let remote = Remote::start(4 * MIB, 512);
    let (p1, p2) = (Proxy::start(remote.addr), Proxy::start(remote.addr));
    let b = Arc::new(RemoteBackend::open(&spec(vec![p1.addr, p2.addr])).unwrap());
    b.write_at(0, &[6; 512], false).unwrap();
    p1.cut.store(true, Ordering::Relaxed);
    eventually("reachable on the second path", || {
        b.reachable() && b.shared.path.load(Ordering::Acquire) == 1
    });
    p1.cut.store(false, Ordering::Relaxed);
    // I/O keeps going while the first path comes back: none of it fails.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load: Vec<_> = (0..4u8)
        .map(|i| {
            let (b, stop, done, failed) = (b.clone(), stop.clone(), done.clone(), failed.clone());
            std::thread::spawn(move || {
                let at = (u64::from(i) + 1) * 4096;
                while !stop.load(Ordering::Relaxed) {
                    let ok = b.write_at(at, &[i; 4096], false).is_ok()
                        && read(&b, at, 4096).is_ok_and(|d| d == vec![i; 4096]);
                    let n = if ok { &done } else { &failed };
                    n.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    while b.shared.path.load(Ordering::Acquire) != 0 {
        assert!(
            start.elapsed() < 3 * link::FAILBACK,
            "still on the second path"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Some I/O after the change, on the first path.
    let after = done.load(Ordering::Relaxed);
    while done.load(Ordering::Relaxed) < after + 20 {
        assert!(
            start.elapsed() < 4 * link::FAILBACK,
            "no I/O after the change"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    load.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(failed.load(Ordering::Relaxed), 0, "operations failed");
    assert!(b.reachable());
    // The second path is closed: cutting it changes nothing.
    p2.cut.store(true, Ordering::Relaxed);
    assert_eq!(read(&b, 0, 512).unwrap(), vec![6; 512]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(b.reachable() && b.shared.path.load(Ordering::Acquire) == 0);
}

#[test]
fn opening_names_every_path_that_did_not_answer() {
    // Both bound at once, so the kernel cannot hand out the same port
    // twice; closed before the backend tries them.
    let held: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let closed: Vec<SocketAddr> = held.iter().map(|l| l.local_addr().unwrap()).collect();
    drop(held);
    let e = RemoteBackend::open(&spec(closed.clone())).unwrap_err();
    let msg = e.to_string();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{msg}");
    assert!(
        closed.iter().all(|a| msg.contains(&a.to_string())) && msg.contains(NQN),
        "{msg}"
    );

    // A namespace the remote does not have.
    let remote = Remote::start(MIB, 512);
    let mut s = spec(vec![remote.addr]);
    s.nsid = 9;
    let e = RemoteBackend::open(&s).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");

    // Bad specifications are refused before any connection.
    s.paths.clear();
    assert_eq!(
        RemoteBackend::open(&s).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

#[test]
fn dropping_returns_at_once_even_while_the_remote_hangs() {
    let remote = Remote::start(MIB, 512);
    let proxy = Proxy::start(remote.addr);
    let b = RemoteBackend::open(&spec(vec![proxy.addr])).unwrap();
    proxy.held.store(true, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    b.start(Io::Flush, Box::new(move |r| tx.send(r).unwrap()));
    let t = Instant::now();
    drop(b);
    assert!(t.elapsed() < Duration::from_millis(100));
    // What was in flight is answered, and the thread ends.
    assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap().is_err());
    assert!(wait_closed(Duration::from_secs(5)));
}

#[test]
fn a_namespace_uses_a_multiple_of_the_remote_block_size() {
    let remote = Remote::start(MIB, 4096);
    let target = Target::new();
    let ns = |block_size| TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: "nqn.2024-01.io.example:front".into(),
            serial: "SN-FRONT".into(),
            model: "front".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 4,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size,
                uuid: [5; 16],
                nguid: [6; 16],
                backend: BackendSpec::Remote(spec(vec![remote.addr])),
                qos: Default::default(),
            }],
            listeners: Vec::new(),
            host_qos: Default::default(),
        }],
        discovery: None,
    };
    let errors = target.apply(&ns(512));
    assert_eq!(errors.len(), 1);
    let msg = errors[0].to_string();
    assert!(
        msg.contains("block size 512") && msg.contains("4096"),
        "{msg}"
    );
    assert!(target.apply(&ns(4096)).is_empty());
}

#[test]
fn a_remote_that_requires_dh_hmac_chap_gets_the_secret() {
    use crate::auth::{HostKeys, Secret};
    // src/auth/vectors.py's host key, and a wrong key of the right form.
    const SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    const WRONG: &str = "DHHC-1:00:WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWloj0TmR:";
    let remote = Remote::start(MIB, 512);
    let keys = HostKeys::new(Secret::parse(SECRET).unwrap(), None);
    remote.target.set_host_keys(NQN, HOST, Some(keys));
    let mut s = spec(vec![remote.addr]);
    let e = RemoteBackend::open(&s).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    s.dhchap_secret = Some(WRONG.into());
    let e = RemoteBackend::open(&s).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    s.dhchap_secret = Some(SECRET.into());
    let b = RemoteBackend::open(&s).unwrap();
    b.write_at(0, &[3; 512], false).unwrap();
    assert_eq!(read(&b, 0, 512).unwrap(), vec![3; 512]);
    // The secret is never printed.
    assert!(!format!("{s:?}").contains("DHHC"));
}

#[test]
fn the_target_bounds_the_data_in_flight_on_its_remote_namespaces() {
    use crate::host::{Controller, ControllerOptions, HostIdentity, Transfer};
    const FRONT: &str = "nqn.2024-01.io.example:front-budget";
    let remote = Remote::start(16 * MIB, 512);
    let proxy = Proxy::start(remote.addr);
    let mut s = spec(vec![proxy.addr]);
    s.io_timeout = Duration::from_secs(20);
    let mut front = Remote::start(MIB, 512);
    front.cfg.subsystems[0].nqn = FRONT.into();
    front.cfg.subsystems[0].namespaces[0].backend = BackendSpec::Remote(s);
    assert!(front.target.apply(&front.cfg).is_empty());
    front.target.set_backend_in_flight_budget(256 << 10);

    let me = HostIdentity::new(HOST, [1; 16]);
    let opts = ControllerOptions::default();
    let ctrl =
        Controller::connect(TcpStream::connect(front.addr).unwrap(), &me, FRONT, &opts).unwrap();
    let mut q = ctrl
        .io_queue(TcpStream::connect(front.addr).unwrap(), 1, 32)
        .unwrap();
    proxy.held.store(true, Ordering::Relaxed);
    // 16 reads of 128 KiB: two fit the budget, the rest wait in the
    // connection.
    for cid in 0..16u16 {
        let sqe = crate::host::read(1, u64::from(cid) * 256, 255);
        q.submit(cid, sqe, Transfer::Read(vec![0; 128 << 10]))
            .unwrap();
    }
    q.flush().unwrap();
    eventually("two reads started", || {
        front.target.backend_in_flight() == 256 << 10
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(front.target.backend_in_flight(), 256 << 10);
    proxy.held.store(false, Ordering::Relaxed);
    for _ in 0..16 {
        assert!(q.wait().unwrap().is_success());
    }
    assert_eq!(front.target.backend_in_flight(), 0);

    // A connection that closes with reads in flight: their completions
    // still give the budget back.
    proxy.held.store(true, Ordering::Relaxed);
    for cid in 0..4u16 {
        let sqe = crate::host::read(1, 0, 255);
        q.submit(cid, sqe, Transfer::Read(vec![0; 128 << 10]))
            .unwrap();
    }
    q.flush().unwrap();
    eventually("reads started", || front.target.backend_in_flight() > 0);
    drop(q);
    drop(ctrl);
    proxy.held.store(false, Ordering::Relaxed);
    eventually("the budget given back", || {
        front.target.backend_in_flight() == 0
    });
}

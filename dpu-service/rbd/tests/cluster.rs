//! Against a real single-node Ceph cluster: connecting (and being
//! refused), images, asynchronous I/O many at a time, resize seen through
//! a watch, and an OSD that stops answering turning into timeouts, not
//! hangs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpu_rbd::testing::TestCluster;
use dpu_rbd::{Cluster, ClusterConfig, Completion, Image};

const MIB: u64 = 1 << 20;

/// Waits for one completion sent by [`done`].
fn wait(rx: &mpsc::Receiver<Completion>) -> Completion {
    rx.recv_timeout(Duration::from_secs(60))
        .expect("a completion within 60 s")
}

fn done(tx: &mpsc::Sender<Completion>) -> dpu_rbd::Done {
    let tx = tx.clone();
    Box::new(move |r| {
        let _ = tx.send(r);
    })
}

fn pattern(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i as u8) ^ (j as u8).wrapping_mul(31))
        .collect()
}

/// Asserts two buffers are equal, printing where they differ (not them).
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {i} is {:#x}, expected {:#x}", got[i], want[i]);
    }
}

fn read(img: &Image, offset: u64, len: usize) -> Vec<u8> {
    let (tx, rx) = mpsc::channel();
    img.read(offset, vec![0xee; len], done(&tx));
    wait(&rx).expect("read")
}

#[test]
fn images_serve_asynchronous_io() {
    let c = TestCluster::start(false);
    let cluster = Cluster::connect(&c.config(Duration::from_secs(10))).expect("connect");
    let pool = cluster.pool("rbd", None).expect("pool");
    pool.create_image("vol1", 64 * MIB).expect("create");
    assert_eq!(
        pool.create_image("vol1", MIB).unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
    let img = pool.open("vol1").expect("open");
    assert_eq!(img.name(), "rbd/vol1");
    assert_eq!(img.size().unwrap(), 64 * MIB);

    // 256 writes of 4 KiB and 16 of 128 KiB at once, then read back.
    let (tx, rx) = mpsc::channel();
    for i in 0..256u64 {
        img.write(i * 8192, pattern(i, 4096), i % 7 == 0, done(&tx));
    }
    for i in 0..16u64 {
        img.write(
            32 * MIB + i * 128 * 1024,
            pattern(1000 + i, 128 * 1024),
            false,
            done(&tx),
        );
    }
    for _ in 0..272 {
        let buf = wait(&rx).expect("write");
        assert!(
            buf.len() == 4096 || buf.len() == 128 * 1024,
            "buffer handed back"
        );
    }
    img.flush(done(&tx));
    assert!(wait(&rx).expect("flush").is_empty());
    for i in (0..256u64).step_by(17) {
        same(
            &read(&img, i * 8192, 4096),
            &pattern(i, 4096),
            "written 4 KiB",
        );
        // Never written: zeros, every byte (the buffer held 0xee).
        same(&read(&img, i * 8192 + 4096, 4096), &[0; 4096], "unwritten");
    }
    for i in 0..16u64 {
        let off = 32 * MIB + i * 128 * 1024;
        same(
            &read(&img, off, 128 * 1024),
            &pattern(1000 + i, 128 * 1024),
            "128 KiB",
        );
    }

    // Discard and write zeroes read back as zeros; the neighbours stay.
    img.discard(8192, 8192, done(&tx));
    wait(&rx).expect("discard");
    img.write_zeroes(32 * MIB, 128 * 1024, done(&tx));
    wait(&rx).expect("write zeroes");
    same(&read(&img, 8192, 4096), &[0; 4096], "discarded 8 KiB");
    same(
        &read(&img, 0, 4096),
        &pattern(0, 4096),
        "beside the discard",
    );
    same(
        &read(&img, 32 * MIB, 128 * 1024),
        &[0; 128 * 1024],
        "zeroed",
    );
    same(
        &read(&img, 32 * MIB + 128 * 1024, 128 * 1024),
        &pattern(1001, 128 * 1024),
        "beside the zeroes",
    );

    // Past the end: an error in the completion, not a panic or a hang.
    img.read(64 * MIB, vec![0; 4096], done(&tx));
    assert!(wait(&rx).is_err());

    // Another client's `rbd` sees our data.
    let exported = c.rbd(&["export", "rbd/vol1", "-"]);
    assert_eq!(exported.len() as u64, 64 * MIB);
    same(&exported[..4096], &pattern(0, 4096), "exported block 0");
    same(
        &exported[17 * 8192..17 * 8192 + 4096],
        &pattern(17, 4096),
        "exported block 17",
    );

    // A resize by another client reaches the watch, and the size follows.
    let changes = Arc::new(AtomicUsize::new(0));
    let seen = changes.clone();
    img.watch(move || {
        seen.fetch_add(1, Ordering::Relaxed);
    })
    .expect("watch");
    c.rbd(&["resize", "rbd/vol1", "--size", "128M"]);
    let t = Instant::now();
    while changes.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(changes.load(Ordering::Relaxed) > 0, "watch called");
    assert_eq!(img.size().unwrap(), 128 * MIB);
    img.resize(96 * MIB).expect("resize");
    assert_eq!(img.size().unwrap(), 96 * MIB);

    // Open images hold the image: removing it is refused until closed.
    assert!(pool.remove_image("vol1").is_err());
    drop(img);
    pool.remove_image("vol1").expect("remove");
    assert!(pool.open("vol1").unwrap_err().is_not_found());
    assert!(cluster.pool("nope", None).unwrap_err().is_not_found());
}

#[test]
fn refusals_and_absences_are_errors_within_the_bound() {
    let c = TestCluster::start(false);
    let mut bad = c.config(Duration::from_secs(5));
    bad.key = Some("AQBmbWxhbmtleW1hZGV1cGJ5dGVzdHMxMjM0NTY3OA==".into());
    let t = Instant::now();
    let e = Cluster::connect(&bad).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(e.what.contains(&c.mon_host), "{e}");

    let mut nobody = c.config(Duration::from_secs(2));
    nobody.user = "nobody".into();
    assert!(Cluster::connect(&nobody).is_err());

    // No monitor at all: refused within connect_timeout, not 300 s.
    let none = ClusterConfig {
        mon_host: "127.0.0.1:9".into(),
        connect_timeout: Duration::from_secs(2),
        ..c.config(Duration::from_secs(2))
    };
    let t = Instant::now();
    let e = Cluster::connect(&none).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(e.what.contains("127.0.0.1:9"), "{e}");
}

#[test]
fn a_stopped_osd_times_operations_out_and_they_resume() {
    let c = TestCluster::start(false);
    let cluster = Cluster::connect(&c.config(Duration::from_secs(3))).expect("connect");
    let pool = cluster.pool("rbd", None).expect("pool");
    pool.create_image("vol", 16 * MIB).expect("create");
    let img = pool.open("vol").expect("open");
    let (tx, rx) = mpsc::channel();
    img.write(0, pattern(1, 4096), false, done(&tx));
    wait(&rx).expect("write before");

    c.freeze_osd();
    let t = Instant::now();
    for i in 0..8u64 {
        img.write(i * 4096, pattern(i, 4096), false, done(&tx));
    }
    img.read(0, vec![0; 4096], done(&tx));
    let mut timeouts = 0;
    for _ in 0..9 {
        match wait(&rx) {
            Err(e) if e.is_timeout() => timeouts += 1,
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
    let took = t.elapsed();
    c.thaw_osd();
    assert_eq!(timeouts, 9);
    assert!(took < Duration::from_secs(15), "bounded: {took:?}");

    // The OSD answers again: so do we, without reopening anything.
    let t = Instant::now();
    loop {
        img.write(0, pattern(2, 4096), false, done(&tx));
        match wait(&rx) {
            Ok(_) => break,
            Err(e) if e.is_timeout() && t.elapsed() < Duration::from_secs(30) => {}
            Err(e) => panic!("did not resume: {e}"),
        }
    }
    same(
        &read(&img, 0, 4096),
        &pattern(2, 4096),
        "after the OSD returned",
    );
}

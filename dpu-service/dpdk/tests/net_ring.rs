#![cfg(feature = "eal")]
//! The safe layer against real DPDK: EAL with `--no-huge` and `net_ring`
//! vdevs (a ring port delivers what it sends back to its own RX queue).
//! EAL starts once per test binary; each test uses its own vdev and pool.

use std::sync::{Arc, OnceLock};

use dpdk::{DpdkError, Eal, EalConfig, Mbuf, MbufBatch, Mempool, Port, PortConfig};

fn eal() -> &'static Eal {
    static EAL: OnceLock<Eal> = OnceLock::new();
    EAL.get_or_init(|| {
        let cfg = EalConfig {
            lcores: Some("0".into()),
            no_huge: true,
            no_pci: true,
            memory_mb: Some(256),
            file_prefix: Some(format!("dpdk-test-{}", std::process::id())),
            vdevs: (0..4).map(|i| format!("net_ring{i}")).collect(),
            log_level: Some("lib.eal:error".into()),
            ..Default::default()
        };
        Eal::init(&cfg).expect("EAL starts with --no-huge")
    })
}

fn pool(name: &str) -> Arc<Mempool> {
    sized_pool(name, 1023)
}

fn sized_pool(name: &str, count: u32) -> Arc<Mempool> {
    Arc::new(Mempool::new(eal(), name, count, 0, 2176).expect("pool"))
}

fn packet(pool: &Mempool, i: u8) -> Mbuf {
    let mut m = Mbuf::alloc(pool).unwrap();
    let data = m.append(60 + usize::from(i)).unwrap();
    data.fill(i);
    m
}

#[test]
fn loopback_delivers_every_byte_and_leaks_nothing() {
    let pool = pool("t-loop");
    {
        let port = Port::open(eal(), "net_ring0", &PortConfig::default(), pool.clone()).unwrap();
        let mut tx = port.tx_queue(0).unwrap();
        let mut rx = port.rx_queue(0).unwrap();
        let mut out = MbufBatch::new();
        for i in 0..32 {
            out.push(packet(&pool, i)).unwrap();
        }
        assert_eq!(pool.in_use(), 32);
        assert_eq!(tx.send(&mut out), 32);
        assert!(out.is_empty());
        let mut inb = MbufBatch::new();
        assert_eq!(rx.recv(&mut inb), 32);
        for (i, m) in inb.as_slice().iter().enumerate() {
            assert_eq!(m.data().len(), 60 + i);
            assert!(m.data().iter().all(|b| usize::from(*b) == i));
            assert_eq!(m.segments(), 1);
        }
        let s = port.stats();
        assert_eq!((s.tx_packets, s.rx_packets), (32, 32));
        assert!(port.link().up);
    }
    assert_eq!(pool.in_use(), 0, "every mbuf went back to the pool");
}

#[test]
fn batches_free_what_they_drop() {
    let pool = pool("t-batch");
    let mut b = MbufBatch::new();
    for i in 0..MbufBatch::CAPACITY {
        b.push(packet(&pool, u8::try_from(i).unwrap())).unwrap();
    }
    let extra = packet(&pool, 0);
    assert!(b.push(extra).is_err(), "a full batch gives the mbuf back");
    assert_eq!(pool.in_use(), 64, "the refused mbuf was freed when dropped");
    b.retain(|m| m.data()[0] % 2 == 0);
    assert_eq!(b.len(), 32);
    assert_eq!(pool.in_use(), 32);
    assert!(b.as_slice().iter().all(|m| m.data()[0] % 2 == 0));
    let first: Vec<Mbuf> = b.drain().take(4).collect();
    assert_eq!(first.len(), 4);
    assert!(b.is_empty());
    drop(first);
    assert_eq!(pool.in_use(), 0, "drained but untaken mbufs are freed too");
    let mut b2 = MbufBatch::new();
    for i in 0..10 {
        b2.push(packet(&pool, i)).unwrap();
    }
    drop(b2);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn unsent_mbufs_stay_in_the_batch() {
    let pool = sized_pool("t-unsent", 8191);
    let cfg = PortConfig {
        rx_descriptors: 64,
        tx_descriptors: 64,
        ..Default::default()
    };
    let port = Port::open(eal(), "net_ring1", &cfg, pool.clone()).unwrap();
    let mut tx = port.tx_queue(0).unwrap();
    let mut sent = 0;
    // The ring behind net_ring holds a bounded number of packets: keep
    // sending without receiving until it refuses some.
    let mut refused = 0;
    for _ in 0..40 {
        let mut b = MbufBatch::new();
        for i in 0..64 {
            b.push(packet(&pool, i)).unwrap();
        }
        sent += tx.send(&mut b);
        refused += b.len();
        if !b.is_empty() {
            break;
        }
    }
    assert!(refused > 0, "the ring never filled");
    let mut rx = port.rx_queue(0).unwrap();
    let mut got = 0;
    loop {
        let mut b = MbufBatch::new();
        let n = rx.recv(&mut b);
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(got, sent);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn queues_are_exclusive_and_checked() {
    let pool = pool("t-queues");
    let port = Port::open(eal(), "net_ring2", &PortConfig::default(), pool).unwrap();
    let q = port.rx_queue(0).unwrap();
    assert!(matches!(
        port.rx_queue(0),
        Err(DpdkError::InvalidArgument(_))
    ));
    assert!(matches!(
        port.rx_queue(5),
        Err(DpdkError::InvalidArgument(_))
    ));
    drop(q);
    port.rx_queue(0).expect("released on drop");
    assert!(!port.name().is_empty());
    assert!(
        port.xstats().iter().any(|(n, _)| n.contains("rx")),
        "{:?}",
        port.xstats()
    );
}

#[test]
fn unknown_port_and_second_init() {
    let pool = pool("t-errors");
    assert!(matches!(
        Port::open(eal(), "net_nope0", &PortConfig::default(), pool),
        Err(DpdkError::NoSuchPort(_))
    ));
    let other = EalConfig {
        no_huge: true,
        ..Default::default()
    };
    assert!(matches!(
        Eal::init(&other),
        Err(DpdkError::AlreadyInitialised)
    ));
    assert!(dpdk::version().starts_with("DPDK "));
}

#[test]
fn vec_bursts_are_zero_copy_and_exact() {
    let pool = pool("t-vec");
    let port = Port::open(eal(), "net_ring3", &PortConfig::default(), pool.clone()).unwrap();
    let mut tx = port.tx_queue(0).unwrap();
    let mut rx = port.rx_queue(0).unwrap();
    let mut out: Vec<Mbuf> = Vec::with_capacity(64);
    for i in 0..40 {
        out.push(packet(&pool, i));
    }
    assert_eq!(tx.send_from(&mut out), 40);
    assert!(out.is_empty());
    let mut inb: Vec<Mbuf> = Vec::with_capacity(32);
    assert_eq!(rx.recv_into(&mut inb, 64), 32, "bounded by spare capacity");
    assert_eq!(rx.recv_into(&mut inb, 64), 0, "no capacity left");
    inb.reserve(8);
    assert_eq!(rx.recv_into(&mut inb, 5), 5, "bounded by max");
    assert!(inb
        .iter()
        .enumerate()
        .all(|(i, m)| usize::from(m.data()[0]) == i));
    drop(inb);
    let mut rest = Vec::with_capacity(64);
    assert_eq!(rx.recv_into(&mut rest, 64), 3);
    drop(rest);
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn registered_threads_get_an_lcore_until_the_guard_drops() {
    let eal = eal().clone();
    std::thread::spawn(move || {
        assert_eq!(dpdk::lcore_id(), None, "a plain thread is not an lcore");
        let guard = eal.register_thread().expect("a free lcore ID");
        assert!(dpdk::lcore_id().is_some());
        drop(guard);
        assert_eq!(dpdk::lcore_id(), None);
    })
    .join()
    .unwrap();
}

#[test]
fn prepend_trim_and_copy_keep_bytes_and_buffers_straight() {
    let pool = pool("edit");
    let mut m = packet(&pool, 3);
    let original = m.data().to_vec();
    let head = m.headroom();
    assert!(head >= 4, "default headroom is RTE_PKTMBUF_HEADROOM");
    m.prepend(4).unwrap()[..4].copy_from_slice(&[1, 2, 3, 4]);
    assert_eq!(&m.data()[..4], &[1, 2, 3, 4]);
    assert_eq!(&m.data()[4..], &original[..]);
    assert_eq!(m.pkt_len() as usize, original.len() + 4);
    assert!(m.prepend(head).is_err(), "more than the headroom left");
    let copy = m.try_clone().unwrap();
    assert_eq!(pool.in_use(), 2);
    assert!(m.trim_front(4));
    assert_eq!(m.data(), &original[..]);
    assert!(!m.trim_front(original.len() + 1));
    assert_eq!(
        &copy.data()[4..],
        &original[..],
        "the copy is its own buffer"
    );
    drop((m, copy));
    assert_eq!(pool.in_use(), 0);
}

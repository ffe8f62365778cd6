use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dpu_control::telemetry::{CounterSource, Counters, ListenerCounters};
use tokio::io::AsyncReadExt;
use tokio_stream::StreamExt;

use super::incoming::Incoming;
use super::{ConnState, Event, Gate, Limits};

fn limits() -> Limits {
    Limits {
        max_connections: 3,
        max_connections_per_source: 2,
        handshake_timeout: Duration::from_millis(300),
        idle_timeout: Some(Duration::from_millis(300)),
        max_watches: 3,
        max_watches_per_connection: 2,
    }
}

fn counters(g: &Gate) -> ListenerCounters {
    let mut c = Counters::default();
    g.collect(&mut c);
    c.listeners["test"]
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn at_a_bound_the_oldest_silent_connection_gives_way_and_callers_keep_theirs() {
    let g = Gate::new("test", limits());
    let a1 = g.admit(addr("10.0.0.1:1000")).expect("first");
    let a2 = g
        .admit(addr("10.0.0.1:1001"))
        .expect("second from one source");
    // At its source's bound, a third displaces the oldest silent one.
    let a3 = g
        .admit(addr("10.0.0.1:1002"))
        .expect("third from one source");
    assert!(a1.state.displaced.load(Ordering::Acquire));
    assert!(g.conn(addr("10.0.0.1:1000")).is_none());
    a2.state.begin_call();
    a3.state.begin_call();
    // Both made calls: a fourth from that source is refused.
    assert!(g.admit(addr("10.0.0.1:1003")).is_none());
    let b1 = g.admit(addr("10.0.0.2:1000")).expect("another source");
    // At the listener's bound, the oldest silent one of any source.
    let c1 = g.admit(addr("10.0.0.3:1000")).expect("displaces b1");
    assert!(b1.state.displaced.load(Ordering::Acquire));
    c1.state.begin_call();
    assert!(g.admit(addr("10.0.0.4:1000")).is_none(), "all made calls");
    let c = counters(&g);
    assert_eq!(
        (
            c.connections,
            c.closed_displaced,
            c.refused_max_connections,
            c.refused_max_connections_per_source
        ),
        (3, 2, 1, 1)
    );
    assert_eq!(lock(&g.table).closing, 2);
    // Places come back as connections close, displaced ones included.
    drop((a1, b1));
    assert_eq!(lock(&g.table).closing, 0);
    drop(a2);
    let a4 = g.admit(addr("10.0.0.1:1004")).expect("a place came back");
    assert!(g.conn(addr("10.0.0.1:1004")).is_some());
    drop((a3, a4, c1));
    assert_eq!(counters(&g).connections, 0);
    assert!(
        lock(&g.table).per_source.is_empty(),
        "no source left behind"
    );
}

#[test]
fn displaced_connections_still_closing_are_bounded() {
    let g = Gate::new("test", limits());
    // Never dropped: their sockets would still be closing.
    let held: Vec<_> = (0..6)
        .filter_map(|i| g.admit(addr(&format!("10.0.1.{i}:1000"))))
        .collect();
    assert_eq!(held.len(), 6, "three live, three displaced");
    assert!(
        g.admit(addr("10.0.2.1:1000")).is_none(),
        "three closing already"
    );
    assert_eq!(lock(&g.table).closing, 3);
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    super::lock(m)
}

#[test]
fn a_connection_is_closed_without_a_first_call_or_idle_but_never_in_a_call() {
    let l = limits();
    let t0 = Instant::now();
    let c = ConnState::new(t0);
    let ms = |n| t0 + Duration::from_millis(n);
    assert_eq!(c.deadline(&l, ms(100)), Ok(ms(300)));
    assert_eq!(c.deadline(&l, ms(300)), Err(Event::HandshakeTimeout));
    let c = ConnState::new(t0);
    c.begin_call();
    // A call open: looked at again later, never closed.
    assert_eq!(c.deadline(&l, ms(10_000)), Ok(ms(10_300)));
    c.end_call();
    let ended = *lock(&c.idle_since);
    assert!(c.deadline(&l, ended).is_ok());
    assert_eq!(
        c.deadline(&l, ended + Duration::from_millis(300)),
        Err(Event::IdleTimeout)
    );
    let never = Limits {
        idle_timeout: None,
        ..l
    };
    assert!(c
        .deadline(&never, ended + Duration::from_secs(86_400))
        .is_ok());
}

#[test]
fn watches_are_bounded_per_connection_and_in_all() {
    let g = Gate::new("test", limits());
    let (a, b) = (
        ConnState::new(Instant::now()),
        ConnState::new(Instant::now()),
    );
    assert!(g.begin_watch(&a) && g.begin_watch(&a));
    assert!(!g.begin_watch(&a), "a third on one connection");
    assert!(g.begin_watch(&b));
    assert!(!g.begin_watch(&b), "a fourth in all");
    g.end_watch(&a);
    assert!(g.begin_watch(&b), "one ended, one more");
    assert_eq!(counters(&g).watches, 3);
}

#[test]
fn log_lines_are_limited_but_every_event_is_counted() {
    let g = Gate::new("test", limits());
    for _ in 0..1000 {
        g.note(Event::MaxConnections, None);
    }
    assert_eq!(counters(&g).refused_max_connections, 1000);
    let logged = lock(&g.logged);
    assert_eq!(logged.len(), 1, "one kind logged once");
}

/// A silent connection through [`Incoming`] is closed at the handshake
/// timeout, or at once when a newer one displaces it.
#[tokio::test]
async fn silent_connections_are_closed_at_the_handshake_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let g = Gate::new("test", limits());
    let mut incoming = Incoming::new(listener, g.clone());
    // What the server does: reads each admitted connection until it fails.
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = incoming.next().await {
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while matches!(conn.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    let start = Instant::now();
    let times = tokio::task::spawn_blocking(move || {
        let socks: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(at).unwrap()).collect();
        socks
            .into_iter()
            .map(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let n = s.read(&mut [0u8; 8]).unwrap_or(usize::MAX);
                (n, start.elapsed())
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    // The third, at the source's bound, displaces the first (closed at
    // once); the other two close at the handshake timeout.
    for (n, _) in &times {
        assert_eq!(*n, 0, "closed by the listener: {times:?}");
    }
    let (at_once, timed) = (times[0].1, times[1].1);
    assert!(at_once < Duration::from_millis(250), "{times:?}");
    assert!(
        timed >= Duration::from_millis(250) && timed < Duration::from_secs(3),
        "{times:?}"
    );
    let c = counters(&g);
    assert_eq!(c.closed_displaced, 1, "{c:?}");
    assert_eq!(c.closed_handshake_timeout, 2, "{c:?}");
    assert_eq!(c.connections, 0, "{c:?}");
}

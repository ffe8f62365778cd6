//! The secure channel's handshake rate: how many TLS 1.3 PSK handshakes
//! (with an X25519 exchange, psk_dhe_ke, as OpenSSL's and GnuTLS's
//! clients offer) one core of the subsystem's side completes per second.
//! The subsystem's side runs on a thread of its own, whose CPU time is
//! what is counted; hosts connect over loopback from the main thread, one
//! after another. `cargo bench -p dpu-tls --bench handshake`.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use dpu_tls::{Acceptor, ConfiguredPsk, Connector, PskHash, Step};
use rustix::time::{clock_gettime, ClockId};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d66-2d70-6572-6600-000000000001";
const SUB: &str = "nqn.2024-01.io.dpu-service:bench";
const ROUNDS: usize = 2000;

fn thread_cpu_secs() -> f64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn main() {
    for (name, key) in [
        (
            "SHA-256, TLS_AES_128_GCM_SHA256",
            ConfiguredPsk::new(&[3; 32], Some(PskHash::Sha256)).unwrap(),
        ),
        (
            "SHA-384, TLS_AES_256_GCM_SHA384",
            ConfiguredPsk::new(&[3; 48], Some(PskHash::Sha384)).unwrap(),
        ),
    ] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let k = key.clone();
        let acceptor = Acceptor::new(Arc::new(move |_: &str, _: &str| Some(k.clone()))).unwrap();
        let server = std::thread::spawn(move || {
            let cpu0 = thread_cpu_secs();
            for _ in 0..ROUNDS {
                let (s, _) = l.accept().unwrap();
                let mut h = acceptor.start(s).unwrap();
                while h.step().unwrap() != Step::Done {}
                drop(h.finish());
            }
            thread_cpu_secs() - cpu0
        });
        let c = Connector::for_key(&key, 1, HOST, SUB).unwrap();
        let t0 = Instant::now();
        for _ in 0..ROUNDS {
            let s = c.connect(TcpStream::connect(addr).unwrap()).unwrap();
            drop(s);
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = server.join().unwrap();
        println!(
            "{name}: {ROUNDS} handshakes, subsystem side {:.0} µs of CPU each: {:.0} handshakes/s per core ({:.0}/s end to end on loopback)",
            cpu / ROUNDS as f64 * 1e6,
            ROUNDS as f64 / cpu,
            ROUNDS as f64 / wall
        );
    }
}

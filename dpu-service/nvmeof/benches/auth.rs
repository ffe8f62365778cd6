//! What one DH-HMAC-CHAP authentication costs the controller, per DH
//! group: the CPU a queue's (re)connect takes from the cores that run the
//! target, and how many authentications a second one DH thread
//! (`storage.auth_threads`) can serve.
//!
//! Each round runs a whole unidirectional exchange with SHA-256 between
//! the controller's [`Authenticator`] and the crate's host
//! ([`DhchapHost`]) and times only the controller's calls: the
//! AUTH_Negotiate, the Challenge (its key pair), the Reply (the shared
//! secret) and Success1. The DH jobs run on the calling thread, as one
//! DH thread runs them. Prints the median and p99 per group.
//!
//! ```text
//! cargo bench -p dpu-nvmeof --bench auth -- --rounds 20
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use dpu_nvmeof::auth::{Authenticator, DhGroup, HashId, HostKeys, Secret};
use dpu_nvmeof::host::DhchapHost;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";
const SUB: &str = "nqn.2024-01.io.dpu:vol0";
const SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

/// The controller's time for one authentication with `keys`.
fn one(keys: &Arc<HostKeys>, secret: &Secret) -> Duration {
    let now = Instant::now();
    let mut h = DhchapHost::new(HOST, SUB, secret.clone(), None, 1);
    let negotiate = h.negotiate();
    let t = Instant::now();
    let mut c = Authenticator::new(keys.clone(), HOST, SUB, Duration::from_secs(30), now);
    c.send(&negotiate, now);
    let challenge = c.receive(4096, now).expect("a challenge");
    let mut spent = t.elapsed();
    let reply = h.reply(&challenge).expect("a reply");
    let t = Instant::now();
    c.send(&reply, now);
    let success1 = c.receive(4096, now).expect("success1");
    spent += t.elapsed();
    assert!(h.success1(&success1).is_ok() && c.is_authenticated());
    spent
}

fn main() {
    let mut rounds = 20usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .expect("--rounds takes a count of at least 1");
            }
            // What `cargo bench` passes to every bench binary.
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let secret = Secret::parse(SECRET).expect("a valid secret");
    println!(
        "{:<10} {:>8} {:>10} {:>10} {:>14}",
        "group", "rounds", "p50 ms", "p99 ms", "per s per core"
    );
    for group in DhGroup::ALL {
        let mut k = HostKeys::new(secret.clone(), None);
        k.hashes = vec![HashId::Sha256];
        k.dh_groups = vec![group];
        let k = Arc::new(k);
        // The null group is cheap: many more rounds for a stable figure.
        let n = if group == DhGroup::Null {
            rounds * 100
        } else {
            rounds
        };
        one(&k, &secret);
        let mut t: Vec<Duration> = (0..n).map(|_| one(&k, &secret)).collect();
        t.sort_unstable();
        let at = |p: f64| t[((t.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
        println!(
            "{:<10} {:>8} {:>10.3} {:>10.3} {:>14.0}",
            group.name(),
            n,
            at(0.5),
            at(0.99),
            1e3 / at(0.5)
        );
    }
}

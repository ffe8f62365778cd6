//! Fuzzes the DH-HMAC-CHAP message decoder and the controller's
//! authentication state machine. The input is decoded as one message
//! (which, when it decodes, must decode the same after being encoded
//! again), then cut into length-prefixed chunks fed to an `Authenticator`
//! as Authentication Send data, each followed by an Authentication Receive
//! of a length the chunk picks; nothing may panic and no answer may exceed
//! its allocation length. Run with `fuzz/run.sh auth` from the repository
//! root.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dpu_nvmeof::auth::controller::{HostKeys, MAX_RECEIVE};
use dpu_nvmeof::auth::msg;
use dpu_nvmeof::auth::{Authenticator, Secret};

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    if let Ok(m) = msg::decode(data) {
        let b = m.to_bytes();
        assert_eq!(msg::decode(&b).as_ref(), Ok(&m));
    }

    let Ok(secret) = Secret::parse("DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:")
    else {
        return;
    };
    let mut keys = HostKeys::new(secret.clone(), Some(secret));
    // The null group only: exponentiations would make each run slow
    // without reaching more of the parser.
    keys.dh_groups = vec![dpu_nvmeof::auth::DhGroup::Null];
    let t0 = Instant::now();
    let mut a = Authenticator::new(
        Arc::new(keys),
        "nqn.host",
        "nqn.sub",
        Duration::from_secs(10),
        t0,
    );
    let mut rest = data;
    let mut step = 0u64;
    while let [len, al, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let now = t0 + Duration::from_millis(step * 100);
        a.send(&tail[..n], now);
        let al = usize::from(*al) * 8;
        if let Ok(out) = a.receive(al, now) {
            assert!(out.len() <= al.min(MAX_RECEIVE));
        }
        a.tick(now);
        rest = &tail[n..];
        step += 1;
    }
}

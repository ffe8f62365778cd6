//! Test vectors (computed by `vectors.py` beside this file with Python's
//! hashlib/hmac/zlib, independently of this code), the RFC 7919 primes, the
//! message codec and whole exchanges between [`DhchapHost`] and the
//! controller's [`Authenticator`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::controller::{HostKeys, ReceiveError, MAX_ATTEMPTS};
use super::dh::DhGroup;
use super::msg::{self, explanation, DecodeError, Message, Negotiate};
use super::*;
use crate::host::{DhchapHost, HostAuthError};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";
const SUB: &str = "nqn.2024-01.io.dpu:vol0";
/// Key 00 01 .. 1f, SHA-256 transformation.
const HOST_SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
/// Key 64 65 .. 93 (48 bytes), no transformation.
const CTRL_SECRET: &str =
    "DHHC-1:00:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn secret(s: &str) -> Secret {
    Secret::parse(s).expect("valid secret")
}

fn range(a: u8, b: u8) -> Vec<u8> {
    (a..b).collect()
}

#[test]
fn secret_parses_and_hides_its_key() {
    let s = secret(HOST_SECRET);
    assert_eq!(
        (s.hash(), s.key_len(), s.hash_indicator()),
        (Some(HashId::Sha256), 32, 1)
    );
    let c = secret(CTRL_SECRET);
    assert_eq!((c.hash(), c.key_len()), (None, 48));
    for shown in [
        format!("{s:?}"),
        format!("{s}"),
        format!("{c:?}"),
        format!("{c}"),
    ] {
        assert!(
            !shown.contains("AAECAw") && !shown.contains("ZGVm"),
            "{shown}"
        );
        assert!(
            !shown.contains("00, 1, 2") && !shown.contains("[0, 1"),
            "{shown}"
        );
    }
    assert_eq!(format!("{s:?}"), "Secret { hash: 01, len: 32 }");
    assert!(s.same_as(&secret(HOST_SECRET)) && !s.same_as(&c));
}

#[test]
fn bad_secrets_are_refused() {
    let body = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR";
    let cases: &[(String, SecretError)] = &[
        ("DHHC-2:01:AAAA:".into(), SecretError::Format),
        (format!("DHHC-1:01:{body}"), SecretError::Format),
        (
            format!("DHHC-1:1:{body}:"),
            SecretError::HashIndicator("1".into()),
        ),
        (
            format!("DHHC-1:04:{body}:"),
            SecretError::HashIndicator("04".into()),
        ),
        ("DHHC-1:01:AAEC*wQF:".into(), SecretError::Base64),
        ("DHHC-1:00:AAECAwQF:".into(), SecretError::Length(2)),
        // The 32-byte key with hash indicator 03 (SHA-512 wants 64).
        (
            format!("DHHC-1:03:{body}:"),
            SecretError::LengthForHash { len: 32, hash: 3 },
        ),
        // The same key, one base64 character of the CRC changed.
        (
            format!("DHHC-1:01:{}S:", &body[..body.len() - 1]),
            SecretError::Crc,
        ),
        (
            format!("DHHC-1:01:{}:", "A".repeat(200)),
            SecretError::Format,
        ),
    ];
    for (s, want) in cases {
        assert_eq!(Secret::parse(s).err().as_ref(), Some(want), "{s}");
    }
    // Indicator 00 takes any of the three lengths.
    let key: Vec<u8> = (0..64).collect();
    let mut raw = key.clone();
    raw.extend_from_slice(&crc32fast::hash(&key).to_le_bytes());
    use base64::Engine as _;
    let s = format!(
        "DHHC-1:00:{}:",
        base64::engine::general_purpose::STANDARD.encode(&raw)
    );
    assert_eq!(secret(&s).key_len(), 64);
}

#[test]
fn key_transformation_matches_python() {
    let k = secret(HOST_SECRET).transform(HOST);
    assert_eq!(
        hex(k.as_bytes()),
        "1008776ae634561cc0ee8a3ef8fa6a29c58e8482c1fa28b7f79657ca31cb1734"
    );
    // Indicator 00: the key itself.
    assert_eq!(
        secret(CTRL_SECRET).transform(SUB).as_bytes(),
        &range(100, 148)[..]
    );
}

fn tx(seqnum: u32) -> Transaction<'static> {
    Transaction {
        seqnum,
        t_id: 0x0a0b,
        sc_c: 0,
        hostnqn: HOST,
        subnqn: SUB,
    }
}

#[test]
fn responses_match_python() {
    let hk = secret(HOST_SECRET).transform(HOST);
    let r1 = response(
        HashId::Sha256,
        Role::Host,
        hk.as_bytes(),
        &range(0x40, 0x60),
        &tx(0x0102_0304),
    );
    assert_eq!(
        hex(r1.as_bytes()),
        "57ffa6b152d13ee0b1f65bf436403884e4e99ae0d04f3b95ec86b312c846aef7"
    );
    let ck = secret(CTRL_SECRET).transform(SUB);
    let r2 = response(
        HashId::Sha384,
        Role::Controller,
        ck.as_bytes(),
        &range(0x80, 0xb0),
        &tx(7),
    );
    assert_eq!(
        hex(r2.as_bytes()),
        "ee71bf6a669397fe48675df7ecaca9c8bb6a2159af9ce5ace009c3a5d7f7e3fb22fdacf41f9d28e01ec1d19fc089fd8a"
    );
}

fn sha256(b: &[u8]) -> String {
    hex(HashId::Sha256.digest(&[b]).as_bytes())
}

#[test]
fn dh_and_augmented_challenge_match_python() {
    let g = DhGroup::Ffdhe2048;
    let a = g.key_pair(&range(1, 33)).expect("key pair");
    let b = g.key_pair(&range(33, 65)).expect("key pair");
    assert_eq!(a.public().len(), 256);
    assert_eq!(
        sha256(a.public()),
        "53b37a098c5882b9f56495d787706d354ac8ebc273e680a7047c70228ce24ad3"
    );
    let s = a.shared_secret(b.public()).expect("shared");
    assert_eq!(
        s.as_slice(),
        b.shared_secret(a.public()).expect("shared").as_slice()
    );
    assert_eq!(
        sha256(&s),
        "ea34983e3388791628eeb66cdaaeec59ea660dc0939e0f3be18c3a71d0494eab"
    );
    let aug = augmented_challenge(HashId::Sha256, &s, &range(0x40, 0x60));
    assert_eq!(
        hex(aug.as_bytes()),
        "d02b4109b3f5faf58c958f860f2db4136c910901d35dcbbe8489f31c61867e3f"
    );
    let hk = secret(HOST_SECRET).transform(HOST);
    let r1 = response(
        HashId::Sha256,
        Role::Host,
        hk.as_bytes(),
        aug.as_bytes(),
        &tx(0x0102_0304),
    );
    assert_eq!(
        hex(r1.as_bytes()),
        "481150a0ca426080192b4c1294e734bedc5fef03d32de057c11fa72d2e783027"
    );
}

#[test]
fn dh_refuses_degenerate_public_values() {
    let g = DhGroup::Ffdhe2048;
    let a = g.key_pair(&range(1, 33)).expect("key pair");
    let p = g.prime().expect("prime").to_vec();
    let mut one = vec![0u8; 256];
    one[255] = 1;
    let mut p_minus_1 = p.clone();
    p_minus_1[255] -= 1;
    for bad in [vec![0u8; 256], one, p_minus_1, p.clone(), vec![0xff; 256]] {
        assert!(a.shared_secret(&bad).is_err());
    }
    assert!(a.shared_secret(&p[..255]).is_err());
    assert!(matches!(
        DhGroup::Null.generate(),
        Err(dh::DhError::NullGroup)
    ));
}

/// SHA-256 of each prime, big endian: the same script that rebuilt the
/// primes from their RFC 7919 definition checked each is a safe prime
/// (Miller-Rabin on p and (p-1)/2).
#[test]
fn ffdhe_primes_are_rfc_7919() {
    let want = [
        (
            DhGroup::Ffdhe2048,
            "9cd3b7f336872f46c09428d1bbc19877a4d440512cda8d1c1cf0cd6e33698966",
        ),
        (
            DhGroup::Ffdhe3072,
            "0eaf67db3a839156d5013494a5318a772b5697d270d721f37f092efc69ea5a17",
        ),
        (
            DhGroup::Ffdhe4096,
            "4648414224ac881b3d0dc59b466f96d06a558278776807797ecf1f66ff397b3e",
        ),
        (
            DhGroup::Ffdhe6144,
            "227ac9066b3ddd9e193670cda2388fa884f65ba0cf98b742d1fe77a6687c79c7",
        ),
        (
            DhGroup::Ffdhe8192,
            "770b14efaf6f049929c523113b3fa99a8d11dab1b18af3609590122075d19833",
        ),
    ];
    for (g, h) in want {
        let p = g.prime().expect("prime");
        assert_eq!(p.len(), g.value_len());
        assert_eq!(g.prime_hex().map(str::len), Some(g.value_len() * 2));
        // RFC 7919: the top and bottom 64 bits are all ones, and the next
        // 64 bits are those of e (0xADF85458A2BB4A9A).
        assert!(
            p[..8].iter().chain(&p[p.len() - 8..]).all(|&b| b == 0xff),
            "{g:?}"
        );
        assert_eq!(p[8..16], [0xad, 0xf8, 0x54, 0x58, 0xa2, 0xbb, 0x4a, 0x9a]);
        assert_eq!(sha256(p), h, "{g:?}");
    }
    // Fermat: 2^(p-1) = 1 mod p, through the same exponentiation the
    // exchanges use (2 is a square mod a safe prime p = 7 mod 8, so 2^q = 1
    // too, q = (p-1)/2: the generator is in the prime-order subgroup).
    let g = DhGroup::Ffdhe2048;
    let p = g.prime().expect("prime");
    let mut q = vec![0u8; p.len()];
    let mut carry = 0u8;
    for (i, &b) in p.iter().enumerate() {
        q[i] = carry << 7 | b >> 1;
        carry = b & 1;
    }
    use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
    use crypto_bigint::BoxedUint;
    let pb = BoxedUint::from_be_slice(p, 2048).expect("p");
    let params = BoxedMontyParams::new(Option::from(pb.to_odd()).expect("odd"));
    let two = BoxedMontyForm::new(BoxedUint::from_be_slice(&[2], 2048).expect("2"), params);
    let r = two
        .pow(&BoxedUint::from_be_slice(&q, 2048).expect("q"))
        .retrieve();
    assert_eq!(r, BoxedUint::one_with_precision(2048));
}

#[test]
fn messages_round_trip() {
    let msgs = [
        Message::Negotiate(Negotiate {
            t_id: 9,
            sc_c: 0,
            hashes: vec![1, 2, 3],
            dh_groups: vec![0, 1, 2, 3, 4, 5],
            dhchap: true,
        }),
        Message::Challenge(msg::Challenge {
            t_id: 9,
            hash: 1,
            dh_group: 1,
            seqnum: 77,
            c1: vec![5; 32],
            dh_value: vec![6; 256],
        }),
        Message::Reply(msg::Reply {
            t_id: 9,
            response: vec![1; 48],
            c2: Some(vec![2; 48]),
            seqnum: 3,
            dh_value: vec![],
        }),
        Message::Success1 {
            t_id: 9,
            hl: 64,
            response: Some(vec![7; 64]),
        },
        Message::Success1 {
            t_id: 9,
            hl: 32,
            response: None,
        },
        Message::Success2 { t_id: 9 },
        Message::Failure {
            t_id: 9,
            second: false,
            reason: 1,
            explanation: 5,
        },
        Message::Failure {
            t_id: 9,
            second: true,
            reason: 1,
            explanation: 1,
        },
    ];
    for m in msgs {
        let b = m.to_bytes();
        assert_eq!(msg::decode(&b).as_ref(), Ok(&m));
        // Every prefix short of the message fails cleanly.
        let min = match m {
            Message::Failure { .. } => b.len(),
            _ => 8,
        };
        for n in 0..b.len() {
            let r = msg::decode(&b[..n]);
            if n < min {
                assert!(r.is_err(), "{m:?} cut to {n} decoded");
            }
        }
    }
    // Sizes as Linux lays them out.
    let c = msg::Challenge {
        t_id: 1,
        hash: 3,
        dh_group: 5,
        seqnum: 1,
        c1: vec![0; 64],
        dh_value: vec![0; 1024],
    };
    assert_eq!(Message::Challenge(c).to_bytes().len(), 16 + 64 + 1024);
    assert_eq!(Message::Success2 { t_id: 1 }.to_bytes().len(), 16);
}

#[test]
fn malformed_messages_are_errors() {
    let mut n = Message::Negotiate(Negotiate {
        t_id: 1,
        sc_c: 0,
        hashes: vec![1],
        dh_groups: vec![0],
        dhchap: true,
    })
    .to_bytes();
    n[8 + 2] = 31; // HALEN past the list
    assert_eq!(msg::decode(&n), Err(DecodeError::Field("HALEN")));
    n[7] = 2; // two descriptors, one sent
    assert!(matches!(
        msg::decode(&n),
        Err(DecodeError::Truncated { need: 136, .. })
    ));
    n[7] = 0;
    assert_eq!(msg::decode(&n), Err(DecodeError::Field("NAPD")));
    // A Reply whose HL and DHVLEN point past the end.
    let mut r = vec![1, 2, 0, 0, 0, 0, 64, 0, 1, 0, 0xff, 0xff, 0, 0, 0, 0];
    r.extend_from_slice(&[0; 128]);
    assert!(
        matches!(msg::decode(&r), Err(DecodeError::Truncated { need, .. }) if need == 16 + 128 + 0xffff)
    );
    assert_eq!(
        msg::decode(&[7, 7, 0, 0, 0, 0, 0, 0]),
        Err(DecodeError::Unknown {
            auth_type: 7,
            auth_id: 7
        })
    );
}

fn keys(ctrl: bool) -> Arc<HostKeys> {
    Arc::new(HostKeys::new(
        secret(HOST_SECRET),
        ctrl.then(|| secret(CTRL_SECRET)),
    ))
}

/// Runs a whole exchange; returns the controller's outcome and the host's
/// error, if any.
fn exchange(
    ctrl: &mut Authenticator,
    host: &mut DhchapHost,
    now: Instant,
) -> Result<(), HostAuthError> {
    ctrl.send(&host.negotiate(), now);
    let challenge = ctrl.receive(4096, now).expect("challenge");
    let reply = host.reply(&challenge)?;
    ctrl.send(&reply, now);
    let s1 = ctrl.receive(4096, now).expect("success1");
    match host.success1(&s1) {
        Ok(Some(s2)) => ctrl.send(&s2, now),
        Ok(None) => {}
        Err(HostAuthError::ControllerResponse) => {
            ctrl.send(&host.failure2(), now);
            return Err(HostAuthError::ControllerResponse);
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

#[test]
fn host_and_controller_agree_for_every_hash_and_group() {
    let now = Instant::now();
    for hash in HashId::ALL {
        for group in [
            DhGroup::Null,
            DhGroup::Ffdhe2048,
            DhGroup::Ffdhe3072,
            DhGroup::Ffdhe4096,
        ] {
            for bidi in [false, true] {
                let mut k = (*keys(bidi)).clone();
                k.hashes = vec![hash];
                k.dh_groups = vec![group];
                let mut c = Authenticator::new(Arc::new(k), HOST, SUB, Duration::from_secs(5), now);
                let mut h = DhchapHost::new(
                    HOST,
                    SUB,
                    secret(HOST_SECRET),
                    bidi.then(|| secret(CTRL_SECRET)),
                    3,
                );
                assert_eq!(
                    exchange(&mut c, &mut h, now),
                    Ok(()),
                    "{hash:?} {group:?} {bidi}"
                );
                assert!(c.is_authenticated());
                assert_eq!(c.take_outcome(), Some(AuthOutcome::Succeeded));
                assert_eq!(c.deadline(), None);
            }
        }
    }
}

#[test]
fn large_groups_agree() {
    let now = Instant::now();
    for group in [DhGroup::Ffdhe6144, DhGroup::Ffdhe8192] {
        let mut k = (*keys(true)).clone();
        k.hashes = vec![HashId::Sha512];
        k.dh_groups = vec![group];
        let mut c = Authenticator::new(Arc::new(k), HOST, SUB, Duration::from_secs(5), now);
        let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), Some(secret(CTRL_SECRET)), 3);
        assert_eq!(exchange(&mut c, &mut h, now), Ok(()));
        assert!(c.is_authenticated());
    }
}

fn other_secret() -> Secret {
    let key = [0x5a; 32];
    let mut raw = key.to_vec();
    raw.extend_from_slice(&crc32fast::hash(&key).to_le_bytes());
    use base64::Engine as _;
    secret(&format!(
        "DHHC-1:00:{}:",
        base64::engine::general_purpose::STANDARD.encode(&raw)
    ))
}

#[test]
fn wrong_host_secret_is_refused() {
    let now = Instant::now();
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, other_secret(), None, 1);
    assert_eq!(
        exchange(&mut c, &mut h, now),
        Err(HostAuthError::Refused {
            reason: msg::REASON_FAILED,
            explanation: explanation::FAILED
        })
    );
    assert!(!c.is_authenticated());
    assert!(c.has_failed());
    assert!(matches!(
        c.take_outcome(),
        Some(AuthOutcome::Failed { explanation: 1, .. })
    ));
    // A second Receive answers Failure1 again without a second count.
    assert!(c.receive(64, now).is_ok());
    assert_eq!(c.take_outcome(), None);
    // The same secret for another host NQN is another key.
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new("nqn.other", SUB, secret(HOST_SECRET), None, 1);
    assert!(exchange(&mut c, &mut h, now).is_err());
    assert!(!c.is_authenticated());
}

#[test]
fn wrong_controller_secret_is_rejected_by_the_host() {
    let now = Instant::now();
    let mut c = Authenticator::new(keys(true), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), Some(other_secret()), 1);
    assert_eq!(
        exchange(&mut c, &mut h, now),
        Err(HostAuthError::ControllerResponse)
    );
    assert!(!c.is_authenticated());
    assert!(matches!(c.take_outcome(), Some(AuthOutcome::Failed { .. })));
    // Bidirectional asked for, no controller secret configured: refused.
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), Some(secret(CTRL_SECRET)), 1);
    assert!(matches!(
        exchange(&mut c, &mut h, now),
        Err(HostAuthError::Refused { .. })
    ));
}

#[test]
fn negotiation_failures_name_their_reason() {
    let now = Instant::now();
    let cases: [(Vec<HashId>, Vec<DhGroup>, u8, u8); 3] = [
        (
            vec![HashId::Sha256],
            DhGroup::ALL.to_vec(),
            0,
            explanation::HASH_UNUSABLE,
        ),
        (
            HashId::ALL.to_vec(),
            vec![DhGroup::Null],
            0,
            explanation::DHGROUP_UNUSABLE,
        ),
        (
            HashId::ALL.to_vec(),
            DhGroup::ALL.to_vec(),
            1,
            explanation::CONCAT_MISMATCH,
        ),
    ];
    for (hashes, groups, sc_c, want) in cases {
        let mut k = (*keys(false)).clone();
        k.hashes = vec![HashId::Sha512];
        k.dh_groups = vec![DhGroup::Ffdhe2048];
        let mut c = Authenticator::new(Arc::new(k), HOST, SUB, Duration::from_secs(5), now);
        let n = Message::Negotiate(Negotiate {
            t_id: 4,
            sc_c,
            hashes: hashes.iter().map(|h| h.id()).collect(),
            dh_groups: groups.iter().map(|g| g.id()).collect(),
            dhchap: true,
        });
        c.send(&n.to_bytes(), now);
        let f = c.receive(4096, now).expect("failure1");
        assert_eq!(f.len(), 4096);
        assert_eq!(
            msg::decode(&f),
            Ok(Message::Failure {
                t_id: 4,
                second: false,
                reason: 1,
                explanation: want
            })
        );
        assert!(c.has_failed());
    }
}

#[test]
fn out_of_sequence_and_wrong_transaction_fail() {
    let now = Instant::now();
    // A Reply before any challenge.
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    c.send(&Message::Success2 { t_id: 0 }.to_bytes(), now);
    let f = msg::decode(&c.receive(64, now).expect("failure1"));
    assert!(matches!(f, Ok(Message::Failure { explanation: 7, .. })));
    // A Reply with another transaction ID.
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), None, 5);
    c.send(&h.negotiate(), now);
    let mut reply = h
        .reply(&c.receive(4096, now).expect("challenge"))
        .expect("reply");
    reply[4] ^= 1;
    c.send(&reply, now);
    let f = msg::decode(&c.receive(64, now).expect("failure1"));
    assert!(matches!(f, Ok(Message::Failure { explanation: 6, .. })));
    // Garbage.
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    c.send(&[1, 2, 3], now);
    let f = msg::decode(&c.receive(64, now).expect("failure1"));
    assert!(matches!(f, Ok(Message::Failure { explanation: 6, .. })));
}

#[test]
fn small_allocation_length_leaves_the_state_alone() {
    let now = Instant::now();
    let mut k = (*keys(false)).clone();
    k.dh_groups = vec![DhGroup::Ffdhe2048];
    let mut c = Authenticator::new(Arc::new(k), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), None, 5);
    c.send(&h.negotiate(), now);
    assert_eq!(
        c.receive(100, now),
        Err(ReceiveError::TooSmall {
            al: 100,
            need: 16 + 32 + 256
        })
    );
    let ch = c.receive(304, now).expect("challenge");
    assert_eq!(ch.len(), 304);
    c.send(&h.reply(&ch).expect("reply"), now);
    assert!(c.receive(8, now).is_err());
    assert!(h.success1(&c.receive(48, now).expect("success1")).is_ok());
    assert!(c.is_authenticated());
}

#[test]
fn a_step_not_taken_in_time_fails() {
    let t0 = Instant::now();
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), t0);
    assert!(!c.tick(t0 + Duration::from_secs(4)));
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), None, 5);
    c.send(&h.negotiate(), t0 + Duration::from_secs(4));
    let ch = c
        .receive(4096, t0 + Duration::from_secs(4))
        .expect("challenge");
    assert!(!c.tick(t0 + Duration::from_secs(8)));
    assert!(c.tick(t0 + Duration::from_secs(9)));
    assert!(matches!(c.take_outcome(), Some(AuthOutcome::Failed { .. })));
    // The late reply changes nothing.
    c.send(&h.reply(&ch).expect("reply"), t0 + Duration::from_secs(10));
    assert!(!c.is_authenticated());
}

#[test]
fn attempts_are_bounded() {
    let now = Instant::now();
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    for _ in 0..MAX_ATTEMPTS {
        let mut h = DhchapHost::new(HOST, SUB, other_secret(), None, 1);
        c.send(&h.negotiate(), now);
        let ch = c.receive(4096, now).expect("challenge");
        // Restarted before replying: not a failure yet.
        let _ = h.reply(&ch);
    }
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), None, 1);
    assert!(exchange(&mut c, &mut h, now).is_err());
    assert!(!c.is_authenticated());
    // A wrong reply cannot be followed by another try on the queue.
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, other_secret(), None, 1);
    c.send(&h.negotiate(), now);
    let reply = h
        .reply(&c.receive(4096, now).expect("challenge"))
        .expect("reply");
    c.send(&reply, now);
    let h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), None, 1);
    c.send(&h.negotiate(), now);
    let f = msg::decode(&c.receive(4096, now).expect("failure1"));
    assert!(matches!(
        f,
        Ok(Message::Failure {
            explanation: explanation::FAILED,
            ..
        })
    ));
    assert!(c.has_failed() && !c.is_authenticated());
}

#[test]
fn removed_keys_fail_the_next_negotiation() {
    let now = Instant::now();
    let mut c = Authenticator::new(keys(false), HOST, SUB, Duration::from_secs(5), now);
    let mut h = DhchapHost::new(HOST, SUB, secret(HOST_SECRET), None, 1);
    assert_eq!(exchange(&mut c, &mut h, now), Ok(()));
    c.set_keys(None);
    c.send(&h.negotiate(), now);
    let f = msg::decode(&c.receive(64, now).expect("failure1"));
    assert!(matches!(
        f,
        Ok(Message::Failure {
            explanation: explanation::NOT_USABLE,
            ..
        })
    ));
    assert!(!c.is_authenticated() && c.has_failed());
}

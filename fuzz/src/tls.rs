//! Fuzzes what the secure channel reads from peers and operators before
//! OpenSSL does: the TLS PSK identity a host names in its ClientHello
//! (parsed by the target's key lookup, then checked against a key), and
//! the PSK interchange format of config files and API requests. An input
//! that parses must read back the same from its printed form; nothing may
//! panic. Run with `fuzz/run.sh tls` from the repository root.

use dpu_nvmeof::dpu_tls::{ConfiguredPsk, Identity, PskHash};

/// Runs the target on one input.
pub fn run(data: &[u8]) {
    if let Ok(id) = Identity::parse(data) {
        assert_eq!(Identity::parse(id.to_string().as_bytes()).as_ref(), Ok(&id));
        for (key, hash) in [
            ([7u8; 48].as_slice(), PskHash::Sha384),
            (&[7u8; 32][..], PskHash::Sha256),
        ] {
            let key = ConfiguredPsk::new(key, Some(hash)).expect("a key of its hash's length");
            // Another hash than the identity's, or a digest of another
            // key, makes no TLS PSK; the identity's own key makes one.
            let psk = id.tls_psk(&key);
            if hash != id.hash {
                assert!(psk.is_none());
            }
            let (own, _) = key.tls_psk(id.version, &id.hostnqn, &id.subnqn);
            if hash == id.hash {
                let own = Identity::parse(own.as_bytes()).expect("an identity made here");
                assert!(own.tls_psk(&key).is_some());
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(k) = ConfiguredPsk::parse(text) {
            assert_eq!(ConfiguredPsk::parse(&k.to_interchange()).as_ref(), Ok(&k));
        }
    }
}

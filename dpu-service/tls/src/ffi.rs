//! OpenSSL's TLS 1.3 external-PSK callbacks, which the `openssl` crate
//! does not bind: the server's `SSL_CTX_set_psk_find_session_callback`
//! and the client's `SSL_CTX_set_psk_use_session_callback`. Each hands
//! OpenSSL a session carrying the TLS PSK as its master key and the
//! cipher suite of the PSK's hash. What the callbacks need lives in the
//! context's and the session's ex data, owned by OpenSSL's objects.

use std::ffi::{c_int, c_uchar};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, OnceLock};

use foreign_types_shared::ForeignTypeRef;
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslRef};
use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};

use crate::psk::{Identity, TlsPsk};
use crate::KeyLookup;

type FindSessionCb = unsafe extern "C" fn(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int;

type UseSessionCb = unsafe extern "C" fn(
    ssl: *mut SSL,
    md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int;

extern "C" {
    fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSessionCb>);
    fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut SSL_SESSION;
    fn SSL_SESSION_set1_master_key(s: *mut SSL_SESSION, key: *const c_uchar, len: usize) -> c_int;
    fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, cipher: *const SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, version: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut SSL, bytes: *const c_uchar) -> *const SSL_CIPHER;
    fn EVP_MD_get_size(md: *const EVP_MD) -> c_int;
}

const TLS1_3_VERSION: c_int = 0x0304;

/// The server context's key lookup.
fn lookup_index() -> Index<SslContext, Arc<KeyLookup>> {
    static I: OnceLock<Index<SslContext, Arc<KeyLookup>>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("an OpenSSL ex data index"))
}

/// The client context's identity and key.
fn present_index() -> Index<SslContext, (Vec<u8>, TlsPsk)> {
    static I: OnceLock<Index<SslContext, (Vec<u8>, TlsPsk)>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("an OpenSSL ex data index"))
}

/// What a server session's callback decided: the identity accepted, or
/// why none was.
fn outcome_index() -> Index<Ssl, Result<Identity, Refusal>> {
    static I: OnceLock<Index<Ssl, Result<Identity, Refusal>>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("an OpenSSL ex data index"))
}

/// Makes `b` accept the identities whose keys `lookup` finds.
pub(crate) fn serve_psks(
    b: &mut SslContextBuilder,
    lookup: Arc<KeyLookup>,
) -> Result<(), ErrorStack> {
    b.set_ex_data(lookup_index(), lookup);
    // SAFETY: `b` owns a valid SSL_CTX; the callback is a plain function
    // valid for the program's life.
    unsafe { SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) };
    Ok(())
}

/// Makes `b` present `identity` with `psk`.
pub(crate) fn present_psk(
    b: &mut SslContextBuilder,
    identity: String,
    psk: TlsPsk,
) -> Result<(), ErrorStack> {
    b.set_ex_data(present_index(), (identity.into_bytes(), psk));
    // SAFETY: as in `serve_psks`.
    unsafe { SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)) };
    Ok(())
}

/// Why the server's callback offered no key.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The identity was NVMe's, but no key is set for its host and
    /// subsystem.
    pub(crate) unknown_key: bool,
    /// What to log.
    pub(crate) why: String,
}

impl Refusal {
    fn new(unknown_key: bool, why: String) -> Self {
        Self { unknown_key, why }
    }
}

/// Why the server's callback offered no key, if it did not.
pub(crate) fn refusal(ssl: &SslRef) -> Option<Refusal> {
    match ssl.ex_data(outcome_index()) {
        Some(Err(why)) => Some(why.clone()),
        _ => None,
    }
}

/// The identity the server's callback accepted.
pub(crate) fn accepted(ssl: &SslRef) -> Option<Identity> {
    match ssl.ex_data(outcome_index()) {
        Some(Ok(id)) => Some(id.clone()),
        _ => None,
    }
}

/// A TLS 1.3 session whose master key is `psk`, for its cipher suite.
///
/// # Safety
/// `ssl` must be a valid SSL object.
unsafe fn psk_session(ssl: *mut SSL, psk: &TlsPsk) -> *mut SSL_SESSION {
    let suite = [0x13, psk.hash.code()];
    // SAFETY: `ssl` is valid (the caller's promise); `suite` holds the two
    // bytes SSL_CIPHER_find reads.
    let cipher = unsafe { SSL_CIPHER_find(ssl, suite.as_ptr()) };
    if cipher.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: a fresh session, owned here until handed to OpenSSL or
    // freed below; the key is copied by set1.
    unsafe {
        let s = SSL_SESSION_new();
        if s.is_null() {
            return s;
        }
        if SSL_SESSION_set1_master_key(s, psk.key.as_ptr(), psk.key.len()) != 1
            || SSL_SESSION_set_cipher(s, cipher) != 1
            || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1
        {
            openssl_sys::SSL_SESSION_free(s);
            return ptr::null_mut();
        }
        s
    }
}

/// The server's callback: the session for the identity the host offered,
/// or none (the handshake then fails: the server has no certificate).
unsafe extern "C" fn find_session(
    ssl: *mut SSL,
    identity: *const c_uchar,
    identity_len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes a valid `sess` to store into.
    unsafe { *sess = ptr::null_mut() };
    let found = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: OpenSSL passes the handshake's valid SSL, which nothing
        // else touches during the callback, and an identity of
        // `identity_len` bytes that lives through it.
        let (ssl_ref, id) = unsafe {
            (
                SslRef::from_ptr_mut(ssl),
                std::slice::from_raw_parts(identity, identity_len),
            )
        };
        let lookup = ssl_ref.ssl_context().ex_data(lookup_index()).cloned();
        let outcome = match (Identity::parse(id), lookup) {
            (Err(e), _) => Err(Refusal::new(
                false,
                format!("{e}: {:?}", String::from_utf8_lossy(&id[..id.len().min(80)])),
            )),
            (Ok(_), None) => Err(Refusal::new(false, "no key lookup".into())),
            (Ok(id), Some(lookup)) => match lookup(&id.subnqn, &id.hostnqn) {
                None => Err(Refusal::new(
                    true,
                    format!("no TLS key for host {} on subsystem {}", id.hostnqn, id.subnqn),
                )),
                Some(key) => match id.tls_psk(&key) {
                    None => Err(Refusal::new(false, format!(
                        "TLS identity {id} does not match the key of host {} on subsystem {} (another hash or digest)",
                        id.hostnqn, id.subnqn
                    ))),
                    Some(psk) => Ok((id, psk)),
                },
            },
        };
        match outcome {
            Ok((id, psk)) => {
                // SAFETY: `ssl` is valid, as above.
                let s = unsafe { psk_session(ssl, &psk) };
                if s.is_null() {
                    ssl_ref.set_ex_data(
                        outcome_index(),
                        Err(Refusal::new(false, "OpenSSL lacks the cipher suite".into())),
                    );
                } else {
                    ssl_ref.set_ex_data(outcome_index(), Ok(id));
                }
                s
            }
            Err(why) => {
                ssl_ref.set_ex_data(outcome_index(), Err(why));
                ptr::null_mut()
            }
        }
    }));
    match found {
        Ok(s) => {
            // SAFETY: as above; OpenSSL takes ownership of the session.
            unsafe { *sess = s };
            1
        }
        Err(_) => 0,
    }
}

/// The client's callback: its one identity and the session of its key,
/// unless OpenSSL asks for another hash (after a HelloRetryRequest).
unsafe extern "C" fn use_session(
    ssl: *mut SSL,
    md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    // SAFETY: OpenSSL passes valid out pointers.
    unsafe {
        *sess = ptr::null_mut();
        *id = ptr::null();
        *idlen = 0;
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: OpenSSL passes the handshake's valid SSL.
        let ssl_ref = unsafe { SslRef::from_ptr_mut(ssl) };
        let Some((identity, psk)) = ssl_ref.ssl_context().ex_data(present_index()) else {
            return;
        };
        // SAFETY: a non-null `md` is a valid digest.
        if !md.is_null() && unsafe { EVP_MD_get_size(md) } != psk.hash.key_len() as c_int {
            return;
        }
        // SAFETY: `ssl` is valid.
        let s = unsafe { psk_session(ssl, psk) };
        if s.is_null() {
            return;
        }
        // SAFETY: the identity lives in the context's ex data, which
        // outlives the handshake; OpenSSL takes ownership of `s`.
        unsafe {
            *id = identity.as_ptr();
            *idlen = identity.len();
            *sess = s;
        }
    }));
    match r {
        Ok(()) => 1,
        Err(_) => 0,
    }
}

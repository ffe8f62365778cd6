//! The controller's side of one queue's DH-HMAC-CHAP transaction, sans-IO:
//! the connection hands it the data of each Authentication Send, asks it
//! for the data of each Authentication Receive, and passes the time in.
//!
//! ```text
//! Negotiate --Send(AUTH_Negotiate)--> Challenge --Receive--> Reply
//!   --Send(Reply) ok--> Success1 --Receive--> Done            (unidirectional)
//!                                         \--> Success2 --Send(Success2)--> Done
//! any failure --> Failure1 --Receive(AUTH_Failure1)--> Failed
//! ```
//!
//! The Diffie-Hellman work (the controller's key pair for the Challenge,
//! the shared secret of the Reply) can be left to the caller:
//! [`Authenticator::receive_deferred`] and [`Authenticator::send_deferred`]
//! hand out a [`DhJob`] instead of running it, and
//! [`Authenticator::dh_done`] takes its result, after which the Receive is
//! asked again (it now answers at once) or the Send is complete. A
//! transport runs the jobs on a [`DhPool`](super::pool::DhPool), off the
//! threads that serve I/O. [`Authenticator::receive`] and
//! [`Authenticator::send`] run them on the calling thread.
//!
//! A new AUTH_Negotiate restarts a transaction that has not failed
//! (re-authentication), at most [`MAX_ATTEMPTS`] times per queue; once one
//! fails, the queue only gets its AUTH_Failure1. A step not taken within the
//! timeout fails the transaction; so does a Failure2 from the host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::dh::{DhError, DhGroup, KeyPair};
use super::msg::{self, explanation, Challenge, Message, Negotiate, Reply};
use super::pool::{DhJob, DhOutput, DhResult};
use super::{augmented_challenge, response, Digest, HashId, Role, Secret, Transaction};

/// Most AUTH_Negotiate messages one queue may send: a host that keeps
/// guessing is cut off.
pub const MAX_ATTEMPTS: u32 = 3;
/// Largest Authentication Receive answered (a challenge of ffdhe8192 with
/// SHA-512 is 1104 bytes; Linux asks for 4096).
pub const MAX_RECEIVE: usize = 8192;
/// Default time allowed for each step (Linux's target allows the keep
/// alive timeout, else 120 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What a subsystem knows of one allowed host: its secrets and what it may
/// use.
#[derive(Clone, Debug)]
pub struct HostKeys {
    /// The host's secret (proves the host).
    pub secret: Secret,
    /// The controller's secret, for bidirectional authentication.
    pub ctrl_secret: Option<Secret>,
    /// Hash functions allowed, most preferred first: the first one the
    /// host offers is chosen.
    pub hashes: Vec<HashId>,
    /// DH groups allowed, most preferred first.
    pub dh_groups: Vec<DhGroup>,
}

impl HostKeys {
    /// Keys with every hash (SHA-256 first, as Linux's target) and every
    /// DH group allowed, ffdhe2048 first and the null group last.
    pub fn new(secret: Secret, ctrl_secret: Option<Secret>) -> Self {
        Self {
            secret,
            ctrl_secret,
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

/// How a transaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The host proved its secret (and accepted the controller's, if it
    /// asked).
    Succeeded,
    /// The transaction failed: `explanation` is the reason code
    /// explanation sent (or received in a Failure2), `why` says it in
    /// words (never with key material).
    Failed {
        /// Reason code explanation.
        explanation: u8,
        /// What went wrong.
        why: &'static str,
    },
    /// The attempt was refused without judging the host's secret (an
    /// AUTH_Failure1 went out all the same): counted apart from failures.
    Refused {
        /// Why.
        refusal: Refusal,
    },
}

/// Why an attempt was refused before its secret was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source made too many attempts
    /// ([`AuthLimiter`](super::limit::AuthLimiter)).
    RateLimited,
    /// The DH pool's queue was full.
    Busy,
}

impl Refusal {
    /// In words, for logs.
    pub fn why(self) -> &'static str {
        match self {
            Self::RateLimited => "too many authentication attempts from this address",
            Self::Busy => "the DH pool is busy",
        }
    }
}

/// What an Authentication Receive gets from
/// [`Authenticator::receive_deferred`].
#[derive(Debug)]
pub enum Step {
    /// The data to return.
    Data(Vec<u8>),
    /// Run this job and hand its result to [`Authenticator::dh_done`],
    /// then ask again.
    Compute(DhJob),
}

/// Why an Authentication Receive cannot be answered: the command fails
/// with Invalid Field, the transaction stays where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReceiveError {
    /// The allocation length cannot hold the message.
    #[error("allocation length {al} below the {need} bytes of the message")]
    TooSmall {
        /// Allocation length asked for.
        al: usize,
        /// Bytes the message takes.
        need: usize,
    },
    /// The OS random number generator failed.
    #[error("the OS random number generator failed")]
    Random,
    /// A DH computation for the message is under way.
    #[error("a DH computation is under way")]
    InProgress,
}

enum State {
    /// Waiting for AUTH_Negotiate.
    Negotiate,
    /// Negotiated; the challenge goes out with the next Receive.
    Challenge {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
        /// The controller's key pair, once computed (never for the null
        /// group).
        key_pair: Option<KeyPair>,
    },
    /// Negotiated; the controller's key pair is being computed.
    Generating {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
    },
    /// Challenge sent; waiting for the Reply.
    Reply {
        t_id: u16,
        hash: HashId,
        key_pair: Option<KeyPair>,
        c1: Zeroizing<Vec<u8>>,
        s1: u32,
    },
    /// The Reply is in; the shared secret is being computed.
    Verifying {
        t_id: u16,
        hash: HashId,
        c1: Zeroizing<Vec<u8>>,
        s1: u32,
        reply: Reply,
    },
    /// Host proven; Success1 goes out with the next Receive.
    Success1 {
        t_id: u16,
        hash: HashId,
        ctrl_response: Option<Digest>,
    },
    /// Success1 sent with the controller's response; waiting for Success2.
    Success2 { t_id: u16 },
    /// Failed; AUTH_Failure1 goes out with the next Receive.
    Failure1 {
        t_id: u16,
        explanation: u8,
        why: &'static str,
        refusal: Option<Refusal>,
    },
    /// Finished, either way.
    Done,
}

/// One queue's authentication, controller side.
pub struct Authenticator {
    /// `None` once the host's secret was removed: negotiation fails.
    keys: Option<Arc<HostKeys>>,
    /// The keys of the transaction under way, taken at its AUTH_Negotiate.
    current: Option<Arc<HostKeys>>,
    hostnqn: String,
    subnqn: String,
    state: State,
    authenticated: bool,
    attempts: u32,
    timeout: Duration,
    deadline: Option<Instant>,
    outcome: Option<Outcome>,
    /// Set once a transaction has ended badly: no further attempts.
    closed: bool,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("hostnqn", &self.hostnqn)
            .field("subnqn", &self.subnqn)
            .field("authenticated", &self.authenticated)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// The authentication of a queue connected at `now` by `hostnqn` to
    /// `subnqn`, with `keys`; each step must come within `timeout`.
    pub fn new(
        keys: Arc<HostKeys>,
        hostnqn: &str,
        subnqn: &str,
        timeout: Duration,
        now: Instant,
    ) -> Self {
        Self {
            keys: Some(keys),
            current: None,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            state: State::Negotiate,
            authenticated: false,
            attempts: 0,
            timeout,
            deadline: now.checked_add(timeout),
            outcome: None,
            closed: false,
        }
    }

    /// Replaces the host's keys (`None`: removed) for the next
    /// AUTH_Negotiate: a changed secret takes effect on the next
    /// authentication, the transaction under way keeps its keys.
    pub fn set_keys(&mut self, keys: Option<Arc<HostKeys>>) {
        self.keys = keys;
    }

    /// The connection closes: a transaction that neither succeeded nor
    /// failed yet, on a queue not authenticated, ends as failed (the host
    /// gave up, or had no secret). Returns whether it did.
    pub fn abandon(&mut self) -> bool {
        if self.authenticated || matches!(self.state, State::Done) {
            return false;
        }
        self.finish(Outcome::Failed {
            explanation: explanation::FAILED,
            why: "connection closed before authentication completed",
        });
        true
    }

    /// Whether the queue has completed authentication.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether the transaction failed for good (the connection should be
    /// closed once the Failure1 is out).
    pub fn has_failed(&self) -> bool {
        self.closed && matches!(self.state, State::Done)
    }

    /// The outcome of a transaction that ended since the last call.
    pub fn take_outcome(&mut self) -> Option<Outcome> {
        self.outcome.take()
    }

    /// When [`tick`](Self::tick) must next be called, if a step is awaited.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Passes the time: a step not taken by its deadline fails the
    /// transaction. Returns whether it just failed so.
    pub fn tick(&mut self, now: Instant) -> bool {
        match self.deadline {
            Some(d) if now >= d => {
                self.deadline = None;
                self.authenticated = false;
                self.closed = true;
                self.state = State::Done;
                self.outcome = Some(Outcome::Failed {
                    explanation: explanation::FAILED,
                    why: "authentication timed out",
                });
                true
            }
            _ => false,
        }
    }

    fn fail(&mut self, t_id: u16, explanation: u8, why: &'static str, now: Instant) {
        self.fail_as(t_id, explanation, why, None, now);
    }

    /// Fails transaction `t_id` for `refusal`, before or instead of its
    /// DH work: "authentication failed" to the host, the refusal counted.
    fn fail_refused(&mut self, t_id: u16, refusal: Refusal, now: Instant) {
        self.fail_as(t_id, explanation::FAILED, refusal.why(), Some(refusal), now);
    }

    fn fail_as(
        &mut self,
        t_id: u16,
        explanation: u8,
        why: &'static str,
        refusal: Option<Refusal>,
        now: Instant,
    ) {
        self.authenticated = false;
        self.state = State::Failure1 {
            t_id,
            explanation,
            why,
            refusal,
        };
        self.deadline = now.checked_add(self.timeout);
    }

    fn finish(&mut self, outcome: Outcome) {
        self.state = State::Done;
        self.deadline = None;
        if let Outcome::Failed { .. } | Outcome::Refused { .. } = outcome {
            self.authenticated = false;
            self.closed = true;
        } else {
            self.authenticated = true;
        }
        self.outcome = Some(outcome);
    }

    /// Handles the data of an Authentication Send, running any DH work
    /// on the calling thread.
    pub fn send(&mut self, data: &[u8], now: Instant) {
        if let Some(job) = self.send_deferred(data, now) {
            self.dh_done(job.run(), now);
        }
    }

    /// Refuses the AUTH_Negotiate in `data` for `refusal`, before any DH
    /// work: the next Receive gets an AUTH_Failure1, and the attempt
    /// counts against the queue's [`MAX_ATTEMPTS`]. Data that is no
    /// AUTH_Negotiate is handled as [`send`](Self::send) would.
    pub fn refuse(&mut self, data: &[u8], refusal: Refusal, now: Instant) {
        if self.closed || matches!(self.state, State::Failure1 { .. }) {
            return;
        }
        let Ok(Message::Negotiate(n)) = msg::decode(data) else {
            return self.send(data, now);
        };
        self.attempts += 1;
        self.fail_refused(n.t_id, refusal, now);
    }

    /// Handles the data of an Authentication Send; returns the DH job the
    /// transaction now waits for (the Reply's shared secret), whose result
    /// goes to [`dh_done`](Self::dh_done).
    pub fn send_deferred(&mut self, data: &[u8], now: Instant) -> Option<DhJob> {
        // A failed transaction is final: a new AUTH_Negotiate cannot
        // replace the Failure1 owed (no guessing again on the same queue).
        if self.closed
            || matches!(
                self.state,
                State::Failure1 { .. } | State::Generating { .. } | State::Verifying { .. }
            )
        {
            return None;
        }
        let m = match msg::decode(data) {
            Ok(m) => m,
            Err(_) => {
                let t_id = self.t_id();
                self.fail(
                    t_id,
                    explanation::INCORRECT_PAYLOAD,
                    "malformed authentication message",
                    now,
                );
                return None;
            }
        };
        self.deadline = now.checked_add(self.timeout);
        match (m, &self.state) {
            (Message::Negotiate(n), _) => {
                self.attempts += 1;
                if self.attempts > MAX_ATTEMPTS {
                    self.fail(
                        n.t_id,
                        explanation::FAILED,
                        "too many authentication attempts",
                        now,
                    );
                    return None;
                }
                self.negotiate(&n, now);
            }
            (Message::Reply(r), &State::Reply { t_id, .. }) if r.t_id == t_id => {
                return self.reply(r, now)
            }
            (Message::Success2 { t_id: got }, &State::Success2 { t_id }) if got == t_id => {
                self.finish(Outcome::Succeeded)
            }
            (
                Message::Failure {
                    second: true,
                    explanation,
                    ..
                },
                _,
            ) => self.finish(Outcome::Failed {
                explanation,
                why: "the host rejected the controller's response",
            }),
            (m, State::Reply { t_id, .. } | State::Success2 { t_id }) if m.t_id() != *t_id => {
                let t_id = *t_id;
                self.fail(
                    t_id,
                    explanation::INCORRECT_PAYLOAD,
                    "wrong transaction identifier",
                    now,
                )
            }
            _ => {
                let t_id = self.t_id();
                self.fail(
                    t_id,
                    explanation::INCORRECT_MESSAGE,
                    "authentication message out of sequence",
                    now,
                )
            }
        }
        None
    }

    /// Takes the result of the DH job [`send_deferred`](Self::send_deferred)
    /// or [`receive_deferred`](Self::receive_deferred) handed out. A job
    /// that was never run ([`DhError::Busy`]) fails the transaction as
    /// refused; a result the transaction no longer waits for (it timed
    /// out meanwhile) is dropped.
    pub fn dh_done(&mut self, result: DhResult, now: Instant) {
        match std::mem::replace(&mut self.state, State::Negotiate) {
            State::Generating { t_id, hash, group } => match result {
                Ok(DhOutput::KeyPair(kp)) if kp.group() == group => {
                    self.state = State::Challenge {
                        t_id,
                        hash,
                        group,
                        key_pair: Some(kp),
                    };
                }
                Err(DhError::Busy) => self.fail_refused(t_id, Refusal::Busy, now),
                _ => self.fail(
                    t_id,
                    explanation::FAILED,
                    "the controller's DH key pair could not be made",
                    now,
                ),
            },
            State::Verifying {
                t_id,
                hash,
                c1,
                s1,
                reply,
            } => match result {
                Ok(DhOutput::Shared(k)) => self.verify(t_id, hash, &c1, s1, &reply, Some(&k), now),
                Err(DhError::Busy) => self.fail_refused(t_id, Refusal::Busy, now),
                _ => self.fail(
                    t_id,
                    explanation::DHGROUP_UNUSABLE,
                    "unusable DH value",
                    now,
                ),
            },
            other => self.state = other,
        }
    }

    /// The current transaction identifier (0 before negotiation).
    fn t_id(&self) -> u16 {
        match &self.state {
            State::Challenge { t_id, .. }
            | State::Generating { t_id, .. }
            | State::Verifying { t_id, .. }
            | State::Reply { t_id, .. }
            | State::Success1 { t_id, .. }
            | State::Success2 { t_id }
            | State::Failure1 { t_id, .. } => *t_id,
            State::Negotiate | State::Done => 0,
        }
    }

    fn negotiate(&mut self, n: &Negotiate, now: Instant) {
        if n.sc_c != 0 {
            return self.fail(
                n.t_id,
                explanation::CONCAT_MISMATCH,
                "secure channel concatenation asked for",
                now,
            );
        }
        if !n.dhchap {
            return self.fail(
                n.t_id,
                explanation::INCORRECT_PAYLOAD,
                "no DH-HMAC-CHAP protocol offered",
                now,
            );
        }
        let Some(keys) = self.keys.clone() else {
            return self.fail(
                n.t_id,
                explanation::NOT_USABLE,
                "the host's secret was removed",
                now,
            );
        };
        let Some(hash) = keys
            .hashes
            .iter()
            .copied()
            .find(|h| n.hashes.contains(&h.id()))
        else {
            return self.fail(
                n.t_id,
                explanation::HASH_UNUSABLE,
                "no allowed hash function offered",
                now,
            );
        };
        let Some(group) = keys
            .dh_groups
            .iter()
            .copied()
            .find(|g| n.dh_groups.contains(&g.id()))
        else {
            return self.fail(
                n.t_id,
                explanation::DHGROUP_UNUSABLE,
                "no allowed DH group offered",
                now,
            );
        };
        self.state = State::Challenge {
            t_id: n.t_id,
            hash,
            group,
            key_pair: None,
        };
        self.current = Some(keys);
    }

    /// The host's Reply: checked at once without DH, else after the job
    /// returned computes the shared secret.
    fn reply(&mut self, r: Reply, now: Instant) -> Option<DhJob> {
        let State::Reply {
            t_id,
            hash,
            key_pair,
            c1,
            s1,
        } = std::mem::replace(&mut self.state, State::Negotiate)
        else {
            return None;
        };
        if r.response.len() != hash.digest_len() {
            self.fail(
                t_id,
                explanation::INCORRECT_PAYLOAD,
                "response of the wrong length",
                now,
            );
            return None;
        }
        match key_pair {
            None if r.dh_value.is_empty() => {
                self.verify(t_id, hash, &c1, s1, &r, None, now);
                None
            }
            None => {
                self.fail(
                    t_id,
                    explanation::INCORRECT_PAYLOAD,
                    "DH value without a DH group",
                    now,
                );
                None
            }
            // A value of the wrong size costs no job.
            Some(kp) if r.dh_value.len() != kp.group().value_len() => {
                self.fail(
                    t_id,
                    explanation::DHGROUP_UNUSABLE,
                    "unusable DH value",
                    now,
                );
                None
            }
            Some(key_pair) => {
                let peer = r.dh_value.clone();
                self.state = State::Verifying {
                    t_id,
                    hash,
                    c1,
                    s1,
                    reply: r,
                };
                Some(DhJob::Shared { key_pair, peer })
            }
        }
    }

    /// Checks the host's response with the session key (if DH is in use)
    /// and prepares the controller's.
    #[allow(clippy::too_many_arguments)]
    fn verify(
        &mut self,
        t_id: u16,
        hash: HashId,
        c1: &[u8],
        s1: u32,
        r: &Reply,
        session_key: Option<&[u8]>,
        now: Instant,
    ) {
        let challenge = |c: &[u8]| match session_key {
            Some(k) => augmented_challenge(hash, k, c).as_bytes().to_vec(),
            None => c.to_vec(),
        };
        let Some(keys) = self.current.clone() else {
            return self.fail(t_id, explanation::FAILED, "no keys negotiated", now);
        };
        let host_key = keys.secret.transform(&self.hostnqn);
        let want = response(
            hash,
            Role::Host,
            host_key.as_bytes(),
            &challenge(c1),
            &Transaction {
                seqnum: s1,
                t_id,
                sc_c: 0,
                hostnqn: &self.hostnqn,
                subnqn: &self.subnqn,
            },
        );
        if !want.ct_eq(&r.response) {
            return self.fail(t_id, explanation::FAILED, "wrong host response", now);
        }
        // Sequence number 0 means no bidirectional authentication, C2 or
        // not (NVMe Base Specification 2.2, 8.3.4.5.4).
        let ctrl_response = match (&r.c2, r.seqnum) {
            (Some(c2), s2) if s2 != 0 => {
                let Some(cs) = &keys.ctrl_secret else {
                    return self.fail(
                        t_id,
                        explanation::FAILED,
                        "controller authentication asked for, but no controller secret is set",
                        now,
                    );
                };
                let key = cs.transform(&self.subnqn);
                Some(response(
                    hash,
                    Role::Controller,
                    key.as_bytes(),
                    &challenge(c2),
                    &Transaction {
                        seqnum: s2,
                        t_id,
                        sc_c: 0,
                        hostnqn: &self.hostnqn,
                        subnqn: &self.subnqn,
                    },
                ))
            }
            _ => None,
        };
        self.state = State::Success1 {
            t_id,
            hash,
            ctrl_response,
        };
    }

    /// Answers an Authentication Receive of allocation length `al`: the
    /// message, zero-padded to `al` (at most [`MAX_RECEIVE`]). DH work
    /// runs on the calling thread.
    pub fn receive(&mut self, al: usize, now: Instant) -> Result<Vec<u8>, ReceiveError> {
        loop {
            match self.receive_deferred(al, now)? {
                Step::Data(d) => return Ok(d),
                // The result moves the transaction out of Generating,
                // so the next turn answers.
                Step::Compute(job) => self.dh_done(job.run(), now),
            }
        }
    }

    /// Answers an Authentication Receive of allocation length `al`, as
    /// [`receive`](Self::receive), or hands out the DH job the answer
    /// needs first: ask again once [`dh_done`](Self::dh_done) took its
    /// result.
    pub fn receive_deferred(&mut self, al: usize, now: Instant) -> Result<Step, ReceiveError> {
        let al = al.min(MAX_RECEIVE);
        if matches!(
            self.state,
            State::Generating { .. } | State::Verifying { .. }
        ) {
            return Err(ReceiveError::InProgress);
        }
        let m = match &mut self.state {
            State::Challenge {
                t_id,
                hash,
                group,
                key_pair,
            } => {
                let (t_id, hash, group) = (*t_id, *hash, *group);
                let need = msg::HEADER_LEN + hash.digest_len() + group.value_len();
                if al < need {
                    return Err(ReceiveError::TooSmall { al, need });
                }
                if group != DhGroup::Null && key_pair.is_none() {
                    self.state = State::Generating { t_id, hash, group };
                    return Ok(Step::Compute(DhJob::Generate(group)));
                }
                let key_pair = key_pair.take();
                let mut c1 = Zeroizing::new(vec![0u8; hash.digest_len()]);
                let mut s1 = [0u8; 4];
                if super::random(&mut c1).is_err() || super::random(&mut s1).is_err() {
                    // Keep the key pair for the Receive asked again.
                    self.state = State::Challenge {
                        t_id,
                        hash,
                        group,
                        key_pair,
                    };
                    return Err(ReceiveError::Random);
                }
                let s1 = u32::from_le_bytes(s1).max(1);
                let m = Message::Challenge(Challenge {
                    t_id,
                    hash: hash.id(),
                    dh_group: group.id(),
                    seqnum: s1,
                    c1: c1.to_vec(),
                    dh_value: key_pair
                        .as_ref()
                        .map(|k| k.public().to_vec())
                        .unwrap_or_default(),
                });
                self.state = State::Reply {
                    t_id,
                    hash,
                    key_pair,
                    c1,
                    s1,
                };
                m
            }
            State::Success1 {
                t_id,
                hash,
                ctrl_response,
            } => {
                let need = msg::HEADER_LEN + hash.digest_len();
                if al < need {
                    return Err(ReceiveError::TooSmall { al, need });
                }
                let t_id = *t_id;
                let m = Message::Success1 {
                    t_id,
                    hl: hash.digest_len() as u8,
                    response: ctrl_response.as_ref().map(|d| d.as_bytes().to_vec()),
                };
                if ctrl_response.is_some() {
                    self.state = State::Success2 { t_id };
                } else {
                    self.finish(Outcome::Succeeded);
                }
                m
            }
            other => {
                if al < msg::FAILURE_LEN {
                    return Err(ReceiveError::TooSmall {
                        al,
                        need: msg::FAILURE_LEN,
                    });
                }
                let closed = self.closed;
                let (t_id, expl, why, refusal) = match other {
                    State::Failure1 {
                        t_id,
                        explanation,
                        why,
                        refusal,
                    } => (*t_id, *explanation, *why, *refusal),
                    _ => (
                        self.t_id(),
                        explanation::INCORRECT_MESSAGE,
                        "authentication receive out of sequence",
                        None,
                    ),
                };
                // A queue that failed already answers without counting
                // a second failure.
                if !closed {
                    self.finish(match refusal {
                        Some(refusal) => Outcome::Refused { refusal },
                        None => Outcome::Failed {
                            explanation: expl,
                            why,
                        },
                    });
                }
                Message::Failure {
                    t_id,
                    second: false,
                    reason: msg::REASON_FAILED,
                    explanation: expl,
                }
            }
        };
        let mut out = m.to_bytes();
        if self.deadline.is_some() {
            self.deadline = now.checked_add(self.timeout);
        }
        out.resize(out.len().max(al), 0);
        Ok(Step::Data(out))
    }
}

//! The timers a connection enforces against a host that stalls: before
//! its ICReq, inside a PDU, and idle without Keep Alive. A [`Target`]
//! holds the values its new connections take.
//!
//! [`Target`]: crate::target::Target

use std::time::Duration;

/// How long a connection may wait for the host's ICReq: a socket that
/// never starts the handshake is closed after it (and counted in
/// [`TargetStats::handshake_timeouts`](crate::target::TargetStats)),
/// so an idle peer holds nothing for long. Initiators send the ICReq
/// right after connecting.
pub const ICREQ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a PDU may take from its first byte to its last: a host that
/// stops halfway through one is closed after it (and counted in
/// [`TargetStats::pdu_timeouts`](crate::target::TargetStats)). The largest
/// PDU a host may send (an H2CData of
/// [`MAX_H2C_DATA`](crate::conn::MAX_H2C_DATA) bytes) takes 0.1 s at
/// 10 Mbit/s.
pub const PDU_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a controller whose host disabled Keep Alive (KATO 0, as
/// non-persistent discovery controllers always do) may go without a
/// command on any of its queues before it is ended, as Linux nvmet gives
/// discovery controllers a 120 s keep-alive when the host asks for none.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The timers a connection enforces; a [`Target`](crate::Target)'s connections take
/// [`Target::timeouts`](crate::target::Target::timeouts) when they are
/// made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// ICReq after accept ([`ICREQ_TIMEOUT`] by default).
    pub handshake: Duration,
    /// A PDU from its first byte to its last ([`PDU_TIMEOUT`]).
    pub pdu: Duration,
    /// A controller with Keep Alive disabled without a command
    /// ([`IDLE_TIMEOUT`]).
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            handshake: ICREQ_TIMEOUT,
            pdu: PDU_TIMEOUT,
            idle: IDLE_TIMEOUT,
        }
    }
}

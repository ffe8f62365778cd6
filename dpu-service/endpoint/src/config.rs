//! What an [`Endpoint`](crate::Endpoint) is made with, and its checks.

use std::net::IpAddr;
use std::time::Duration;

/// Ethernet header bytes in front of every IP packet.
pub const ETHERNET_HEADER: usize = 14;

/// Smallest IP MTU an IPv4 endpoint takes (IPv4's minimum datagram).
pub const MIN_MTU: usize = 576;

/// Smallest IP MTU an IPv6 endpoint takes (IPv6's minimum link MTU).
pub const MIN_MTU_V6: usize = 1280;

/// Largest IP MTU an endpoint takes: jumbo frames of 9216 bytes.
pub const MAX_MTU: usize = 9216;

/// Smallest TCP buffer (each direction) of a connection: room for a few
/// PDUs of 8 KiB in-capsule data.
pub const MIN_BUFFER: usize = 16 << 10;

/// Largest TCP buffer (each direction) of a connection.
pub const MAX_BUFFER: usize = 64 << 20;

/// How an endpoint is placed in its tenant's network and what it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The endpoint's MAC: unicast, not all zeros.
    pub mac: [u8; 6],
    /// The endpoint's IPv4 or IPv6 address in the tenant's network.
    pub address: IpAddr,
    /// Prefix length of the tenant's network (1 to 32 for IPv4, 0 to 128
    /// for IPv6): the hosts the endpoint reaches directly (it has no
    /// router). An IPv6 endpoint answers neighbour solicitations for its
    /// address and resolves hosts with its own.
    pub prefix_len: u8,
    /// IP MTU of the switch port the endpoint sits behind
    /// ([`MIN_MTU`] to [`MAX_MTU`], from [`MIN_MTU_V6`] for IPv6);
    /// frames are up to 14 bytes longer.
    pub mtu: usize,
    /// TCP receive buffer of each connection. Above 64 KiB the window is
    /// scaled (RFC 7323); 256 KiB holds two 128 KiB H2CData PDUs.
    pub rx_buffer: usize,
    /// TCP send buffer of each connection: read data waits here for the
    /// host's window; the NVMe/TCP connection keeps the rest (up to its
    /// output budget) and stops running reads past it.
    pub tx_buffer: usize,
    /// Socket buffer bytes all the endpoint's sockets (listening,
    /// connected and closing) may hold together: a socket is only armed
    /// when its `rx_buffer + tx_buffer` fit.
    pub buffer_budget: usize,
    /// Most connections open at once (handshaking, connected or
    /// closing); a SYN beyond it finds no listening socket and is
    /// answered with a RST.
    pub max_connections: usize,
    /// Most connections open at once from one host address; one more is
    /// reset as soon as its SYN arrives.
    pub max_connections_per_address: usize,
    /// Most connections whose TCP handshake is not complete yet (in
    /// SYN-RECEIVED) at once. One more resets the oldest of them, so a
    /// flood of SYNs that are never completed (from forged addresses)
    /// holds at most this many sockets, and a real host's handshake, done
    /// within a round trip, still gets through.
    pub max_handshakes: usize,
    /// Listening sockets armed per port: SYNs that may arrive between two
    /// polls. Each holds its buffers while it waits (smoltcp sizes the
    /// window scale from them when the socket is made), so an idle port
    /// costs `backlog * (rx_buffer + tx_buffer)`: 1.5 MiB by default.
    pub backlog: usize,
    /// How long a host may take no byte of the endpoint's output before
    /// its connection is reset (as [`dpu_nvmeof::TcpConfig::write_timeout`]).
    pub write_timeout: Duration,
}

impl EndpointConfig {
    /// An endpoint at `address`/`prefix_len` with `mac`, the defaults
    /// elsewhere: MTU 1500, 256 KiB receive and 512 KiB send buffers,
    /// 256 MiB of them in all, the kernel transport's connection limits
    /// scaled to one endpoint (341 and 128) and write timeout.
    pub fn new(mac: [u8; 6], address: impl Into<IpAddr>, prefix_len: u8) -> Self {
        Self {
            mac,
            address: address.into(),
            prefix_len,
            mtu: 1500,
            rx_buffer: 256 << 10,
            tx_buffer: 512 << 10,
            buffer_budget: 256 << 20,
            max_connections: 341,
            max_connections_per_address: 128,
            max_handshakes: 32,
            backlog: 2,
            write_timeout: dpu_nvmeof::tcp::WRITE_TIMEOUT,
        }
    }

    /// Socket buffer bytes one connection holds.
    pub fn per_connection(&self) -> usize {
        self.rx_buffer + self.tx_buffer
    }

    /// Checks every field.
    ///
    /// # Errors
    /// The first field out of its range, named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.mac == [0; 6] || self.mac[0] & 1 == 1 {
            return Err(ConfigError::Invalid {
                field: "mac",
                why: "must be a unicast address other than 00:00:00:00:00:00",
            });
        }
        let (host, prefix, min_mtu, mtu_text) = match self.address {
            IpAddr::V4(a) => (
                !(a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_loopback()),
                (1, 32, "1 to 32"),
                MIN_MTU,
                "576 to 9216",
            ),
            IpAddr::V6(a) => (
                !(a.is_unspecified()
                    || a.is_multicast()
                    || a.is_loopback()
                    || a.is_unicast_link_local()
                    || a.to_ipv4_mapped().is_some()),
                (0, 128, "0 to 128"),
                MIN_MTU_V6,
                "1280 to 9216",
            ),
        };
        if !host {
            return Err(ConfigError::Invalid {
                field: "address",
                why: "must be a unicast address (not unspecified, loopback, multicast, broadcast, IPv6 link-local or IPv4-mapped)",
            });
        }
        let range = |field, value: usize, lo: usize, hi: usize, text| {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange {
                    field,
                    value,
                    range: text,
                })
            }
        };
        let (lo, hi, text) = prefix;
        range("prefix_len", usize::from(self.prefix_len), lo, hi, text)?;
        range("mtu", self.mtu, min_mtu, MAX_MTU, mtu_text)?;
        range(
            "rx_buffer",
            self.rx_buffer,
            MIN_BUFFER,
            MAX_BUFFER,
            "16 KiB to 64 MiB",
        )?;
        range(
            "tx_buffer",
            self.tx_buffer,
            MIN_BUFFER,
            MAX_BUFFER,
            "16 KiB to 64 MiB",
        )?;
        range(
            "buffer_budget",
            self.buffer_budget,
            self.per_connection(),
            usize::MAX,
            "at least rx_buffer + tx_buffer",
        )?;
        range(
            "max_connections",
            self.max_connections,
            1,
            65_535,
            "1 to 65535",
        )?;
        range(
            "max_connections_per_address",
            self.max_connections_per_address,
            1,
            65_535,
            "1 to 65535",
        )?;
        range(
            "max_handshakes",
            self.max_handshakes,
            1,
            65_535,
            "1 to 65535",
        )?;
        range("backlog", self.backlog, 1, 64, "1 to 64")?;
        if self.write_timeout.is_zero() {
            return Err(ConfigError::OutOfRange {
                field: "write_timeout",
                value: 0,
                range: "more than 0",
            });
        }
        Ok(())
    }
}

/// Why an [`EndpointConfig`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A number out of its range.
    #[error("{field}: {value} is out of range ({range})")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The values it may take.
        range: &'static str,
    },
    /// An address that cannot be the endpoint's.
    #[error("{field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn ok() -> EndpointConfig {
        EndpointConfig::new([2, 0, 0, 0, 0, 1], Ipv4Addr::new(10, 1, 0, 250), 24)
    }

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        assert_eq!(ok().validate(), Ok(()));
        let bad = |f: fn(&mut EndpointConfig)| {
            let mut c = ok();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.mac = [1, 0, 0, 0, 0, 1]).starts_with("mac:"));
        assert!(bad(|c| c.mac = [0; 6]).starts_with("mac:"));
        assert!(bad(|c| c.address = Ipv4Addr::BROADCAST.into()).starts_with("address:"));
        assert_eq!(
            bad(|c| c.prefix_len = 33),
            "prefix_len: 33 is out of range (1 to 32)"
        );
        assert_eq!(
            bad(|c| c.mtu = 9217),
            "mtu: 9217 is out of range (576 to 9216)"
        );
        assert!(bad(|c| c.rx_buffer = 1024).starts_with("rx_buffer:"));
        assert!(bad(|c| c.buffer_budget = c.rx_buffer).starts_with("buffer_budget:"));
        assert!(bad(|c| c.max_connections = 0).starts_with("max_connections:"));
        assert!(bad(|c| c.max_handshakes = 0).starts_with("max_handshakes:"));
        assert!(bad(|c| c.backlog = 0).starts_with("backlog:"));
        assert!(bad(|c| c.write_timeout = Duration::ZERO).starts_with("write_timeout:"));
    }

    #[test]
    fn ipv6_endpoints_need_a_routable_unicast_address_and_a_1280_mtu() {
        let mut c = ok();
        c.address = "fd00:1::250".parse().unwrap();
        c.prefix_len = 0;
        assert_eq!(c.validate(), Ok(()));
        c.prefix_len = 64;
        assert_eq!(c.validate(), Ok(()));
        for a in ["::", "::1", "ff02::1", "fe80::1", "::ffff:10.1.0.250"] {
            let mut b = c.clone();
            b.address = a.parse().unwrap();
            assert!(
                b.validate()
                    .unwrap_err()
                    .to_string()
                    .starts_with("address:"),
                "{a} accepted"
            );
        }
        let mut b = c.clone();
        b.prefix_len = 129;
        assert_eq!(
            b.validate().unwrap_err().to_string(),
            "prefix_len: 129 is out of range (0 to 128)"
        );
        b = c.clone();
        b.mtu = 1279;
        assert_eq!(
            b.validate().unwrap_err().to_string(),
            "mtu: 1279 is out of range (1280 to 9216)"
        );
        // IPv4 keeps its own bounds.
        let mut v4 = ok();
        v4.prefix_len = 0;
        assert!(v4.validate().is_err());
        v4.prefix_len = 1;
        v4.mtu = 576;
        assert_eq!(v4.validate(), Ok(()));
    }
}

//! Storage endpoints in the switch: stations of a tenant that the service
//! itself serves (an NVMe/TCP target's TCP/IP stack), not hosts behind a
//! port.
//!
//! Each endpoint becomes, at compile time, one more attachment of its
//! tenant on a *virtual port* numbered after the driver's ports (endpoint
//! `k` of the configuration, counting tenants in order, is port
//! `ports + k`), guarded for exactly its MAC and IP address. Everything
//! the switch does for a station then holds for it with no code of its
//! own on the packet path: the tenant's rules and connection tracking
//! apply both ways, its counters count it, its broadcasts (ARP requests
//! for its address among them) reach it, and no frame of another tenant
//! can, as no other tenant has an attachment on its port. A frame the
//! endpoint sends enters as received on its virtual port.
//!
//! Two things a learned station would not get are fixed for endpoints:
//! a frame to an endpoint's MAC goes to its port whatever the MAC table
//! says (it is never flooded to the tenant's ports first, and an address
//! learned elsewhere cannot divert it), and a frame from an endpoint's
//! MAC that enters anywhere but its port is dropped as `Spoofed` before
//! anything is learned from it. Both cost a tenant without endpoints one
//! test of an empty list.
//!
//! Where a worker sends a frame for a virtual port, and where it takes
//! the endpoint's frames from, is the worker's business
//! ([`crate::endpoint_queues`]); the switch only names the port.

use std::net::IpAddr;
use std::sync::Arc;

use super::config::{Attach, ConfigError, Guard, SwitchConfig};
use crate::endpoint_queues::{EndpointQueues, EndpointTable};

/// A storage endpoint of a tenant: its MAC and IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// MAC address: unicast, not zero, unique among all endpoints.
    pub mac: [u8; 6],
    /// IPv4 or IPv6 address, unicast, unique within the tenant. The
    /// endpoint's frames may have it alone as their source: an IPv4
    /// endpoint's ARP and IPv4, an IPv6 endpoint's IPv6 (its neighbour
    /// discovery included).
    pub ip: IpAddr,
}

/// Where an endpoint was compiled: its tenant and virtual port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointPort {
    /// The tenant's index in the configuration.
    pub tenant: usize,
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The virtual port frames for it are forwarded to, and its own
    /// frames enter through.
    pub port: usize,
}

/// A storage endpoint of the current configuration with its queues: what
/// the thread serving the endpoint's stack needs.
#[derive(Debug, Clone)]
pub struct EndpointLink {
    /// The tenant's name.
    pub tenant: String,
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Its virtual port in the current configuration (it may change when
    /// other endpoints come or go; the queues do not).
    pub port: usize,
    /// The frames between the workers and its stack.
    pub queues: Arc<EndpointQueues>,
}

/// The endpoints of the configuration compiled before, whose queues the
/// next one keeps where it can.
pub(super) struct Previous<'a> {
    /// Their virtual ports, in order.
    pub(super) ports: &'a [EndpointPort],
    /// Their tenants' names, in the same order.
    pub(super) tenants: &'a [String],
    /// Their queues, by virtual port.
    pub(super) queues: Option<&'a EndpointTable>,
}

/// The queues of `ports` (whose tenants are named in `tenants`), by
/// virtual port: an endpoint of `prev` (same tenant, MAC and address)
/// keeps its queues if they are still of the right shape, others get new
/// ones. `None` without endpoints.
pub(super) fn endpoint_queues(
    config: &SwitchConfig,
    ports: &[EndpointPort],
    tenants: &[String],
    prev: Option<Previous<'_>>,
) -> Option<Arc<EndpointTable>> {
    let first = ports.first()?.port;
    let workers = config.workers.max(1);
    let queues = ports
        .iter()
        .zip(tenants)
        .map(|(p, tenant)| {
            prev.as_ref()
                .and_then(|c| {
                    let i = c
                        .ports
                        .iter()
                        .zip(c.tenants)
                        .position(|(o, t)| o.endpoint == p.endpoint && t == tenant)?;
                    let q = c.queues?.get_arc(i)?;
                    (q.workers() == workers
                        && q.frame_max() == config.endpoint_frame_max
                        && q.depth() == config.endpoint_queue_depth.max(1))
                    .then_some(q)
                })
                .unwrap_or_else(|| {
                    Arc::new(EndpointQueues::new(
                        workers,
                        config.endpoint_queue_depth,
                        config.endpoint_frame_max,
                    ))
                })
        })
        .collect();
    Some(Arc::new(EndpointTable::new(first, queues)))
}

/// The virtual ports of `config`'s endpoints, in order, or an error if
/// an endpoint is malformed or a MAC or (tenant, address) repeats.
///
/// # Errors
/// [`ConfigError::BadEndpoint`] naming the tenant and the problem.
pub(super) fn endpoint_ports(config: &SwitchConfig) -> Result<Vec<EndpointPort>, ConfigError> {
    let mut out: Vec<EndpointPort> = Vec::new();
    for (ti, t) in config.tenants.iter().enumerate() {
        for e in &t.endpoints {
            let bad = |reason: String| ConfigError::BadEndpoint {
                tenant: t.name.clone(),
                reason,
            };
            if e.mac[0] & 1 != 0 || e.mac == [0; 6] {
                return Err(bad(format!("MAC {:02x?} is not a unicast address", e.mac)));
            }
            let host = match e.ip {
                IpAddr::V4(a) => !(a.is_unspecified() || a.is_broadcast() || a.is_multicast()),
                IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast()),
            };
            if !host {
                return Err(bad(format!("address {} is not a host's", e.ip)));
            }
            if let Some(o) = out.iter().find(|o| o.endpoint.mac == e.mac) {
                return Err(bad(format!(
                    "MAC {:02x?} is already the endpoint of tenant {}",
                    e.mac, config.tenants[o.tenant].name
                )));
            }
            if out.iter().any(|o| o.tenant == ti && o.endpoint.ip == e.ip) {
                return Err(bad(format!("two endpoints have address {}", e.ip)));
            }
            out.push(EndpointPort {
                tenant: ti,
                endpoint: *e,
                port: config.ports + out.len(),
            });
        }
    }
    Ok(out)
}

/// `config` with each endpoint of `ports` an attachment of its tenant on
/// its virtual port, guarded for its addresses alone; `ports` counts the
/// virtual ones too.
pub(super) fn with_endpoint_attachments(
    config: &SwitchConfig,
    ports: &[EndpointPort],
) -> SwitchConfig {
    let mut c = config.clone();
    c.ports += ports.len();
    for p in ports {
        let t = &mut c.tenants[p.tenant];
        t.guards.resize(t.attachments.len(), Guard::default());
        t.attachments.push(Attach::port(p.port, 0));
        let (v4, v6) = match p.endpoint.ip {
            IpAddr::V4(a) => (vec![(u32::from(a), u32::from(a))], Vec::new()),
            IpAddr::V6(a) => (Vec::new(), vec![(u128::from(a), u128::from(a))]),
        };
        t.guards.push(Guard {
            macs: vec![p.endpoint.mac],
            v4,
            v6,
        });
    }
    c
}

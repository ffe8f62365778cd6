//! The discovery log: what a discovery controller tells a host about the
//! subsystems it may connect to, and the generation counter that tells it
//! when that changed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use crate::identify::{self, AddressFamily, DiscoveryEntry, DiscoverySubtype};

use super::Target;

impl Target {
    /// The discovery log's generation counter.
    pub fn discovery_genctr(&self) -> u64 {
        self.inner.discovery_genctr.load(Ordering::Relaxed)
    }

    /// The discovery log as `hostnqn` may see it on a connection accepted
    /// on `local`: one entry per listener of every subsystem that allows
    /// the host, a listener on the unspecified address at `local`'s.
    pub(crate) fn discovery_log(&self, hostnqn: &str, local: SocketAddr) -> Vec<u8> {
        let mut entries = Vec::new();
        for sub in self.subsystems() {
            if !sub.allows_host(hostnqn) {
                continue;
            }
            for (i, l) in sub.listeners.iter().enumerate() {
                let addr = if l.ip().is_unspecified() {
                    SocketAddr::new(local.ip(), l.port())
                } else {
                    *l
                };
                entries.push(DiscoveryEntry {
                    subtype: DiscoverySubtype::Nvme,
                    port_id: i as u16 + 1,
                    cntlid: 0xffff,
                    asqsz: 32,
                    family: if addr.is_ipv4() {
                        AddressFamily::Ipv4
                    } else {
                        AddressFamily::Ipv6
                    },
                    traddr: addr.ip().to_string(),
                    trsvcid: addr.port().to_string(),
                    subnqn: sub.nqn.clone(),
                    duplicate_returned_info: false,
                    explicit_persistent_connection: false,
                    secure_channel: self.secure_channel(*l),
                });
            }
        }
        identify::discovery_log(self.discovery_genctr(), &entries)
    }
}

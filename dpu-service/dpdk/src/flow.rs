//! Flow rules in hardware (`rte_flow`): validated, created, counted,
//! aged and destroyed.
//!
//! A [`FlowSpec`] describes one exact-match rule in plain fields; the
//! shim in `dpdk-sys` (`shim/flow.c`) turns it into the `rte_flow` items
//! and actions of the DPDK release it was built against, whose layouts
//! differ between releases. A created rule is a [`Flow`], destroyed when
//! it drops (or by [`Flow::destroy`], which reports a failure).

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr};
use std::ptr::NonNull;

use dpdk_sys as sys;

/// Where a rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowAttach {
    /// A transfer rule of an embedded switch, matching packets that come
    /// from this represented port (a DPDK port ID of the switch domain).
    Transfer {
        /// The port the packets come from.
        from: u16,
    },
    /// An ingress rule of the port it is created on.
    Ingress,
}

/// The outer 802.1Q tag a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlowVlan {
    /// Tagged or not: the tag is not looked at.
    #[default]
    Any,
    /// Untagged frames only.
    None,
    /// Frames whose outer tag has this VLAN ID.
    Id(u16),
}

/// The tag operation of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlowVlanOp {
    /// The frame keeps its tag (or lack of one).
    #[default]
    Keep,
    /// The outer tag is removed.
    Pop,
    /// A tag with this VLAN ID is added.
    Push(u16),
    /// The outer tag's VLAN ID becomes this one.
    Set(u16),
}

/// The outer headers a rule puts a frame in: VXLAN over IPv4 and UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEncap {
    /// The local VTEP's MAC address.
    pub src_mac: [u8; 6],
    /// The next hop's MAC address.
    pub dst_mac: [u8; 6],
    /// The local VTEP's address.
    pub src_ip: Ipv4Addr,
    /// The remote VTEP's address.
    pub dst_ip: Ipv4Addr,
    /// The outer UDP source port (the flow's entropy).
    pub src_port: u16,
    /// The VXLAN network identifier.
    pub vni: u32,
}

/// What finally happens to a matched packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowFate {
    /// It is dropped.
    Drop,
    /// It leaves through this represented port (transfer rules).
    Port(u16),
}

/// One exact-match flow rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSpec {
    /// Where it applies.
    pub attach: FlowAttach,
    /// The VNI of the VXLAN tunnel (IPv4, UDP port 4789) the frame
    /// arrives in; the MACs, tag and 5-tuple are then the inner frame's.
    pub vni: Option<u32>,
    /// The frame's outer tag.
    pub vlan: FlowVlan,
    /// Source and destination MAC addresses, if matched.
    pub macs: Option<([u8; 6], [u8; 6])>,
    /// Source address (both addresses of one IP version).
    pub src_ip: IpAddr,
    /// Destination address.
    pub dst_ip: IpAddr,
    /// IP protocol. TCP and UDP match their ports, ICMP and ICMPv6
    /// their type (in `src_port`) and code (in `dst_port`); other
    /// protocols are matched alone.
    pub proto: u8,
    /// Source port (ICMP type).
    pub src_port: u16,
    /// Destination port (ICMP code).
    pub dst_port: u16,
    /// TCP flags that must all be clear (0: the flags are not matched).
    pub tcp_flags_clear: u8,
    /// Remove the VXLAN headers the frame arrived in.
    pub decap: bool,
    /// The tag operation (after a decapsulation).
    pub vlan_op: FlowVlanOp,
    /// Put the frame in VXLAN (after the tag operation).
    pub encap: Option<FlowEncap>,
    /// Count packets and bytes ([`Flow::counts`]).
    pub count: bool,
    /// Age out after this many idle seconds, reported by [`aged`] with
    /// this context.
    pub age: Option<(u32, u64)>,
    /// What happens to the packet in the end.
    pub fate: FlowFate,
}

impl FlowSpec {
    fn raw(&self) -> sys::dpdk_shim_flow {
        let mut f = sys::dpdk_shim_flow::default();
        let mut flags = 0;
        match self.attach {
            FlowAttach::Transfer { from } => {
                flags |= sys::DPDK_SHIM_FLOW_TRANSFER;
                f.in_port = from;
            }
            FlowAttach::Ingress => flags |= sys::DPDK_SHIM_FLOW_INGRESS,
        }
        if let Some(vni) = self.vni {
            flags |= sys::DPDK_SHIM_FLOW_VXLAN;
            f.vni = vni;
        }
        match self.vlan {
            FlowVlan::Any => {}
            FlowVlan::None => flags |= sys::DPDK_SHIM_FLOW_NO_VLAN,
            FlowVlan::Id(id) => {
                flags |= sys::DPDK_SHIM_FLOW_VLAN;
                f.vlan_id = id;
            }
        }
        if let Some((src, dst)) = self.macs {
            flags |= sys::DPDK_SHIM_FLOW_MACS;
            f.src_mac = src;
            f.dst_mac = dst;
        }
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                flags |= sys::DPDK_SHIM_FLOW_IPV6;
                f.src_ip = s.octets();
                f.dst_ip = d.octets();
            }
            (s, d) => {
                f.src_ip[..4].copy_from_slice(&v4(s).octets());
                f.dst_ip[..4].copy_from_slice(&v4(d).octets());
            }
        }
        f.proto = self.proto;
        f.src_port = self.src_port;
        f.dst_port = self.dst_port;
        if self.tcp_flags_clear != 0 {
            flags |= sys::DPDK_SHIM_FLOW_TCP_FLAGS;
            f.tcp_flags_clear = self.tcp_flags_clear;
        }
        if self.decap {
            flags |= sys::DPDK_SHIM_FLOW_DECAP;
        }
        match self.vlan_op {
            FlowVlanOp::Keep => {}
            FlowVlanOp::Pop => flags |= sys::DPDK_SHIM_FLOW_POP_VLAN,
            FlowVlanOp::Push(id) => {
                flags |= sys::DPDK_SHIM_FLOW_PUSH_VLAN;
                f.set_vid = id;
            }
            FlowVlanOp::Set(id) => {
                flags |= sys::DPDK_SHIM_FLOW_SET_VLAN;
                f.set_vid = id;
            }
        }
        if let Some(e) = self.encap {
            flags |= sys::DPDK_SHIM_FLOW_ENCAP;
            f.encap_src_mac = e.src_mac;
            f.encap_dst_mac = e.dst_mac;
            f.encap_src_ip = u32::from(e.src_ip);
            f.encap_dst_ip = u32::from(e.dst_ip);
            f.encap_src_port = e.src_port;
            f.encap_vni = e.vni;
        }
        if self.count {
            flags |= sys::DPDK_SHIM_FLOW_COUNT;
        }
        if let Some((secs, context)) = self.age {
            flags |= sys::DPDK_SHIM_FLOW_AGE;
            f.age_secs = secs;
            f.age_context = context;
        }
        match self.fate {
            FlowFate::Drop => f.fate = sys::DPDK_SHIM_FLOW_FATE_DROP as u8,
            FlowFate::Port(p) => {
                f.fate = sys::DPDK_SHIM_FLOW_FATE_PORT as u8;
                f.out_port = p;
            }
        }
        f.flags = flags;
        f
    }
}

/// An IPv4 address, or the unspecified one for an IPv6 address (a spec
/// mixing versions matches the IPv4 unspecified address, which no flow
/// has).
fn v4(a: IpAddr) -> Ipv4Addr {
    match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    }
}

/// Why a driver refused or failed a flow operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} on port {port}: {message} (errno {code}, {cause})")]
pub struct FlowError {
    /// The operation (`validate`, `create`, `query`, `destroy`, `aged`,
    /// `transfer proxy`, `flush`).
    pub op: &'static str,
    /// The DPDK port.
    pub port: u16,
    /// The positive errno.
    pub code: i32,
    /// What the driver blamed (`item`, `action`, `attribute`, ...).
    pub cause: &'static str,
    /// The driver's message.
    pub message: String,
}

impl FlowError {
    /// The driver cannot express the rule (an item, action or attribute
    /// it does not support).
    pub fn is_unsupported(&self) -> bool {
        matches!(self.code, libc::ENOTSUP | libc::ENOSYS | libc::EINVAL)
    }

    /// The driver has no room for more rules or counters.
    pub fn is_full(&self) -> bool {
        matches!(self.code, libc::ENOMEM | libc::ENOSPC | libc::ENOBUFS)
    }

    fn from_raw(op: &'static str, port: u16, rc: i32, e: &sys::rte_flow_error) -> FlowError {
        let message = if e.message.is_null() {
            crate::strerror(rc)
        } else {
            // SAFETY: the driver set message to a NUL-terminated string
            // that lives at least until the next flow call on this thread.
            unsafe { CStr::from_ptr(e.message) }
                .to_string_lossy()
                .into_owned()
        };
        FlowError {
            op,
            port,
            code: rc.abs(),
            cause: cause_name(e.type_),
            message,
        }
    }
}

fn cause_name(t: sys::rte_flow_error_type) -> &'static str {
    match t {
        sys::RTE_FLOW_ERROR_TYPE_ATTR
        | sys::RTE_FLOW_ERROR_TYPE_ATTR_GROUP
        | sys::RTE_FLOW_ERROR_TYPE_ATTR_PRIORITY
        | sys::RTE_FLOW_ERROR_TYPE_ATTR_INGRESS
        | sys::RTE_FLOW_ERROR_TYPE_ATTR_EGRESS
        | sys::RTE_FLOW_ERROR_TYPE_ATTR_TRANSFER => "attribute",
        sys::RTE_FLOW_ERROR_TYPE_ITEM
        | sys::RTE_FLOW_ERROR_TYPE_ITEM_NUM
        | sys::RTE_FLOW_ERROR_TYPE_ITEM_SPEC
        | sys::RTE_FLOW_ERROR_TYPE_ITEM_LAST
        | sys::RTE_FLOW_ERROR_TYPE_ITEM_MASK => "item",
        sys::RTE_FLOW_ERROR_TYPE_ACTION
        | sys::RTE_FLOW_ERROR_TYPE_ACTION_NUM
        | sys::RTE_FLOW_ERROR_TYPE_ACTION_CONF => "action",
        sys::RTE_FLOW_ERROR_TYPE_HANDLE => "handle",
        _ => "unspecified",
    }
}

/// Checks that `port` would create the rule, without creating it.
///
/// # Errors
/// The driver's refusal.
pub fn validate(port: u16, spec: &FlowSpec) -> Result<(), FlowError> {
    let raw = spec.raw();
    let mut e = sys::rte_flow_error::default();
    // SAFETY: raw and e are valid for the call; the shim builds the items
    // and actions on its own stack from raw and does not keep pointers.
    let rc = unsafe { sys::dpdk_shim_flow_validate(port, &raw, &mut e) };
    if rc == 0 {
        Ok(())
    } else {
        Err(FlowError::from_raw("validate", port, rc, &e))
    }
}

/// Creates the rule on `port` (for a transfer rule, the switch's
/// [`transfer_proxy`]).
///
/// # Errors
/// The driver's refusal or failure.
pub fn create(port: u16, spec: &FlowSpec) -> Result<Flow, FlowError> {
    let raw = spec.raw();
    let mut e = sys::rte_flow_error::default();
    // SAFETY: as in validate; the driver copies what it needs of the
    // items and actions before returning.
    let flow = unsafe { sys::dpdk_shim_flow_create(port, &raw, &mut e) };
    match NonNull::new(flow) {
        Some(raw) => Ok(Flow { port, raw }),
        None => {
            // SAFETY: reading this thread's rte_errno has no precondition.
            let rc = unsafe { sys::dpdk_shim_rte_errno() };
            Err(FlowError::from_raw("create", port, rc, &e))
        }
    }
}

/// The contexts of rules of `port` that aged out since the last call, at
/// most `max` (and at most 256) of them, appended to `out`.
///
/// # Errors
/// The driver's failure (a driver without aging says it does not support
/// the operation).
pub fn aged(port: u16, out: &mut Vec<u64>, max: usize) -> Result<usize, FlowError> {
    let mut buf = [0u64; 256];
    let n = max.min(buf.len());
    let mut e = sys::rte_flow_error::default();
    // SAFETY: buf has room for n (≤ 256) contexts; e is a valid out pointer.
    let rc = unsafe { sys::dpdk_shim_flow_aged(port, buf.as_mut_ptr(), n as u32, &mut e) };
    if rc < 0 {
        return Err(FlowError::from_raw("aged", port, rc, &e));
    }
    let got = usize::try_from(rc).unwrap_or(0).min(n);
    out.extend_from_slice(&buf[..got]);
    Ok(got)
}

/// The port that transfer rules for `port`'s switch are created on.
///
/// # Errors
/// The driver's failure (ports outside a switch have none).
pub fn transfer_proxy(port: u16) -> Result<u16, FlowError> {
    let mut proxy = port;
    let mut e = sys::rte_flow_error::default();
    // SAFETY: proxy and e are valid out pointers.
    let rc = unsafe { sys::dpdk_shim_flow_transfer_proxy(port, &mut proxy, &mut e) };
    if rc == 0 {
        Ok(proxy)
    } else {
        Err(FlowError::from_raw("transfer proxy", port, rc, &e))
    }
}

/// Destroys every rule of `port`, including ones no [`Flow`] holds.
///
/// # Errors
/// The driver's failure.
pub fn flush(port: u16) -> Result<(), FlowError> {
    let mut e = sys::rte_flow_error::default();
    // SAFETY: e is a valid out pointer; rules the flush destroys and that a
    // Flow still holds must not be destroyed again: callers flush only
    // ports whose Flows are gone.
    let rc = unsafe { sys::rte_flow_flush(port, &mut e) };
    if rc == 0 {
        Ok(())
    } else {
        Err(FlowError::from_raw("flush", port, rc, &e))
    }
}

/// A rule created in hardware, destroyed when dropped.
#[derive(Debug)]
pub struct Flow {
    port: u16,
    raw: NonNull<sys::rte_flow>,
}

// SAFETY: an rte_flow handle is an opaque token of its port; ethdev
// serialises flow calls of drivers that are not thread-safe, so the
// handle may be used and destroyed from any one thread at a time.
unsafe impl Send for Flow {}

impl Flow {
    /// The port the rule was created on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Packets and bytes the rule has matched since it was created.
    ///
    /// # Errors
    /// The driver's failure (a rule without a counter cannot be queried).
    pub fn counts(&self) -> Result<(u64, u64), FlowError> {
        let (mut hits, mut bytes) = (0u64, 0u64);
        let mut e = sys::rte_flow_error::default();
        // SAFETY: raw is a live rule of port; the out pointers are valid.
        let rc = unsafe {
            sys::dpdk_shim_flow_query_count(
                self.port,
                self.raw.as_ptr(),
                &mut hits,
                &mut bytes,
                &mut e,
            )
        };
        if rc == 0 {
            Ok((hits, bytes))
        } else {
            Err(FlowError::from_raw("query", self.port, rc, &e))
        }
    }

    /// Destroys the rule.
    ///
    /// # Errors
    /// The driver's failure, with the rule handed back: it may still be
    /// in hardware.
    pub fn destroy(self) -> Result<(), (Flow, FlowError)> {
        let this = std::mem::ManuallyDrop::new(self);
        match this.destroy_raw() {
            Ok(()) => Ok(()),
            Err(e) => Err((std::mem::ManuallyDrop::into_inner(this), e)),
        }
    }

    fn destroy_raw(&self) -> Result<(), FlowError> {
        let mut e = sys::rte_flow_error::default();
        // SAFETY: raw is a live rule of port, destroyed at most once: by
        // destroy (which then forgets self) or by drop.
        let rc = unsafe { sys::rte_flow_destroy(self.port, self.raw.as_ptr(), &mut e) };
        if rc == 0 {
            Ok(())
        } else {
            Err(FlowError::from_raw("destroy", self.port, rc, &e))
        }
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        let _ = self.destroy_raw();
    }
}

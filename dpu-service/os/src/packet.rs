//! Packet sockets (`AF_PACKET`) for the data plane's kernel driver on
//! machines without DPDK, and interface queries.
//!
//! Contract: a [`PacketSocket`] owns its descriptor (closed on drop), is
//! bound to one interface, never blocks, and never hands the caller a
//! frame it sent itself. Burst calls take at most [`MAX_BURST`] frames and
//! write only into the buffers the caller lends them.
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

use libc::{c_int, c_uint, c_void, socklen_t};

use crate::sys::{cvt, invalid};

/// The most frames one [`PacketSocket::recv_burst`] or
/// [`PacketSocket::send_burst`] call moves.
pub const MAX_BURST: usize = 64;

/// Every protocol (`ETH_P_ALL`), host order.
const ETH_P_ALL: u16 = 0x0003;
/// `PACKET_OUTGOING` in `sockaddr_ll::sll_pkttype`: a frame this host sent.
const PACKET_OUTGOING: u8 = 4;
/// The 802.1Q TPID, used when the kernel does not report one.
const TPID_8021Q: u16 = 0x8100;

/// Room for one control message carrying a `tpacket_auxdata` (40 bytes on
/// 64-bit Linux), with margin; 8-byte aligned like `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct ControlBuf([u8; 64]);

/// What the kernel said about one received frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxMeta {
    /// Bytes written into the buffer.
    pub len: usize,
    /// The frame was longer than the buffer and was cut.
    pub truncated: bool,
    /// The outer VLAN tag the interface stripped on receive, as
    /// `(tpid, tci)`; the frame's bytes no longer hold it.
    pub vlan: Option<(u16, u16)>,
}

/// An interface's state as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    /// Administratively up and running (carrier present).
    pub up: bool,
    /// Hardware address.
    pub mac: [u8; 6],
    /// MTU in bytes.
    pub mtu: u32,
}

/// A raw packet socket bound to one interface, non-blocking.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    /// The interface name, NUL-padded, as `ifreq` wants it.
    ifname: [libc::c_char; libc::IFNAMSIZ],
}

/// The kernel's index of interface `name`.
///
/// # Errors
/// If the name is not a valid interface name or no such interface exists.
pub fn if_index(name: &str) -> io::Result<u32> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(invalid("interface names are 1 to 15 bytes"));
    }
    let c = CString::new(name).map_err(|_| invalid("interface name contains NUL"))?;
    // SAFETY: `c` is a NUL-terminated string that lives across the call;
    // if_nametoindex only reads it.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("interface {name:?}: {e}")));
    }
    Ok(index)
}

impl PacketSocket {
    /// Opens a packet socket on interface `ifname` that receives every
    /// frame arriving there (the whole interface in promiscuous mode when
    /// `promiscuous`), with stripped VLAN tags reported in [`RxMeta`], and
    /// sends whole Ethernet frames out of it. Needs `CAP_NET_RAW`.
    ///
    /// # Errors
    /// If the interface does not exist or the kernel refuses a step (the
    /// error says which).
    pub fn open(ifname: &str, promiscuous: bool) -> io::Result<PacketSocket> {
        let ifindex = if_index(ifname)?;
        let mut name = [0 as libc::c_char; libc::IFNAMSIZ];
        for (d, s) in name.iter_mut().zip(ifname.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: socket() takes only integers; the result is checked.
        let raw = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                c_int::from(ETH_P_ALL.to_be()),
            )
        })
        .map_err(|e| step(e, "socket(AF_PACKET)"))?;
        // SAFETY: `raw` is a descriptor socket() just returned; nothing
        // else owns it, so OwnedFd may close it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let s = PacketSocket {
            fd,
            ifindex,
            ifname: name,
        };
        // Frames this socket sends must not come back to it (Linux 4.20+;
        // older kernels report them as PACKET_OUTGOING, skipped below).
        match s.set_opt(libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1 as &c_int) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {}
            Err(e) => return Err(step(e, "PACKET_IGNORE_OUTGOING")),
        }
        s.set_opt(libc::SOL_PACKET, libc::PACKET_AUXDATA, &1 as &c_int)
            .map_err(|e| step(e, "PACKET_AUXDATA"))?;
        let addr = libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as u16,
            sll_protocol: ETH_P_ALL.to_be(),
            sll_ifindex: c_int::try_from(ifindex).map_err(|_| invalid("interface index"))?,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: 0,
            sll_addr: [0; 8],
        };
        // SAFETY: `addr` is a complete sockaddr_ll and the length passed is
        // its size; bind only reads it.
        cvt(unsafe {
            libc::bind(
                s.fd.as_raw_fd(),
                ptr::from_ref(&addr).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_ll>() as socklen_t,
            )
        })
        .map_err(|e| step(e, "bind"))?;
        if promiscuous {
            let mreq = libc::packet_mreq {
                mr_ifindex: addr.sll_ifindex,
                mr_type: libc::PACKET_MR_PROMISC as u16,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            s.set_opt(libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
                .map_err(|e| step(e, "promiscuous mode"))?;
        }
        Ok(s)
    }

    /// The interface's kernel index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Spreads the interface's frames over several sockets by flow hash
    /// (`PACKET_FANOUT_HASH`; the kernel's flow hash is symmetric, so both
    /// directions of a flow meet on one socket). `None` starts a new group
    /// with an ID the kernel picks, so services side by side never collide;
    /// pass the returned ID to the other sockets of the interface.
    ///
    /// # Errors
    /// If the kernel refuses (e.g. a group ID of another interface).
    pub fn join_fanout(&self, group: Option<u16>) -> io::Result<u16> {
        let ty = libc::PACKET_FANOUT_HASH;
        let arg: c_uint = match group {
            Some(id) => c_uint::from(id) | (ty << 16),
            None => (ty | libc::PACKET_FANOUT_FLAG_UNIQUEID) << 16,
        };
        self.set_opt(libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
            .map_err(|e| step(e, "PACKET_FANOUT"))?;
        match group {
            Some(id) => Ok(id),
            None => {
                let v: c_uint = self
                    .get_opt(libc::SOL_PACKET, libc::PACKET_FANOUT)
                    .map_err(|e| step(e, "reading the fanout group"))?;
                Ok((v & 0xffff) as u16)
            }
        }
    }

    /// Receives up to `bufs.len()` frames (at most [`MAX_BURST`], and no
    /// more than `meta` has room for) without blocking, one per buffer;
    /// returns how many, 0 when none is waiting. The filled buffers are
    /// the first ones (`bufs` may be reordered) and `meta[i]` describes the
    /// frame in `bufs[i]`.
    ///
    /// # Errors
    /// Only for failures other than "nothing to read" (e.g. the interface
    /// went away).
    pub fn recv_burst<B: AsMut<[u8]>>(
        &self,
        bufs: &mut [B],
        meta: &mut [RxMeta],
    ) -> io::Result<usize> {
        let n = bufs.len().min(meta.len()).min(MAX_BURST);
        if n == 0 {
            return Ok(0);
        }
        let (mut iov, mut msgs) = empty_burst();
        let mut names = [empty_sockaddr_ll(); MAX_BURST];
        let mut control = [ControlBuf([0; 64]); MAX_BURST];
        for i in 0..n {
            let b = bufs[i].as_mut();
            iov[i] = libc::iovec {
                iov_base: b.as_mut_ptr().cast::<c_void>(),
                iov_len: b.len(),
            };
            let h = &mut msgs[i].msg_hdr;
            h.msg_name = ptr::from_mut(&mut names[i]).cast::<c_void>();
            h.msg_namelen = size_of::<libc::sockaddr_ll>() as socklen_t;
            h.msg_iov = ptr::from_mut(&mut iov[i]);
            h.msg_iovlen = 1;
            h.msg_control = ptr::from_mut(&mut control[i]).cast::<c_void>();
            h.msg_controllen = size_of::<ControlBuf>() as _;
        }
        // SAFETY: for every i < n, msgs[i] points at iov[i], names[i] and
        // control[i] on this frame with their true sizes, and iov[i] at
        // bufs[i], which this call borrows exclusively; the kernel writes
        // only within those lengths and keeps no pointer after returning.
        let rc = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as c_uint,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
            )
        };
        if rc < 0 {
            return quiet(io::Error::last_os_error());
        }
        let got = usize::try_from(rc).unwrap_or(0).min(n);
        let mut kept = 0;
        for i in 0..got {
            // Older kernels ignore PACKET_IGNORE_OUTGOING: skip our own.
            if names[i].sll_pkttype == PACKET_OUTGOING {
                continue;
            }
            let h = &msgs[i].msg_hdr;
            let m = RxMeta {
                len: (msgs[i].msg_len as usize).min(iov[i].iov_len),
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
                vlan: aux_vlan(h),
            };
            if kept != i {
                bufs.swap(kept, i);
            }
            meta[kept] = m;
            kept += 1;
        }
        Ok(kept)
    }

    /// Sends the frames at the front of `frames` (at most [`MAX_BURST`])
    /// without blocking; returns how many the kernel took, 0 when its
    /// queue is full.
    ///
    /// # Errors
    /// If the first frame cannot be sent for another reason (too big for
    /// the interface, interface down); the caller decides whether to drop
    /// it and go on.
    pub fn send_burst<B: AsRef<[u8]>>(&self, frames: &[B]) -> io::Result<usize> {
        let n = frames.len().min(MAX_BURST);
        if n == 0 {
            return Ok(0);
        }
        let (mut iov, mut msgs) = empty_burst();
        for i in 0..n {
            let f = frames[i].as_ref();
            iov[i] = libc::iovec {
                // The kernel only reads from it (sendmmsg).
                iov_base: f.as_ptr().cast_mut().cast::<c_void>(),
                iov_len: f.len(),
            };
            msgs[i].msg_hdr.msg_iov = ptr::from_mut(&mut iov[i]);
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: for every i < n, msgs[i] points at iov[i] and iov[i] at
        // frames[i], all alive and unchanged for the call; no address is
        // given (the socket is bound), and sendmmsg only reads the buffers.
        let rc = unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            return quiet(io::Error::last_os_error());
        }
        Ok(usize::try_from(rc).unwrap_or(0).min(n))
    }

    /// Frames the kernel dropped for this socket (its buffer was full)
    /// since the previous call: the kernel resets the count on each read.
    ///
    /// # Errors
    /// If the kernel refuses the query.
    pub fn take_drops(&self) -> io::Result<u64> {
        // struct tpacket_stats { tp_packets, tp_drops }
        let s: [c_uint; 2] = self.get_opt(libc::SOL_PACKET, libc::PACKET_STATISTICS)?;
        Ok(u64::from(s[1]))
    }

    /// The interface's link state, address and MTU.
    ///
    /// # Errors
    /// If the interface has gone.
    pub fn link(&self) -> io::Result<LinkInfo> {
        let mut req = self.ifreq();
        self.ioctl(libc::SIOCGIFFLAGS, &mut req)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = c_int::from(unsafe { req.ifr_ifru.ifru_flags });
        let mut req = self.ifreq();
        self.ioctl(libc::SIOCGIFHWADDR, &mut req)?;
        // SAFETY: SIOCGIFHWADDR filled the hwaddr member of the union.
        let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *d = *s as u8;
        }
        let mut req = self.ifreq();
        self.ioctl(libc::SIOCGIFMTU, &mut req)?;
        // SAFETY: SIOCGIFMTU filled the mtu member of the union.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu };
        Ok(LinkInfo {
            up: flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0,
            mac,
            mtu: u32::try_from(mtu).unwrap_or(0),
        })
    }

    fn ifreq(&self) -> libc::ifreq {
        // SAFETY: ifreq is a plain C struct (a name and a union of plain
        // members); all zeroes is valid.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        req.ifr_name = self.ifname;
        req
    }

    fn ioctl(&self, request: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
        // SAFETY: `req` is a valid, exclusively borrowed ifreq holding the
        // interface name, which is what these SIOCGIF* requests read and
        // write; the result is checked.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), request as _, ptr::from_mut(req)) }).map(drop)
    }

    fn set_opt<T: Copy>(&self, level: c_int, name: c_int, value: &T) -> io::Result<()> {
        // SAFETY: `value` points at a T of the size passed, alive for the
        // call; setsockopt copies it. T is a plain C type at every call site.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                ptr::from_ref(value).cast::<c_void>(),
                size_of::<T>() as socklen_t,
            )
        })
        .map(drop)
    }

    fn get_opt<T: Copy + Default>(&self, level: c_int, name: c_int) -> io::Result<T> {
        let mut value = T::default();
        let mut len = size_of::<T>() as socklen_t;
        // SAFETY: `value` is a T of `len` bytes, exclusively borrowed for
        // the call; the kernel writes at most `len` bytes and updates it.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                ptr::from_mut(&mut value).cast::<c_void>(),
                &mut len,
            )
        })?;
        if len as usize != size_of::<T>() {
            return Err(io::Error::other(format!(
                "socket option {name}: {len} bytes, expected {}",
                size_of::<T>()
            )));
        }
        Ok(value)
    }
}

/// Empty I/O vectors and message headers for one burst, to be pointed at
/// the caller's buffers.
fn empty_burst() -> ([libc::iovec; MAX_BURST], [libc::mmsghdr; MAX_BURST]) {
    let iov = [libc::iovec {
        iov_base: ptr::null_mut(),
        iov_len: 0,
    }; MAX_BURST];
    // SAFETY: mmsghdr is a plain C struct of pointers and integers, for
    // which all zeroes is a valid (empty) value.
    let msgs: [libc::mmsghdr; MAX_BURST] = unsafe { std::mem::zeroed() };
    (iov, msgs)
}

fn empty_sockaddr_ll() -> libc::sockaddr_ll {
    libc::sockaddr_ll {
        sll_family: 0,
        sll_protocol: 0,
        sll_ifindex: 0,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 0,
        sll_addr: [0; 8],
    }
}

/// "Nothing to do" outcomes of a non-blocking call are not errors.
fn quiet(e: io::Error) -> io::Result<usize> {
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS) => Ok(0),
        _ => Err(e),
    }
}

fn step(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The stripped VLAN tag a received message's `PACKET_AUXDATA` reports.
fn aux_vlan(h: &libc::msghdr) -> Option<(u16, u16)> {
    // SAFETY: `h` is a message header recvmmsg filled; its control pointer
    // and length describe a buffer that is still alive (the caller's
    // stack), and CMSG_FIRSTHDR/CMSG_NXTHDR stay within msg_controllen.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(h) };
    while !c.is_null() {
        // SAFETY: `c` is non-null and, per CMSG_FIRSTHDR/NXTHDR, a whole
        // cmsghdr inside the control buffer.
        let hdr = unsafe { &*c };
        let want = size_of::<libc::cmsghdr>() + size_of::<libc::tpacket_auxdata>();
        if hdr.cmsg_level == libc::SOL_PACKET
            && hdr.cmsg_type == libc::PACKET_AUXDATA
            && hdr.cmsg_len as usize >= want
        {
            // SAFETY: the message's length covers a tpacket_auxdata after
            // its header (checked above); read_unaligned makes no alignment
            // assumption about CMSG_DATA.
            let aux = unsafe {
                libc::CMSG_DATA(c)
                    .cast::<libc::tpacket_auxdata>()
                    .read_unaligned()
            };
            if aux.tp_status & libc::TP_STATUS_VLAN_VALID == 0 {
                return None;
            }
            let tpid = if aux.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                aux.tp_vlan_tpid
            } else {
                TPID_8021Q
            };
            return Some((tpid, aux.tp_vlan_tci));
        }
        // SAFETY: as for CMSG_FIRSTHDR: `h` and its control buffer are
        // alive and `c` is one of its messages.
        c = unsafe { libc::CMSG_NXTHDR(h, c) };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked_before_the_kernel_sees_them() {
        assert!(if_index("").is_err());
        assert!(if_index("a-name-longer-than-15").is_err());
        assert!(if_index("bad\0name").is_err());
        assert!(if_index("lo").is_ok());
        let e = if_index("no-such-if0").unwrap_err();
        assert!(e.to_string().contains("no-such-if0"), "{e}");
    }

    /// Needs CAP_NET_RAW: skipped (passes) without it.
    fn open_lo() -> Option<PacketSocket> {
        match PacketSocket::open("lo", false) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => None,
            Err(e) => panic!("opening a packet socket on lo: {e}"),
        }
    }

    #[test]
    fn loopback_frames_cross_between_two_sockets_but_never_echo() {
        let (Some(a), Some(b)) = (open_lo(), open_lo()) else {
            return;
        };
        let info = a.link().unwrap();
        assert!(info.up);
        assert!(info.mtu >= 1500);
        // A frame with an EtherType nothing on this host handles.
        let mut frame = [0u8; 60];
        frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        frame[14..18].copy_from_slice(b"dpu!");
        assert_eq!(a.send_burst(&[&frame[..], &frame[..]]).unwrap(), 2);
        let mut bufs = vec![vec![0u8; 2048]; 4];
        let mut meta = [RxMeta::default(); 4];
        let mut got = 0;
        for _ in 0..1000 {
            let n = b.recv_burst(&mut bufs[got..], &mut meta[got..]).unwrap();
            got += n;
            if got >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // lo may carry other traffic: look for ours.
        let ours = (0..got)
            .filter(|&i| bufs[i][..meta[i].len] == frame[..])
            .count();
        // Once each: the kernel's outgoing copies are never handed back.
        assert_eq!(ours, 2, "both frames reach the other socket, once");
        // A buffer shorter than the frame is reported as truncated.
        a.send_burst(&[&frame[..]]).unwrap();
        let mut small = [[0u8; 16]];
        let mut m = [RxMeta::default()];
        let mut cut = None;
        for _ in 0..1000 {
            if b.recv_burst(&mut small, &mut m).unwrap() == 1 && small[0][12..14] == [0x88, 0xb5] {
                cut = Some(m[0]);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let cut = cut.expect("the third frame arrives");
        assert!(cut.truncated);
        assert_eq!(cut.len, 16);
        assert!(a.take_drops().is_ok());
    }

    #[test]
    fn fanout_groups_get_kernel_chosen_ids_that_others_join() {
        let (Some(a), Some(b)) = (open_lo(), open_lo()) else {
            return;
        };
        let id = a.join_fanout(None).unwrap();
        assert_eq!(b.join_fanout(Some(id)).unwrap(), id);
        // A second group on the same interface gets another ID.
        let Some(c) = open_lo() else { return };
        assert_ne!(c.join_fanout(None).unwrap(), id);
    }
}

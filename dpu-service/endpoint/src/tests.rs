//! The endpoint driven by a host stack over an in-memory wire
//! ([`crate::testing`]).

use std::time::Duration;

use dpu_nvmeof::spec::admin;
use dpu_rand::Rng;
use smoltcp::socket::tcp;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr,
};

use crate::testing::*;
use crate::EndpointConfig;

const MIB: u64 = 1 << 20;

/// An Ethernet frame carrying an ARP request for `target_ip` from the host.
fn arp_request(target_ip: std::net::Ipv4Addr) -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: EthernetAddress(HOST_MAC),
        source_protocol_addr: HOST_IP,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target_ip,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(HOST_MAC),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EthernetProtocol::Arp,
    };
    // Junk first, so a field the emitters leave out shows.
    let mut b = vec![0xa5; eth.buffer_len() + arp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut b);
    eth.emit(&mut f);
    arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
    b
}

/// Frames the endpoint sends in one poll.
fn poll_frames(p: &mut Pair) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    p.ep.poll(p.now, &mut |f: &[u8]| out.push(f.to_vec()));
    out
}

#[test]
fn arp_is_answered_for_the_endpoint_address_only() {
    let mut p = Pair::new(config(1500), target(MIB));
    p.ep.receive(&arp_request(EP_IP), p.now);
    let out = poll_frames(&mut p);
    assert_eq!(out.len(), 1, "one reply");
    let f = EthernetFrame::new_checked(&out[0][..]).unwrap();
    assert_eq!(f.dst_addr(), EthernetAddress(HOST_MAC));
    assert_eq!(f.src_addr(), EthernetAddress(EP_MAC));
    let arp = ArpRepr::parse(&ArpPacket::new_checked(f.payload()).unwrap()).unwrap();
    assert_eq!(
        arp,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: EthernetAddress(EP_MAC),
            source_protocol_addr: EP_IP,
            target_hardware_addr: EthernetAddress(HOST_MAC),
            target_protocol_addr: HOST_IP,
        }
    );
    // Another station's address, in the same network or not: silence.
    for other in [[10, 1, 0, 6], [10, 1, 0, 5], [192, 168, 0, 250]] {
        p.ep.receive(&arp_request(other.into()), p.now);
        assert!(poll_frames(&mut p).is_empty(), "ARP for {other:?}");
    }
}

/// Identify, a write and a read back, through the endpoint on `mtu`.
fn end_to_end(mtu: usize, chaos: Option<(u64, u64)>) -> Pair {
    end_to_end_on(config(mtu), target(4 * MIB), chaos)
}

/// [`end_to_end`] through an endpoint made with `config` for `target`.
fn end_to_end_on(
    config: EndpointConfig,
    target: dpu_nvmeof::Target,
    chaos: Option<(u64, u64)>,
) -> Pair {
    let mut p = Pair::new(config, target);
    if let Some((drop, reorder)) = chaos {
        p.to_ep = Chaos::new(drop, reorder, 11);
        p.to_host = Chaos::new(drop, reorder, 29);
    }
    let (mut a, cntlid) = NvmeHost::admin(&mut p, 40000);
    let mut sqe = dpu_nvmeof::host::command(admin::IDENTIFY, a.cid());
    sqe.0[40] = 1; // CNS 1: the controller
    let id = a.command(&mut p, sqe, &[], 4096);
    assert_eq!(id.cqe.unwrap().status, 0);
    assert_eq!(id.data.len(), 4096);
    assert_eq!(&id.data[4..7], b"EP1", "serial number");

    let mut io = NvmeHost::io(&mut p, 40001, cntlid);
    let small: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(io.write(&mut p, 8, &small), 0);
    // 128 KiB through R2T and H2CData, many segments each way.
    let big: Vec<u8> = (0..128 * 1024u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(io.write(&mut p, 1024, &big), 0);
    let r = io.read(&mut p, 8, 8);
    assert_eq!(r.cqe.unwrap().status, 0);
    assert!(r.data == small, "4 KiB read back");
    let r = io.read(&mut p, 1024, 256);
    assert_eq!(r.cqe.unwrap().status, 0);
    assert!(r.data == big, "128 KiB read back");
    assert_eq!(p.ep.open_connections(), 2);
    p
}

#[test]
fn nvme_over_tcp_end_to_end() {
    let p = end_to_end(1500, None);
    assert!(p.longest_from_ep <= 1514, "{}", p.longest_from_ep);
    assert!(p.longest_from_ep > 1400, "full-sized segments");
}

#[test]
fn nvme_over_tcp_over_ipv6_with_neighbour_discovery() {
    // The host knows nothing of the endpoint's MAC: it solicits it, the
    // endpoint answers for its address (and resolves the host the same
    // way), then identify, writes and reads go over IPv6 segments.
    let p = end_to_end_on(
        config6(1500),
        target_at(4 * MIB, EP_IP6.into()),
        Some((5, 20)),
    );
    let s = p.ep.stats();
    assert!(s.frames_in > 0 && s.frames_out > 0);
    assert!(p.longest_from_ep <= 1514, "{}", p.longest_from_ep);
    assert!(p.longest_from_ep > 1400, "full-sized segments");
}

#[test]
fn neighbour_solicitations_are_answered_for_the_endpoint_address_only() {
    use smoltcp::wire::{
        EthernetAddress, Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv6Address, Ipv6Packet, Ipv6Repr,
        NdiscRepr, RawHardwareAddress,
    };
    let mut p = Pair::new(config6(1500), target_at(MIB, EP_IP6.into()));
    let solicit = |target: Ipv6Address| -> Vec<u8> {
        let icmp = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
            target_addr: target,
            lladdr: Some(RawHardwareAddress::from_bytes(&HOST_MAC)),
        });
        let o = target.octets();
        let dst = Ipv6Address::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | u16::from(o[13]),
            u16::from_be_bytes([o[14], o[15]]),
        );
        let ip = Ipv6Repr {
            src_addr: HOST_IP6,
            dst_addr: dst,
            next_header: IpProtocol::Icmpv6,
            payload_len: icmp.buffer_len(),
            hop_limit: 255,
        };
        let d = dst.octets();
        let eth = EthernetRepr {
            src_addr: EthernetAddress(HOST_MAC),
            dst_addr: EthernetAddress([0x33, 0x33, d[12], d[13], d[14], d[15]]),
            ethertype: EthernetProtocol::Ipv6,
        };
        let mut f = vec![0u8; eth.buffer_len() + ip.buffer_len() + icmp.buffer_len()];
        let mut e = EthernetFrame::new_unchecked(&mut f);
        eth.emit(&mut e);
        let mut i = Ipv6Packet::new_unchecked(e.payload_mut());
        ip.emit(&mut i);
        let mut c = Icmpv6Packet::new_unchecked(i.payload_mut());
        icmp.emit(
            &HOST_IP6,
            &dst,
            &mut c,
            &smoltcp::phy::ChecksumCapabilities::default(),
        );
        f
    };
    p.ep.receive(&solicit(EP_IP6), p.now);
    let replies = poll_frames(&mut p);
    assert_eq!(replies.len(), 1, "one advertisement");
    let e = EthernetFrame::new_checked(&replies[0][..]).unwrap();
    assert_eq!(e.dst_addr(), EthernetAddress(HOST_MAC));
    assert_eq!(e.src_addr(), EthernetAddress(EP_MAC));
    let i = Ipv6Packet::new_checked(e.payload()).unwrap();
    assert_eq!(i.src_addr(), EP_IP6, "sent from the endpoint's own address");
    assert_eq!(i.dst_addr(), HOST_IP6);
    let c = Icmpv6Packet::new_checked(i.payload()).unwrap();
    let repr = Icmpv6Repr::parse(
        &i.src_addr(),
        &i.dst_addr(),
        &c,
        &smoltcp::phy::ChecksumCapabilities::default(),
    )
    .unwrap();
    let Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
        target_addr,
        lladdr: Some(ll),
        ..
    }) = repr
    else {
        panic!("not an advertisement: {repr:?}");
    };
    assert_eq!(target_addr, EP_IP6);
    assert_eq!(ll.as_bytes(), &EP_MAC[..]);
    for other in [HOST_IP6, Ipv6Address::new(0xfd00, 1, 0, 0, 0, 0, 0, 0x251)] {
        p.ep.receive(&solicit(other), p.now);
        assert!(poll_frames(&mut p).is_empty(), "solicitation for {other}");
    }
}

/// What one read of `blocks` at `slba` costs on the wire.
fn tally_read(p: &mut Pair, io: &mut NvmeHost, slba: u64, blocks: u32) -> (Tally, Tally) {
    let (in0, out0) = (p.tally_to_ep.clone(), p.tally_to_host.clone());
    let r = io.read(p, slba, blocks);
    assert_eq!(r.cqe.unwrap().status, 0);
    assert_eq!(r.data.len(), blocks as usize * 512);
    (p.tally_to_ep.since(&in0), p.tally_to_host.since(&out0))
}

#[test]
fn a_read_costs_the_segments_the_kernel_would_send() {
    let mut p = Pair::new(config(1500), target(4 * MIB));
    let (_a, cntlid) = NvmeHost::admin(&mut p, 40000);
    let mut io = NvmeHost::io(&mut p, 40001, cntlid);
    // 4 KiB at MTU 1500: one command segment in; out, a 4,120-byte
    // C2HData PDU and the 24-byte response in three segments, nothing
    // resent and no ACK of its own from the endpoint (the data carries
    // it).
    let (to_ep, to_host) = tally_read(&mut p, &mut io, 8, 8);
    assert_eq!(to_ep.data, 1, "{to_ep:?}");
    assert_eq!(to_host.data, 3, "{to_host:?}");
    assert_eq!(to_host.payload, 24 + 4096 + 24);
    assert_eq!(to_host.ack_only, 0, "{to_host:?}");
    assert_eq!(to_ep.retransmits + to_host.retransmits, 0);
    // 128 KiB: ceil(131,120 / 1,460) = 90 segments out.
    let (_, to_host) = tally_read(&mut p, &mut io, 1024, 256);
    assert_eq!(to_host.data, 90, "{to_host:?}");
    assert_eq!(to_host.retransmits, 0, "{to_host:?}");

    // A lossy wire: the tally counts the segments sent again.
    p.to_host = Chaos::new(50, 0, 5);
    for i in 0..8 {
        tally_read(&mut p, &mut io, 1024 + i * 256, 256);
    }
    assert!(p.to_host.dropped > 0);
    assert!(p.tally_to_host.retransmits > 0, "{:?}", p.tally_to_host);
}

#[test]
fn discovery_through_the_endpoint_names_its_address() {
    let mut p = Pair::new(config(1500), target(MIB));
    let mut d = NvmeHost::open(&mut p, 40000).unwrap();
    let c = d.connect_to(&mut p, 0, 0xffff, dpu_nvmeof::spec::DISCOVERY_NQN);
    assert_eq!(c.status, 0, "{c:?}");
    let cid = d.cid();
    assert_eq!(
        d.command(&mut p, dpu_nvmeof::host::enable(cid), &[], 0)
            .cqe
            .unwrap()
            .status,
        0
    );
    let mut sqe = dpu_nvmeof::host::command(admin::GET_LOG_PAGE, d.cid());
    // LID 0x70 (discovery), 2048 bytes: NUMDL = 511.
    sqe.0[40..44].copy_from_slice(&(0x70u32 | 511 << 16).to_le_bytes());
    let log = d.command(&mut p, sqe, &[], 2048);
    assert_eq!(log.cqe.unwrap().status, 0);
    let log = log.data;
    assert_eq!(
        u64::from_le_bytes(log[8..16].try_into().unwrap()),
        1,
        "records"
    );
    let e = &log[1024..];
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .trim_end_matches(['\0', ' '])
            .to_string()
    };
    assert_eq!(text(&e[32..64]), "4420");
    assert_eq!(text(&e[256..512]), NQN);
    assert_eq!(text(&e[512..768]), "10.1.0.250");
}

#[test]
fn jumbo_frames_carry_jumbo_segments() {
    let p = end_to_end(9000, None);
    assert!(p.longest_from_ep > 8000, "{}", p.longest_from_ep);
    assert!(p.longest_from_ep <= 9014);
}

#[test]
fn segments_lost_and_in_any_order_still_arrive_whole() {
    let p = end_to_end(1500, Some((30, 150)));
    let (dropped, reordered) = (
        p.to_ep.dropped + p.to_host.dropped,
        p.to_ep.reordered + p.to_host.reordered,
    );
    assert!(dropped >= 5 && reordered >= 20, "{dropped} {reordered}");
}

#[test]
fn a_reset_mid_io_frees_the_connection() {
    let t = target(4 * MIB);
    let mut p = Pair::new(config(1500), t.clone());
    let (_a, cntlid) = NvmeHost::admin(&mut p, 40000);
    let mut io = NvmeHost::io(&mut p, 40001, cntlid);
    let idle = p.ep.buffer_bytes();
    for i in 0..16 {
        io.submit_read(&mut p, i * 256, 256);
    }
    // Some data on its way, not all.
    p.run(STEPS, |p| p.frames_from_ep > 40);
    p.socket(io.handle).abort();
    assert!(p.run(STEPS, |p| p.ep.open_connections() == 1));
    assert_eq!(p.ep.buffer_bytes(), idle - p.ep.config().per_connection());
    // The admin queue and its controller live on; the I/O queue is gone.
    assert_eq!(t.controller_count(), 1);
    // And a new I/O queue works.
    let mut io = NvmeHost::io(&mut p, 40002, cntlid);
    assert_eq!(io.read(&mut p, 0, 8).cqe.unwrap().status, 0);
    p.run(100, |_| false);
    assert_eq!(p.ep.buffer_bytes(), idle);
}

#[test]
fn a_host_that_stops_reading_hits_the_write_timeout() {
    let t = target(8 * MIB);
    let cfg = EndpointConfig {
        write_timeout: Duration::from_secs(1),
        ..config(1500)
    };
    let mut p = Pair::new(cfg, t.clone());
    let (_a, cntlid) = NvmeHost::admin(&mut p, 40000);
    // The I/O queue's socket has a small receive buffer it never reads.
    let handle = p.open(40001, 16 << 10);
    p.run(STEPS, |p| {
        p.socket(handle).state() == tcp::State::Established
    });
    let mut io = NvmeHost::io_on(&mut p, handle, cntlid);
    for i in 0..24 {
        io.submit_read(&mut p, i * 128, 128); // 1.5 MiB in all
    }
    // The host's window closes; the endpoint keeps probing, then gives up.
    let start = p.now;
    assert!(p.run(STEPS, |p| p.ep.stats().write_timeouts == 1));
    let took = p.now - start;
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(
        t.stats()
            .write_timeouts
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(p.run(STEPS, |p| p.ep.open_connections() == 1));
    assert!(p.run(STEPS, |p| !p.socket(handle).is_open()), "reset");
}

#[test]
fn connections_past_the_cap_are_refused_with_a_reset() {
    let cfg = EndpointConfig {
        max_connections: 2,
        backlog: 1,
        ..config(1500)
    };
    let mut p = Pair::new(cfg, target(MIB));
    let a = NvmeHost::open(&mut p, 40000).unwrap();
    let b = NvmeHost::open(&mut p, 40001).unwrap();
    let e = NvmeHost::open(&mut p, 40002).unwrap_err();
    assert_eq!(e, "not connected: CLOSED");
    assert_eq!(p.ep.open_connections(), 2);
    // One leaves: a new one gets its place.
    p.socket(a.handle).abort();
    p.run(1000, |p| p.ep.open_connections() == 1);
    NvmeHost::open(&mut p, 40003).unwrap();
    assert!(p.socket(b.handle).is_active());
}

#[test]
fn connections_past_the_per_address_cap_are_reset() {
    let cfg = EndpointConfig {
        max_connections_per_address: 1,
        ..config(1500)
    };
    let mut p = Pair::new(cfg, target(MIB));
    NvmeHost::open(&mut p, 40000).unwrap();
    assert!(NvmeHost::open(&mut p, 40001).is_err());
    assert_eq!(p.ep.stats().refused_per_address, 1);
    p.run(1000, |p| p.ep.open_connections() == 1);
    assert_eq!(p.ep.open_connections(), 1);
}

#[test]
fn garbage_frames_are_ignored() {
    let mut p = Pair::new(config(1500), target(MIB));
    // A real SYN from the host, captured from its stack.
    let h = p.open(40000, 1 << 16);
    let t = smoltcp::time::Instant::from_micros(0);
    p.dev.rx.push_back(arp_reply_from_endpoint());
    p.host.poll(t, &mut p.dev, &mut p.sockets);
    let syn = p
        .dev
        .tx
        .iter()
        .find(|f| f.len() > 54)
        .expect("the host's SYN")
        .clone();
    p.dev.tx.clear();
    let _ = h;
    let mut bad = Vec::new();
    for n in [0, 1, 13, 14, 20, 33, 34, 40, 53] {
        bad.push(syn[..n].to_vec()); // truncated
    }
    let mut sum = syn.clone();
    let last = sum.len() - 1;
    sum[last] ^= 0xff; // TCP checksum wrong
    bad.push(sum);
    let mut ipsum = syn.clone();
    ipsum[24] ^= 0x01; // IP header checksum wrong
    bad.push(ipsum);
    let mut mac = syn.clone();
    mac[5] ^= 0x10; // another station's MAC
    bad.push(mac);
    let mut ip = syn.clone();
    ip[33] ^= 0x01; // another address (checksums no longer match either)
    bad.push(ip);
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for len in [60usize, 64, 1514, 9000] {
        let mut f = vec![0; len];
        rng.fill(&mut f);
        bad.push(f);
    }
    for f in &bad {
        p.ep.receive(f, p.now);
    }
    assert!(poll_frames(&mut p).is_empty(), "nothing answered");
    assert_eq!(p.ep.open_connections(), 0);
    // The real SYN still opens a connection.
    p.ep.receive(&syn, p.now);
    let out = poll_frames(&mut p);
    assert_eq!(out.len(), 1, "SYN-ACK");
    assert_eq!(p.ep.open_connections(), 1);
}

/// The endpoint's answer to the host's ARP request, as the host would
/// receive it (so the host's stack sends its SYN at once).
fn arp_reply_from_endpoint() -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: EthernetAddress(EP_MAC),
        source_protocol_addr: EP_IP,
        target_hardware_addr: EthernetAddress(HOST_MAC),
        target_protocol_addr: HOST_IP,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(EP_MAC),
        dst_addr: EthernetAddress(HOST_MAC),
        ethertype: EthernetProtocol::Arp,
    };
    let mut b = vec![0; eth.buffer_len() + arp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut b);
    eth.emit(&mut f);
    arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
    b
}

#[test]
fn a_bad_configuration_is_refused() {
    let cfg = EndpointConfig {
        mtu: 100,
        ..config(1500)
    };
    let e = crate::Endpoint::new(cfg, std::time::Instant::now()).unwrap_err();
    assert_eq!(e.to_string(), "mtu: 100 is out of range (576 to 9216)");
    let mut p = Pair::new(config(1500), target(MIB));
    assert!(p.ep.listen(PORT, target(MIB)).is_err());
    assert!(p.ep.listen(0, target(MIB)).is_err());
    assert!(p.ep.unlisten(PORT));
    assert!(!p.ep.unlisten(PORT));
}

#[test]
fn replies_waiting_for_a_poll_are_bounded() {
    let mut p = Pair::new(config(1500), target(MIB));
    let n = crate::device::PENDING_FRAMES + 44;
    for _ in 0..n {
        p.ep.receive(&arp_request(EP_IP), p.now);
    }
    let s = p.ep.stats();
    assert_eq!((s.frames_in, s.frames_dropped), (n as u64, 44));
    assert_eq!(poll_frames(&mut p).len(), crate::device::PENDING_FRAMES);
    // Room again.
    p.ep.receive(&arp_request(EP_IP), p.now);
    assert_eq!(poll_frames(&mut p).len(), 1);
}

/// A host that stops reading for a while (its window closed, the
/// endpoint's output over its budget, the endpoint no longer reading its
/// commands) and then resumes loses nothing.
#[test]
fn a_host_that_pauses_reading_gets_everything_after() {
    let mut p = Pair::new(config(1500), target(16 * MIB));
    let (_a, cntlid) = NvmeHost::admin(&mut p, 40000);
    let handle = p.open(40001, 64 << 10);
    p.run(STEPS, |p| {
        p.socket(handle).state() == tcp::State::Established
    });
    let mut io = NvmeHost::io_on(&mut p, handle, cntlid);
    let pattern: Vec<u8> = (0..512 * 1024u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(io.write(&mut p, 0, &pattern), 0);
    // 12 MiB of reads: three times the connection's output budget.
    let cids: Vec<u16> = (0..24).map(|_| io.submit_read(&mut p, 0, 1024)).collect();
    // Paused for 2 s, well within the write timeout (10 s).
    let start = p.now;
    p.run(STEPS, |p| p.now - start >= Duration::from_secs(2));
    // Commands sent now wait in the endpoint's socket, unread.
    let mut cids = cids;
    cids.extend((0..8).map(|_| io.submit_read(&mut p, 0, 1024)));
    let start = p.now;
    p.run(STEPS, |p| p.now - start >= Duration::from_secs(1));
    assert_eq!(p.ep.stats().write_timeouts, 0);
    assert!(p.socket(handle).is_active());
    let mut data: std::collections::HashMap<u16, Vec<u8>> = Default::default();
    let mut done = 0;
    while done < cids.len() {
        match io.next_pdu(&mut p).expect("a PDU") {
            Owned::Data {
                cccid,
                datao,
                data: d,
                success,
            } => {
                let buf = data.entry(cccid).or_default();
                assert_eq!(datao as usize, buf.len());
                buf.extend(d);
                if success {
                    done += 1;
                }
            }
            Owned::Resp(c) => {
                assert_eq!(c.status, 0);
                done += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    for cid in cids {
        assert!(data[&cid] == pattern, "read {cid}");
    }
}

/// The switch's workers own endpoints: they must move between threads.
#[test]
fn an_endpoint_can_move_to_a_worker_thread() {
    fn send<T: Send + 'static>(_: &T) {}
    let ep = crate::Endpoint::new(config(1500), std::time::Instant::now()).unwrap();
    send(&ep);
    let h = std::thread::spawn(move || ep.open_connections());
    assert_eq!(h.join().unwrap(), 0);
}

/// A SYN to the endpoint's port from `src` (any address, as a forged one
/// would be), port `sport`.
fn forged_syn(src: std::net::IpAddr, sport: u16) -> Vec<u8> {
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        IpAddress, IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, TcpControl, TcpPacket,
        TcpRepr, TcpSeqNumber,
    };
    let tcp = TcpRepr {
        src_port: sport,
        dst_port: PORT,
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(i32::from(sport) * 7919),
        ack_number: None,
        window_len: 64240,
        window_scale: Some(7),
        max_seg_size: Some(1460),
        sack_permitted: false,
        sack_ranges: [None, None, None],
        timestamp: None,
        payload: &[],
    };
    let (ethertype, ip_len, dst) = match src {
        std::net::IpAddr::V4(_) => (EthernetProtocol::Ipv4, 20, IpAddress::Ipv4(EP_IP)),
        std::net::IpAddr::V6(_) => (EthernetProtocol::Ipv6, 40, IpAddress::Ipv6(EP_IP6)),
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(HOST_MAC),
        dst_addr: EthernetAddress(EP_MAC),
        ethertype,
    };
    let mut b = vec![0u8; eth.buffer_len() + ip_len + tcp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut b);
    eth.emit(&mut f);
    let caps = ChecksumCapabilities::default();
    let src = IpAddress::from(src);
    let payload = match (src, dst) {
        (IpAddress::Ipv4(s), IpAddress::Ipv4(d)) => {
            let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
            let ip = Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Tcp,
                payload_len: tcp.buffer_len(),
                hop_limit: 64,
            };
            ip.emit(&mut p, &caps);
            p.into_inner()
        }
        (IpAddress::Ipv6(s), IpAddress::Ipv6(d)) => {
            let mut p = Ipv6Packet::new_unchecked(f.payload_mut());
            let ip = Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::Tcp,
                payload_len: tcp.buffer_len(),
                hop_limit: 64,
            };
            ip.emit(&mut p);
            p.into_inner()
        }
        _ => unreachable!("one family"),
    };
    tcp.emit(
        &mut TcpPacket::new_unchecked(&mut payload[ip_len..]),
        &src,
        &dst,
        &caps,
    );
    b
}

/// A forged source address, number `n`, in the endpoint's family.
fn forged_source(v6: bool, n: u32) -> std::net::IpAddr {
    if v6 {
        std::net::Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, (n >> 16) as u16, n as u16).into()
    } else {
        std::net::Ipv4Addr::new(10, 1, (n >> 8) as u8 % 200 + 1, n as u8).into()
    }
}

/// A flood of SYNs from forged addresses of the endpoint's family (`v6`)
/// holds few sockets, and a real host still connects.
fn syn_flood(v6: bool) {
    let cfg = EndpointConfig {
        max_handshakes: 8,
        ..if v6 { config6(1500) } else { config(1500) }
    };
    let max = cfg.max_connections;
    let target = if v6 {
        target_at(MIB, EP_IP6.into())
    } else {
        target(MIB)
    };
    let mut p = Pair::new(cfg, target);
    // Ten times the connection cap of SYNs from forged addresses, a few
    // per poll, none ever completed.
    let mut n: u32 = 0;
    for _ in 0..(max * 10 / 4) {
        for _ in 0..4 {
            n += 1;
            let src = forged_source(v6, n);
            p.ep.receive(&forged_syn(src, 1024 + (n % 60000) as u16), p.now);
        }
        let _ = poll_frames(&mut p);
        assert!(
            p.ep.open_connections() <= 8 + 2,
            "{} sockets held",
            p.ep.open_connections()
        );
        p.now += Duration::from_micros(50);
    }
    // Every SYN found a listening socket (none was answered with a
    // reset), and all but the newest few were dropped.
    let st = p.ep.stats();
    assert_eq!(st.connections, u64::from(n), "{st:?}");
    assert!(st.handshakes_reset >= st.connections - 8, "{st:?}");
    // Between two forged SYNs a real host completes its handshake and
    // its NVMe/TCP work.
    p.ep.receive(&forged_syn(forged_source(v6, 1 << 20), 9), p.now);
    let (mut admin, _) = NvmeHost::admin(&mut p, 40000);
    let mut sqe = dpu_nvmeof::host::command(admin::IDENTIFY, admin.cid());
    sqe.0[40] = 1; // CNS 1: the controller
    let id = admin.command(&mut p, sqe, &[], 4096);
    assert_eq!(id.cqe.unwrap().status, 0);
    // Handshakes left pending go after the SYN timeout.
    for _ in 0..4 {
        n += 1;
        p.ep.receive(&forged_syn(forged_source(v6, n), 7), p.now);
    }
    let before = p.ep.stats().handshakes_reset;
    p.run(100_000, |p| p.ep.open_connections() == 1);
    assert_eq!(p.ep.open_connections(), 1, "only the real host's is left");
    assert!(p.ep.stats().handshakes_reset >= before + 4);
    assert!(p.socket(admin.handle).is_active());
}

#[test]
fn a_syn_flood_holds_few_sockets_and_a_real_host_still_connects() {
    syn_flood(false);
}

#[test]
fn an_ipv6_syn_flood_holds_few_sockets_and_a_real_host_still_connects() {
    syn_flood(true);
}

#[test]
fn endpoints_sharing_a_pool_keep_their_reserves() {
    use crate::endpoint::RESERVED_CONNECTIONS;
    use crate::{BufferPool, Endpoint};
    let cfg = EndpointConfig {
        rx_buffer: 16 << 10,
        tx_buffer: 16 << 10,
        backlog: 1,
        ..config(1500)
    };
    let per = cfg.per_connection();
    let reserve = (1 + RESERVED_CONNECTIONS) * per;
    // Two endpoints' reserves and two sockets more to share.
    let pool = BufferPool::new(2 * reserve + 2 * per);
    let pooled = |p: &mut Pair| {
        let mut ep = Endpoint::with_pool(cfg.clone(), p.now, &pool).unwrap();
        ep.listen(PORT, target(MIB)).unwrap();
        p.ep = ep;
    };
    let mut a = Pair::new(cfg.clone(), target(MIB));
    pooled(&mut a);
    let mut b = Pair::new(cfg.clone(), target(MIB));
    pooled(&mut b);
    b.step();
    // a takes its reserve and all the shared part: five sockets, each
    // a connection in the end (the last listening one takes a SYN and no
    // other can be armed).
    let held: Vec<NvmeHost> = (0..5)
        .map(|i| NvmeHost::open(&mut a, 40000 + i).unwrap())
        .collect();
    assert!(NvmeHost::open(&mut a, 40010).is_err());
    assert!(a.ep.stats().refused_no_room >= 1);
    assert_eq!(pool.shared_used(), 2 * per);
    // b still has its own: three connections.
    for i in 0..3 {
        NvmeHost::open(&mut b, 40000 + i).unwrap();
    }
    assert!(NvmeHost::open(&mut b, 40005).is_err());
    // a's hosts go: what they held comes back, and b may take it.
    for h in &held {
        a.socket(h.handle).abort();
    }
    assert!(a.run(1000, |p| p.ep.open_connections() == 0));
    a.step();
    assert!(pool.shared_used() < 2 * per);
    NvmeHost::open(&mut b, 40006).unwrap();
    drop((a, b));
    assert_eq!((pool.reserved(), pool.shared_used()), (0, 0));
}

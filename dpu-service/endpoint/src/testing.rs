//! A two-sided harness for tests and benchmarks: an [`Endpoint`] and a
//! host (a second smoltcp interface with client sockets, speaking NVMe/TCP
//! through the crate `dpu-nvmeof`'s own host-side codec) joined by an
//! in-memory wire that may drop and reorder frames, on a simulated clock.
//! Nothing but the endpoint's public API is used, so a benchmark includes
//! this file as it is.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use dpu_endpoint::{Endpoint, EndpointConfig};
use dpu_nvmeof::pdu::{self, ControllerPdu, Digests, Limits};
use dpu_nvmeof::spec::{nvm, sgl, Cqe, Sqe, Status};
use dpu_nvmeof::{host, BackendSpec, NamespaceConfig, SubsystemConfig, Target, TargetConfig};
use dpu_rand::Rng;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, HardwareAddress, IpAddress, IpCidr,
    IpProtocol, Ipv4Packet, TcpPacket, TcpSeqNumber,
};

/// The endpoint's MAC.
pub const EP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0xee, 0x01];
/// The endpoint's address.
pub const EP_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 250);
/// The endpoint's address in the IPv6 tests.
pub const EP_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 0x250);
/// The host's address in the IPv6 tests.
pub const HOST_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 5);
/// The host's MAC.
pub const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x05, 0x01];
/// The host's address.
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 5);
/// The NVMe/TCP port.
pub const PORT: u16 = 4420;
/// The subsystem.
pub const NQN: &str = "nqn.2024-01.io.example:ep";
/// The host's NQN.
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0000-ep-host";

/// A target with one subsystem exported on the endpoint's port, one RAM
/// namespace of `size` bytes in 512-byte blocks.
pub fn target(size: u64) -> Target {
    target_at(size, EP_IP.into())
}

/// [`target`] with its listener on `address`.
pub fn target_at(size: u64, address: IpAddr) -> Target {
    let t = Target::new();
    let errors = t.apply(&TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            serial: "EP1".into(),
            model: "endpoint".into(),
            allow_any_host: true,
            allowed_hosts: BTreeSet::new(),
            max_namespaces: 4,
            namespaces: vec![NamespaceConfig {
                eui64: None,
                nsid: 1,
                block_size: 512,
                uuid: [1; 16],
                nguid: [2; 16],
                backend: BackendSpec::Ram { size },
                qos: Default::default(),
            }],
            listeners: vec![(address, PORT).into()],
            host_qos: Default::default(),
        }],
        discovery: None,
    });
    assert!(errors.is_empty(), "{errors:?}");
    t
}

/// The endpoint's configuration with IP MTU `mtu`.
pub fn config(mtu: usize) -> EndpointConfig {
    EndpointConfig {
        mtu,
        ..EndpointConfig::new(EP_MAC, EP_IP, 24)
    }
}

/// The IPv6 endpoint's configuration ([`EP_IP6`], every host on-link)
/// with IP MTU `mtu`.
pub fn config6(mtu: usize) -> EndpointConfig {
    EndpointConfig {
        mtu,
        ..EndpointConfig::new(EP_MAC, EP_IP6, 0)
    }
}

/// The host's device: frames in owned buffers.
#[derive(Debug, Default)]
pub struct QueueDevice {
    /// Frames to the host.
    pub rx: VecDeque<Vec<u8>>,
    /// Frames from the host.
    pub tx: Vec<Vec<u8>>,
    /// Frame MTU.
    pub mtu: usize,
}

/// Lends a received frame.
pub struct Rx(Vec<u8>);
/// Sends into the device's queue.
pub struct Tx<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut b = vec![0; len];
        let r = f(&mut b);
        self.0.push(b);
        r
    }
}

impl Device for QueueDevice {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;
    fn receive(&mut self, _: SmolInstant) -> Option<(Rx, Tx<'_>)> {
        let f = self.rx.pop_front()?;
        Some((Rx(f), Tx(&mut self.tx)))
    }
    fn transmit(&mut self, _: SmolInstant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.tx))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = self.mtu;
        c
    }
}

/// Loss and reordering on one direction of the wire, from a seeded
/// generator: the same seed gives the same run.
#[derive(Debug, Clone)]
pub struct Chaos {
    /// Frames dropped per thousand.
    pub drop_per_mille: u64,
    /// Frames held back behind the next one, per thousand.
    pub reorder_per_mille: u64,
    rng: Rng,
    held: Option<Vec<u8>>,
    /// Frames dropped so far.
    pub dropped: u64,
    /// Frames reordered so far.
    pub reordered: u64,
}

impl Chaos {
    /// A perfect wire.
    pub fn none() -> Self {
        Self::new(0, 0, 1)
    }

    /// A wire dropping and reordering as said, seeded with `seed`.
    pub fn new(drop_per_mille: u64, reorder_per_mille: u64, seed: u64) -> Self {
        Self {
            drop_per_mille,
            reorder_per_mille,
            rng: Rng::new(seed),
            held: None,
            dropped: 0,
            reordered: 0,
        }
    }

    /// Passes `frame` on to `out`, or not, or later.
    pub fn pass(&mut self, frame: Vec<u8>, out: &mut VecDeque<Vec<u8>>) {
        if self.rng.chance(self.drop_per_mille, 1000) {
            self.dropped += 1;
            return;
        }
        if self.held.is_none() && self.rng.chance(self.reorder_per_mille, 1000) {
            self.reordered += 1;
            self.held = Some(frame);
            return;
        }
        out.push_back(frame);
        if let Some(h) = self.held.take() {
            out.push_back(h);
        }
    }

    /// Releases a frame held back (the wire went quiet).
    pub fn flush(&mut self, out: &mut VecDeque<Vec<u8>>) {
        if let Some(h) = self.held.take() {
            out.push_back(h);
        }
    }
}

/// TCP-level events counted on one direction of the wire: what a
/// structural problem (a segment per ACK, a retransmission storm, a
/// window that stalls the sender) shows as, whatever the machine's noise.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Frames.
    pub frames: u64,
    /// TCP segments.
    pub segments: u64,
    /// Segments carrying payload.
    pub data: u64,
    /// Segments with neither payload nor SYN, FIN or RST: pure ACKs and
    /// window updates.
    pub ack_only: u64,
    /// Data segments that start below the highest sequence number already
    /// sent on their connection: retransmissions.
    pub retransmits: u64,
    /// TCP payload bytes (retransmissions included).
    pub payload: u64,
    /// Per connection (local port, remote port): the highest sequence
    /// number sent.
    high: HashMap<(u16, u16), TcpSeqNumber>,
}

impl Tally {
    /// Counts `frame`.
    pub fn count(&mut self, frame: &[u8]) {
        self.frames += 1;
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return;
        };
        if eth.ethertype() != EthernetProtocol::Ipv4 {
            return;
        }
        let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
            return;
        };
        if ip.next_header() != IpProtocol::Tcp {
            return;
        }
        let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else {
            return;
        };
        self.segments += 1;
        let len = tcp.payload().len();
        if len == 0 {
            if !(tcp.syn() || tcp.fin() || tcp.rst()) {
                self.ack_only += 1;
            }
            return;
        }
        self.data += 1;
        self.payload += len as u64;
        let key = (tcp.src_port(), tcp.dst_port());
        let start = tcp.seq_number();
        let end = start + len;
        match self.high.get_mut(&key) {
            Some(h) => {
                if start < *h {
                    self.retransmits += 1;
                }
                if end > *h {
                    *h = end;
                }
            }
            None => {
                self.high.insert(key, end);
            }
        }
    }

    /// The counts since `before` (the same direction, earlier).
    pub fn since(&self, before: &Tally) -> Tally {
        Tally {
            frames: self.frames - before.frames,
            segments: self.segments - before.segments,
            data: self.data - before.data,
            ack_only: self.ack_only - before.ack_only,
            retransmits: self.retransmits - before.retransmits,
            payload: self.payload - before.payload,
            high: HashMap::new(),
        }
    }
}

/// The endpoint, the host's stack and the wire between them.
pub struct Pair {
    /// The endpoint under test.
    pub ep: Endpoint,
    /// The host's interface.
    pub host: Interface,
    /// The host's device.
    pub dev: QueueDevice,
    /// The host's sockets.
    pub sockets: SocketSet<'static>,
    /// The simulated clock.
    pub now: Instant,
    epoch: Instant,
    /// Host to endpoint.
    pub to_ep: Chaos,
    /// Endpoint to host.
    pub to_host: Chaos,
    /// Frames the endpoint sent.
    pub frames_from_ep: u64,
    /// The longest frame the endpoint sent.
    pub longest_from_ep: usize,
    /// Time spent in the endpoint's `receive` and `poll` (the host's
    /// stack and the wire left out).
    pub ep_busy: Duration,
    /// Frames from the host to the endpoint, as they left the host.
    pub tally_to_ep: Tally,
    /// Frames from the endpoint to the host, as they left the endpoint.
    pub tally_to_host: Tally,
    /// Calls of `Endpoint::poll`.
    pub ep_polls: u64,
    /// Rounds in which no frame moved and the clock went to the next
    /// timer (of the host or the endpoint): waits a real peer would
    /// spend idle.
    pub timer_waits: u64,
    /// Simulated time spent in those waits beyond a round's 10 µs.
    pub timer_wait_time: Duration,
    wire: VecDeque<Vec<u8>>,
    out: Vec<Vec<u8>>,
    ep_ip: IpAddress,
}

impl Pair {
    /// An endpoint made with `config`, listening on [`PORT`] for `target`,
    /// and a host on the same network and MTU: [`HOST_IP`], or
    /// [`HOST_IP6`] beside an IPv6 endpoint.
    pub fn new(config: EndpointConfig, target: Target) -> Self {
        let now = Instant::now();
        let mtu = config.mtu;
        let ep_ip = IpAddress::from(config.address);
        let host_ip = match config.address {
            IpAddr::V4(_) => IpCidr::new(IpAddress::Ipv4(HOST_IP), 24),
            IpAddr::V6(_) => IpCidr::new(IpAddress::Ipv6(HOST_IP6), 64),
        };
        let mut ep = Endpoint::new(config, now).expect("a valid endpoint");
        ep.listen(PORT, target).expect("the port is free");
        let mut dev = QueueDevice {
            mtu: mtu + 14,
            ..QueueDevice::default()
        };
        let mut c = Config::new(HardwareAddress::Ethernet(EthernetAddress(HOST_MAC)));
        c.random_seed = 7;
        let mut host = Interface::new(c, &mut dev, SmolInstant::ZERO);
        host.update_ip_addrs(|a| {
            a.push(host_ip).unwrap();
        });
        Self {
            ep,
            host,
            dev,
            sockets: SocketSet::new(Vec::new()),
            now,
            epoch: now,
            to_ep: Chaos::none(),
            to_host: Chaos::none(),
            frames_from_ep: 0,
            longest_from_ep: 0,
            ep_busy: Duration::ZERO,
            tally_to_ep: Tally::default(),
            tally_to_host: Tally::default(),
            ep_polls: 0,
            timer_waits: 0,
            timer_wait_time: Duration::ZERO,
            wire: VecDeque::new(),
            out: Vec::new(),
            ep_ip,
        }
    }

    fn smol(&self) -> SmolInstant {
        SmolInstant::from_micros(self.now.duration_since(self.epoch).as_micros() as i64)
    }

    /// One round: the host's stack, its frames to the endpoint, the
    /// endpoint's poll, its frames to the host. Returns whether any frame
    /// moved.
    pub fn step(&mut self) -> bool {
        let t = self.smol();
        self.host.poll(t, &mut self.dev, &mut self.sockets);
        let mut moved = !self.dev.tx.is_empty();
        for f in std::mem::take(&mut self.dev.tx) {
            self.tally_to_ep.count(&f);
            self.to_ep.pass(f, &mut self.wire);
        }
        if !moved {
            self.to_ep.flush(&mut self.wire);
        }
        let t0 = Instant::now();
        while let Some(f) = self.wire.pop_front() {
            self.ep.receive(&f, self.now);
        }
        let out = &mut self.out;
        self.ep.poll(self.now, &mut |f: &[u8]| out.push(f.to_vec()));
        self.ep_busy += t0.elapsed();
        self.ep_polls += 1;
        moved |= !self.out.is_empty();
        for f in std::mem::take(&mut self.out) {
            self.tally_to_host.count(&f);
            self.frames_from_ep += 1;
            self.longest_from_ep = self.longest_from_ep.max(f.len());
            self.to_host.pass(f, &mut self.dev.rx);
        }
        if !moved {
            self.to_host.flush(&mut self.dev.rx);
        }
        {
            let step = if moved {
                Duration::from_micros(10)
            } else {
                let t = self.smol();
                let host_at = self
                    .host
                    .poll_at(t, &self.sockets)
                    .map(|a| self.epoch + Duration::from_micros(a.total_micros().max(0) as u64));
                let ep_at = self.ep.poll_at(self.now);
                let at = host_at.map_or(ep_at, |h| h.min(ep_at));
                let step = at
                    .saturating_duration_since(self.now)
                    .clamp(Duration::from_micros(10), Duration::from_millis(50));
                if step > Duration::from_micros(10) {
                    self.timer_waits += 1;
                    self.timer_wait_time += step - Duration::from_micros(10);
                }
                step
            };
            self.now += step;
        }
        moved
    }

    /// Steps until `done` holds (true) or `steps` rounds have passed
    /// (false).
    pub fn run(&mut self, steps: usize, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        for _ in 0..steps {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// A host socket from `local_port` to the endpoint, with `buffer`
    /// bytes each way, connecting (not yet connected).
    pub fn open(&mut self, local_port: u16, buffer: usize) -> SocketHandle {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buffer]),
            tcp::SocketBuffer::new(vec![0; buffer]),
        );
        s.set_nagle_enabled(false);
        s.set_ack_delay(None);
        s.connect(self.host.context(), (self.ep_ip, PORT), local_port)
            .expect("connect");
        self.sockets.add(s)
    }

    /// The host socket `h`.
    pub fn socket(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }
}

/// A PDU from the controller, owned.
#[derive(Debug)]
pub enum Owned {
    /// ICResp.
    IcResp,
    /// A completion.
    Resp(Cqe),
    /// Read data.
    Data {
        /// The command.
        cccid: u16,
        /// Its offset.
        datao: u32,
        /// The bytes.
        data: Vec<u8>,
        /// Completes the command.
        success: bool,
    },
    /// Ready to transfer.
    R2T {
        /// The command.
        cccid: u16,
        /// Transfer tag.
        ttag: u16,
        /// Offset.
        r2to: u32,
        /// Length.
        r2tl: u32,
    },
    /// The controller ended the connection.
    Term,
}

/// What came back for a command.
#[derive(Debug, Default)]
pub struct Reply {
    /// Its completion.
    pub cqe: Option<Cqe>,
    /// Its read data.
    pub data: Vec<u8>,
}

/// An NVMe/TCP host on one socket of a [`Pair`].
#[derive(Debug)]
pub struct NvmeHost {
    /// The socket.
    pub handle: SocketHandle,
    inbox: Vec<u8>,
    next_cid: u16,
}

/// Most rounds a single exchange may take.
pub const STEPS: usize = 200_000;

impl NvmeHost {
    /// Connects from `local_port` and exchanges ICReq/ICResp.
    pub fn open(p: &mut Pair, local_port: u16) -> Result<Self, String> {
        let handle = p.open(local_port, 1 << 20);
        Self::open_on(p, handle)
    }

    /// Waits for socket `handle` to connect, then exchanges ICReq/ICResp.
    pub fn open_on(p: &mut Pair, handle: SocketHandle) -> Result<Self, String> {
        let ok = p.run(STEPS, |p| {
            !matches!(
                p.socket(handle).state(),
                tcp::State::SynSent | tcp::State::SynReceived
            )
        });
        let state = p.socket(handle).state();
        if !ok || state != tcp::State::Established {
            return Err(format!("not connected: {state}"));
        }
        let mut h = Self {
            handle,
            inbox: Vec::new(),
            next_cid: 1,
        };
        let mut b = Vec::new();
        host::ic_req(&mut b, Digests::default());
        h.send(p, &b);
        match h.next_pdu(p) {
            Some(Owned::IcResp) => Ok(h),
            other => Err(format!("expected ICResp, got {other:?}")),
        }
    }

    /// A fresh command identifier.
    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1);
        self.next_cid
    }

    /// Writes `bytes` into the socket, stepping while it is full.
    pub fn send(&mut self, p: &mut Pair, bytes: &[u8]) {
        let mut off = 0;
        let h = self.handle;
        p.run(STEPS, |p| {
            if let Ok(n) = p.socket(h).send_slice(&bytes[off..]) {
                off += n;
            }
            off == bytes.len() || !p.socket(h).may_send()
        });
    }

    /// A PDU already here, if any (reads the socket).
    pub fn try_pdu(&mut self, p: &mut Pair) -> Option<Owned> {
        let s = p.socket(self.handle);
        while s.can_recv() {
            let inbox = &mut self.inbox;
            let _ = s.recv(|b| {
                inbox.extend_from_slice(b);
                (b.len(), ())
            });
        }
        let limits = Limits {
            digests: Digests::default(),
            max_data: 1 << 20,
        };
        let (pdu, n) = pdu::decode_controller(&self.inbox, &limits).ok()??;
        let owned = match pdu {
            ControllerPdu::IcResp(_) => Owned::IcResp,
            ControllerPdu::CapsuleResp { cqe } => Owned::Resp(cqe),
            ControllerPdu::C2HData {
                cccid,
                datao,
                data,
                success,
                ..
            } => Owned::Data {
                cccid,
                datao,
                data: data.to_vec(),
                success,
            },
            ControllerPdu::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            } => Owned::R2T {
                cccid,
                ttag,
                r2to,
                r2tl,
            },
            ControllerPdu::TermReq { .. } => Owned::Term,
        };
        self.inbox.drain(..n);
        Some(owned)
    }

    /// The next PDU, stepping until it arrives (None: it did not, or the
    /// connection ended).
    pub fn next_pdu(&mut self, p: &mut Pair) -> Option<Owned> {
        let mut got = None;
        let h = self.handle;
        p.run(STEPS, |p| {
            got = self.try_pdu(p);
            got.is_some() || !p.socket(h).is_active()
        });
        got
    }

    /// Sends `sqe` with `data` (in the capsule up to 8 KiB, else through
    /// R2T) and collects the reply.
    pub fn command(&mut self, p: &mut Pair, mut sqe: Sqe, data: &[u8], read_len: u32) -> Reply {
        let cid = sqe.cid();
        let mut b = Vec::new();
        if !data.is_empty() && data.len() <= 8192 {
            sqe.0[39] = sgl::IN_CAPSULE;
            sqe.0[32..36].copy_from_slice(&(data.len() as u32).to_le_bytes());
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, data);
        } else {
            let len = if data.is_empty() {
                read_len
            } else {
                data.len() as u32
            };
            sqe.0[32..36].copy_from_slice(&len.to_le_bytes());
            pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &[]);
        }
        self.send(p, &b);
        let mut reply = Reply::default();
        while let Some(pdu) = self.next_pdu(p) {
            match pdu {
                Owned::R2T {
                    cccid,
                    ttag,
                    r2to,
                    r2tl,
                } => {
                    assert_eq!(cccid, cid);
                    let mut b = Vec::new();
                    let chunk = &data[r2to as usize..(r2to + r2tl) as usize];
                    pdu::encode_h2c_data(&mut b, Digests::default(), cid, ttag, r2to, chunk, true);
                    self.send(p, &b);
                }
                Owned::Data {
                    cccid,
                    datao,
                    data,
                    success,
                } => {
                    assert_eq!((cccid, datao as usize), (cid, reply.data.len()));
                    reply.data.extend(data);
                    if success {
                        reply.cqe = Some(Cqe::new(cid, Status::SUCCESS));
                        return reply;
                    }
                }
                Owned::Resp(c) => {
                    assert_eq!(c.cid, cid);
                    reply.cqe = Some(c);
                    return reply;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        reply
    }

    /// Fabrics Connect of queue `qid` (128 entries) to controller `cntlid`.
    pub fn connect(&mut self, p: &mut Pair, qid: u16, cntlid: u16) -> Cqe {
        self.connect_to(p, qid, cntlid, NQN)
    }

    /// Fabrics Connect of queue `qid` (128 entries) to controller `cntlid`
    /// of subsystem `subnqn`.
    pub fn connect_to(&mut self, p: &mut Pair, qid: u16, cntlid: u16, subnqn: &str) -> Cqe {
        let cid = self.cid();
        let sqe = host::connect(cid, qid, 128, 0);
        let data = host::connect_data([7; 16], cntlid, subnqn, HOSTNQN);
        self.command(p, sqe, &data, 0)
            .cqe
            .expect("connect completes")
    }

    /// An admin queue, connected and enabled; and its controller's ID.
    pub fn admin(p: &mut Pair, local_port: u16) -> (Self, u16) {
        let mut h = Self::open(p, local_port).expect("connected");
        let c = h.connect(p, 0, 0xffff);
        assert_eq!(c.status, 0, "connect: {c:?}");
        let cid = h.cid();
        assert_eq!(
            h.command(p, host::enable(cid), &[], 0).cqe.unwrap().status,
            0
        );
        (h, c.dw0 as u16)
    }

    /// An I/O queue of controller `cntlid`.
    pub fn io(p: &mut Pair, local_port: u16, cntlid: u16) -> Self {
        let mut h = Self::open(p, local_port).expect("connected");
        let c = h.connect(p, 1, cntlid);
        assert_eq!(c.status, 0, "I/O connect: {c:?}");
        h
    }

    /// An I/O queue of controller `cntlid` on socket `handle`.
    pub fn io_on(p: &mut Pair, handle: SocketHandle, cntlid: u16) -> Self {
        let mut h = Self::open_on(p, handle).expect("connected");
        let c = h.connect(p, 1, cntlid);
        assert_eq!(c.status, 0, "I/O connect: {c:?}");
        h
    }

    /// A Read or Write of `blocks` 512-byte blocks at `slba`.
    pub fn rw_sqe(&mut self, opcode: u8, slba: u64, blocks: u32) -> Sqe {
        let mut sqe = host::command(opcode, self.cid());
        sqe.0[4..8].copy_from_slice(&1u32.to_le_bytes());
        sqe.0[40..48].copy_from_slice(&slba.to_le_bytes());
        sqe.0[48..50].copy_from_slice(&((blocks - 1) as u16).to_le_bytes());
        sqe.0[32..36].copy_from_slice(&(blocks * 512).to_le_bytes());
        sqe
    }

    /// Writes `data` at `slba`; its status.
    pub fn write(&mut self, p: &mut Pair, slba: u64, data: &[u8]) -> u16 {
        let sqe = self.rw_sqe(nvm::WRITE, slba, (data.len() / 512) as u32);
        self.command(p, sqe, data, 0)
            .cqe
            .map_or(u16::MAX, |c| c.status)
    }

    /// Reads `blocks` at `slba`.
    pub fn read(&mut self, p: &mut Pair, slba: u64, blocks: u32) -> Reply {
        let sqe = self.rw_sqe(nvm::READ, slba, blocks);
        self.command(p, sqe, &[], blocks * 512)
    }

    /// Sends a Read without waiting for it; its command identifier.
    pub fn submit_read(&mut self, p: &mut Pair, slba: u64, blocks: u32) -> u16 {
        let sqe = self.rw_sqe(nvm::READ, slba, blocks);
        let mut b = Vec::new();
        pdu::encode_capsule_cmd(&mut b, Digests::default(), &sqe, &[]);
        self.send(p, &b);
        sqe.cid()
    }
}

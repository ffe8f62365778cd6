//! `--memif SOCKET`: nvmf-perf's own TCP/IP stack (smoltcp) on a DPDK
//! `net_memif` port, so that a target behind a DPDK port (the service's
//! switch and a tenant's storage endpoint) is measured without a kernel
//! network stack on either side. The port is a memif client of the
//! service's memif server port; this process is a host of the tenant
//! with the address `--ip` (default 10.79.0.5/24) and MAC `--mac`.
//!
//! One thread drives the stack: a read that finds nothing buffered polls
//! it (the port's receive burst, smoltcp's timers and sockets, the
//! transmit burst), so a blocking read busy-polls the port, and what
//! writes queued leaves at that poll.

use std::cell::RefCell;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{
    Eal, EalConfig, Mbuf, MbufBatch, Mempool, Port, PortConfig, RxQueue, ThreadRegistration,
    TxQueue,
};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

use dpu_nvmeof::host::Wire;

use super::Error;

/// Socket buffers of one connection each way: a QD 16 of 128 KiB reads
/// in flight twice over.
const SOCKET_BUFFER: usize = 4 << 20;

/// Frames one receive burst takes.
const BURST: usize = 32;

/// How long the port may take to connect to the memif server, and a
/// TCP connection to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What `--memif`, `--ip` and `--mac` asked for.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The memif server's socket.
    pub socket: String,
    /// This host's address and prefix length.
    pub ip: (Ipv4Addr, u8),
    /// This host's MAC.
    pub mac: [u8; 6],
}

impl Settings {
    /// The defaults beside the server's `socket`.
    pub fn new(socket: String) -> Self {
        Self {
            socket,
            ip: (Ipv4Addr::new(10, 79, 0, 5), 24),
            mac: [0x02, 0, 0, 0, 0x79, 0x05],
        }
    }

    /// Parses `--ip A.B.C.D/LEN`.
    pub fn set_ip(&mut self, s: &str) -> Result<(), Error> {
        let (a, l) = s.split_once('/').ok_or("--ip takes ADDRESS/LENGTH")?;
        let len: u8 = l.parse()?;
        if len > 32 {
            return Err("--ip: a prefix length of at most 32".into());
        }
        self.ip = (a.parse()?, len);
        Ok(())
    }

    /// Parses `--mac 02:00:00:00:79:05`.
    pub fn set_mac(&mut self, s: &str) -> Result<(), Error> {
        let parts: Vec<u8> = s
            .split(':')
            .map(|p| u8::from_str_radix(p, 16))
            .collect::<Result<_, _>>()?;
        self.mac = parts.try_into().map_err(|_| "--mac takes six hex bytes")?;
        Ok(())
    }
}

thread_local! {
    /// The stack `start` set up, shared by every connection of the thread.
    static STACK: RefCell<Option<Rc<RefCell<Stack>>>> = const { RefCell::new(None) };
}

/// Starts EAL with the memif client port and this host's stack on it;
/// waits for the port to connect to the server.
pub fn start(s: &Settings) -> Result<(), Error> {
    let stack = Stack::new(s)?;
    STACK.with(|c| *c.borrow_mut() = Some(Rc::new(RefCell::new(stack))));
    Ok(())
}

/// A connection to `addr` through the stack, or `None` when `--memif`
/// was not given.
pub fn dial(addr: &str) -> Result<Option<Conn>, Error> {
    let Some(stack) = STACK.with(|c| c.borrow().clone()) else {
        return Ok(None);
    };
    let to: SocketAddrV4 = addr
        .parse()
        .map_err(|_| format!("--addr {addr:?}: with --memif, an IPv4 address and port"))?;
    let handle = stack.borrow_mut().connect(to)?;
    Ok(Some(Conn {
        stack,
        handle,
        nonblocking: false,
        read_timeout: None,
        write_timeout: None,
    }))
}

/// The port, its queues and the smoltcp interface on it.
struct Stack {
    dev: Dev,
    iface: Interface,
    sockets: SocketSet<'static>,
    epoch: Instant,
    next_port: u16,
    // Dropped last: the queues and the port need EAL.
    _port: Port,
    _registration: ThreadRegistration,
    _eal: Eal,
}

impl Stack {
    fn new(s: &Settings) -> Result<Self, Error> {
        let cpu = first_allowed_cpu();
        let eal = Eal::init(&EalConfig {
            lcores: Some(cpu.to_string()),
            vdevs: vec![format!("net_memif0,role=client,socket={},id=0", s.socket)],
            no_pci: true,
            no_huge: true,
            memory_mb: Some(512),
            file_prefix: Some(format!("nvmf-perf-{}", std::process::id())),
            log_level: Some("*:warning".into()),
            ..EalConfig::default()
        })?;
        let registration = eal.register_thread()?;
        let pool = Arc::new(Mempool::new(&eal, "nvmf-perf", 16383, 256, 2048 + 128)?);
        let port = Port::open(
            &eal,
            "net_memif0",
            &PortConfig {
                promiscuous: false,
                ..PortConfig::default()
            },
            pool.clone(),
        )?;
        let waited = Instant::now();
        while !port.link().up {
            if waited.elapsed() > CONNECT_TIMEOUT {
                return Err(format!("the memif port did not connect to {}", s.socket).into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut dev = Dev {
            rx: port.rx_queue(0)?,
            tx: port.tx_queue(0)?,
            pool,
            inbox: Vec::with_capacity(BURST),
            out: MbufBatch::new(),
        };
        let epoch = Instant::now();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(s.mac)));
        config.random_seed = u64::from(std::process::id());
        let mut iface = Interface::new(config, &mut dev, SmolInstant::from_micros(0));
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(s.ip.0), s.ip.1));
        });
        Ok(Self {
            dev,
            iface,
            sockets: SocketSet::new(Vec::new()),
            epoch,
            next_port: first_local_port(),
            _port: port,
            _registration: registration,
            _eal: eal,
        })
    }

    /// Moves frames both ways and runs smoltcp.
    fn poll(&mut self) {
        let now = SmolInstant::from_micros(self.epoch.elapsed().as_micros() as i64);
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
        self.dev.flush();
    }

    /// Opens a TCP connection to `to` and waits for it to be established.
    fn connect(&mut self, to: SocketAddrV4) -> Result<SocketHandle, Error> {
        let mut sock = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
            tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
        );
        sock.set_nagle_enabled(false);
        sock.set_ack_delay(None);
        let local = self.next_port;
        self.next_port = if local == u16::MAX { 49152 } else { local + 1 };
        sock.connect(
            self.iface.context(),
            (IpAddress::Ipv4(*to.ip()), to.port()),
            local,
        )
        .map_err(|e| format!("connect to {to}: {e}"))?;
        let h = self.sockets.add(sock);
        let started = Instant::now();
        loop {
            self.poll();
            let s = self.sockets.get::<tcp::Socket>(h);
            match s.state() {
                tcp::State::Established => return Ok(h),
                tcp::State::Closed => {
                    self.sockets.remove(h);
                    return Err(format!("connect to {to}: refused").into());
                }
                _ if started.elapsed() > CONNECT_TIMEOUT => {
                    self.sockets.remove(h);
                    return Err(format!("connect to {to}: timed out").into());
                }
                _ => {}
            }
        }
    }
}

/// Where this process's local ports start: each run of nvmf-perf its own
/// range of the ephemeral ports, so that a connection the target still
/// holds from an earlier run (its reset lost) is not met by a new SYN of
/// the same four addresses and ports.
fn first_local_port() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mix = std::process::id().wrapping_mul(7919) ^ nanos;
    49152 + (mix % 16000) as u16
}

/// The CPU the EAL lcore is named after: the first this process may run
/// on (`taskset` picks it), so that EAL does not move it elsewhere.
fn first_allowed_cpu() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(|l| {
                    l.trim()
                        .split([',', '-'])
                        .next()
                        .and_then(|n| n.parse().ok())
                })
        })
        .unwrap_or(0)
}

/// The port's queues as smoltcp's device: frames are copied from and
/// into mbufs.
struct Dev {
    rx: RxQueue,
    tx: TxQueue,
    pool: Arc<Mempool>,
    /// Received frames not yet handed to smoltcp, last first.
    inbox: Vec<Mbuf>,
    /// Frames to send.
    out: MbufBatch,
}

impl Dev {
    /// Sends the frames queued; those the port does not take after a few
    /// tries are dropped (TCP sends them again).
    fn flush(&mut self) {
        for _ in 0..64 {
            if self.out.is_empty() {
                return;
            }
            self.tx.send(&mut self.out);
        }
        drop(self.out.drain());
    }
}

/// A received frame.
struct Rx(Mbuf);

/// Room for one frame to send.
struct Tx<'a> {
    pool: &'a Mempool,
    out: &'a mut MbufBatch,
    tx: &'a mut TxQueue,
}

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0.data())
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut m = match Mbuf::alloc(self.pool) {
            Ok(m) => m,
            // No buffer: the frame is built and dropped, as a full wire would.
            Err(_) => return f(&mut vec![0; len]),
        };
        let r = match m.append(len) {
            Ok(b) => f(b),
            Err(_) => return f(&mut vec![0; len]),
        };
        if self.out.is_full() {
            self.tx.send(self.out);
        }
        // Still full: the port takes nothing now; drop the frame.
        let _ = self.out.push(m);
        r
    }
}

impl phy::Device for Dev {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: SmolInstant) -> Option<(Rx, Tx<'_>)> {
        if self.inbox.is_empty() {
            self.rx.recv_into(&mut self.inbox, BURST);
            self.inbox.reverse();
        }
        let m = self.inbox.pop()?;
        Some((
            Rx(m),
            Tx {
                pool: &self.pool,
                out: &mut self.out,
                tx: &mut self.tx,
            },
        ))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<Tx<'_>> {
        Some(Tx {
            pool: &self.pool,
            out: &mut self.out,
            tx: &mut self.tx,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c.max_burst_size = Some(BURST);
        c
    }
}

/// One TCP connection of the stack.
pub struct Conn {
    stack: Rc<RefCell<Stack>>,
    handle: SocketHandle,
    nonblocking: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl io::Read for Conn {
    /// Takes what the socket holds; polls the stack only when it holds
    /// nothing (once for a non-blocking read).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let started = Instant::now();
        let mut polled = false;
        loop {
            let mut st = self.stack.borrow_mut();
            let s = st.sockets.get_mut::<tcp::Socket>(self.handle);
            if s.can_recv() {
                return s
                    .recv_slice(buf)
                    .map_err(|e| io::Error::other(format!("{e:?}")));
            }
            if !s.may_recv() {
                return Ok(0);
            }
            if polled && self.nonblocking {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if self.read_timeout.is_some_and(|t| started.elapsed() > t) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            st.poll();
            polled = true;
        }
    }
}

impl io::Write for Conn {
    /// Queues what the socket's buffer takes; the next poll (the next
    /// read of any connection, or `flush`) sends it. Polls the stack only
    /// when the buffer is full (once for a non-blocking write).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let started = Instant::now();
        let mut polled = false;
        loop {
            let mut st = self.stack.borrow_mut();
            let s = st.sockets.get_mut::<tcp::Socket>(self.handle);
            if s.can_send() {
                return s
                    .send_slice(buf)
                    .map_err(|e| io::Error::other(format!("{e:?}")));
            }
            if !s.may_send() {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            if polled && self.nonblocking {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if self.write_timeout.is_some_and(|t| started.elapsed() > t) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            st.poll();
            polled = true;
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stack.borrow_mut().poll();
        Ok(())
    }
}

impl Wire for Conn {
    fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.nonblocking = on;
        Ok(())
    }

    fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.read_timeout = t;
        Ok(())
    }

    fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.write_timeout = t;
        Ok(())
    }

    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

impl Drop for Conn {
    /// Resets the connection and forgets its socket.
    fn drop(&mut self) {
        let mut st = self.stack.borrow_mut();
        st.sockets.get_mut::<tcp::Socket>(self.handle).abort();
        st.poll();
        st.sockets.remove(self.handle);
    }
}

//! A controller as a host sees it: its admin queue brought up (Connect,
//! authentication when asked for, CC.EN, CSTS.RDY), what Identify
//! Controller says, and the I/O queues and discovery log it gives.
//!
//! ```no_run
//! # use std::net::{SocketAddr, TcpStream};
//! # use dpu_nvmeof::host::{self, Controller, ControllerOptions, HostIdentity, Transfer};
//! # fn main() -> Result<(), host::Error> {
//! let me = HostIdentity::new("nqn.2014-08.org.nvmexpress:uuid:1", [1; 16]);
//! let opts = ControllerOptions::default();
//! let addr: SocketAddr = "10.0.0.1:4420".parse().unwrap();
//! let mut c = Controller::connect(
//!     TcpStream::connect(addr)?, &me, "nqn.2024-01.io.example:disk", &opts)?;
//! c.set_io_queues(1)?;
//! let ns = c.identify_namespace(1)?;
//! let mut q = c.io_queue(TcpStream::connect(addr)?, 1, 128)?;
//! let first = q.call(host::read(1, 0, 0), Transfer::Read(vec![0; ns.block_size as usize]))?;
//! assert_eq!(first.data.len(), ns.block_size as usize);
//! # Ok(()) }
//! ```
//!
//! Keep Alive is the caller's to send ([`Controller::keep_alive`]) within
//! the timeout asked for ([`ControllerOptions::kato`]).

use std::time::{Duration, Instant};

use crate::spec::{prop, DISCOVERY_NQN};

use super::auth::authenticate;
use super::error::Error;
use super::pair::{QueueOptions, Transfer};
use super::queue::{Queue, Wire};
use super::{
    connect, connect_data, enable, get_log_page, identify, keep_alive, property_get, property_set,
    set_queue_count, HostIdentity, CC_SHUTDOWN,
};

/// Log page identifier of the discovery log.
const DISCOVERY_LOG: u8 = 0x70;
/// Bytes of the discovery log's header and of each of its entries.
const DISCOVERY_RECORD: usize = 1024;
/// Most discovery log entries read: a page of up to 256 KiB.
const MAX_DISCOVERY_ENTRIES: u64 = 255;
/// Bytes of Identify data.
const IDENTIFY_LEN: usize = 4096;
/// CSTS bits: ready, fatal status, shutdown status.
const CSTS_RDY: u32 = 1;
const CSTS_CFS: u32 = 1 << 1;
const CSTS_SHST_MASK: u32 = 3 << 2;
const CSTS_SHST_COMPLETE: u32 = 2 << 2;
/// Controller ID asking Connect for a new controller (dynamic model).
const NEW_CONTROLLER: u16 = 0xffff;

/// How a controller is brought up.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// Keep-alive timeout asked for in the admin queue's Connect (zero:
    /// none); send [`Controller::keep_alive`] within it.
    pub kato: Duration,
    /// The admin queue's settings (its entries among them); I/O queues
    /// take them too, with their own entries.
    pub queue: QueueOptions,
}

impl Default for ControllerOptions {
    /// A 30-second keep-alive timeout and [`QueueOptions::default`].
    fn default() -> Self {
        Self {
            kato: Duration::from_secs(30),
            queue: QueueOptions::default(),
        }
    }
}

/// What the controller said of itself: its Connect response, CAP and
/// Identify Controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Controller ID.
    pub cntlid: u16,
    /// Largest write data an I/O queue takes in the capsule (IOCCSZ less
    /// the SQE; 0 for a discovery controller).
    pub in_capsule: u32,
    /// Largest transfer of one command (MDTS); `None`: no limit given.
    pub max_transfer: Option<u32>,
    /// Number of namespaces (NN).
    pub namespaces: u32,
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// The NVM subsystem NQN it reports.
    pub subnqn: String,
    /// Optional NVM commands supported (ONCS): bit 2 Dataset Management,
    /// bit 3 Write Zeroes.
    pub oncs: u16,
    /// A volatile write cache is present (VWC bit 0): writes are durable
    /// only after a Flush, or with FUA.
    pub volatile_write_cache: bool,
    /// Most entries of one I/O queue (CAP.MQES + 1).
    pub max_queue_entries: u32,
}

impl ControllerInfo {
    /// Reads Identify Controller data `id` of controller `cntlid` whose
    /// CAP is `cap`.
    fn parse(id: &[u8], cntlid: u16, cap: u64) -> Result<Self, Error> {
        let id = id.get(..IDENTIFY_LEN).ok_or(Error::Malformed(
            "Identify Controller is shorter than 4096 bytes",
        ))?;
        let le32 = |at: usize| u32::from_le_bytes([id[at], id[at + 1], id[at + 2], id[at + 3]]);
        let ioccsz = le32(1792);
        let mdts = u32::from(id[77]);
        // CAP.MPSMIN: the smallest page is 2 ^ (12 + MPSMIN) bytes.
        let page_shift = 12 + ((cap >> 48) & 0xf) as u32;
        let max_transfer = match mdts {
            0 => None,
            m => 1u32.checked_shl(page_shift + m),
        };
        Ok(Self {
            cntlid,
            in_capsule: ioccsz.saturating_mul(16).saturating_sub(64),
            max_transfer,
            namespaces: le32(516),
            serial: text(&id[4..24]),
            model: text(&id[24..64]),
            subnqn: text(&id[768..1024]),
            oncs: u16::from_le_bytes([id[520], id[521]]),
            max_queue_entries: (cap & 0xffff) as u32 + 1,
            volatile_write_cache: id[525] & 1 != 0,
        })
    }
}

/// A namespace's size (Identify Namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceSize {
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Bytes of a logical block of the format in use.
    pub block_size: u32,
}

impl NamespaceSize {
    /// Reads Identify Namespace data `d` of namespace `nsid`.
    ///
    /// # Errors
    ///
    /// [`Error::InactiveNamespace`] for a size of zero (no such namespace
    /// active), [`Error::Malformed`] for short data or a block size
    /// outside 512 bytes ..= 2 GiB.
    pub fn parse(d: &[u8], nsid: u32) -> Result<Self, Error> {
        let d = d.get(..IDENTIFY_LEN).ok_or(Error::Malformed(
            "Identify Namespace is shorter than 4096 bytes",
        ))?;
        let mut nsze = [0u8; 8];
        nsze.copy_from_slice(&d[0..8]);
        let blocks = u64::from_le_bytes(nsze);
        if blocks == 0 {
            return Err(Error::InactiveNamespace { nsid });
        }
        // FLBAS: format index bits 3:0, and 6:5 as its high bits.
        let flbas = usize::from(d[26]);
        let format = (flbas & 0xf) | (flbas >> 1 & 0x30);
        let lbads = d[128 + format * 4 + 2];
        if !(9..=31).contains(&lbads) {
            return Err(Error::Malformed("LBA data size outside 9..=31"));
        }
        Ok(Self {
            blocks,
            block_size: 1 << lbads,
        })
    }

    /// Size in bytes (saturating).
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// One entry of the discovery log (NVMe-oF 1.1, 5.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type (3: TCP).
    pub trtype: u8,
    /// Address family (1: IPv4, 2: IPv6).
    pub adrfam: u8,
    /// Subsystem type (1: a discovery subsystem, 2: NVM, 3: this
    /// discovery controller).
    pub subtype: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Transport service identifier: the TCP port.
    pub trsvcid: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// Transport address.
    pub traddr: String,
    /// Transport requirements (TREQ): bits 1:0 say whether a secure
    /// channel is required (01b) or not (10b).
    pub treq: u8,
    /// The TCP security type of TSAS: 0 none, 2 TLS 1.3.
    pub sectype: u8,
}

impl DiscoveryEntry {
    /// Whether the port speaks TLS 1.3: `Some(true)` if it requires it,
    /// `Some(false)` if it allows it, `None` if it does not speak it.
    pub fn tls(&self) -> Option<bool> {
        (self.sectype == 2).then_some(self.treq & 0b11 == 0b01)
    }

    /// Reads one 1024-byte entry.
    fn parse(e: &[u8]) -> Option<Self> {
        let e = e.get(..DISCOVERY_RECORD)?;
        Some(Self {
            trtype: e[0],
            adrfam: e[1],
            subtype: e[2],
            portid: u16::from_le_bytes([e[4], e[5]]),
            cntlid: u16::from_le_bytes([e[6], e[7]]),
            trsvcid: text(&e[32..64]),
            subnqn: text(&e[256..512]),
            traddr: text(&e[512..768]),
            treq: e[3],
            sectype: e[768],
        })
    }
}

/// An ASCII field padded with spaces or NULs, as text.
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches(['\0', ' '])
        .to_string()
}

/// A controller, through its admin queue.
#[derive(Debug)]
pub struct Controller<W> {
    admin: Queue<W>,
    host: HostIdentity,
    subnqn: String,
    info: ControllerInfo,
    opts: ControllerOptions,
}

impl<W: Wire> Controller<W> {
    /// Brings up a new controller of `subnqn` for `host` over `wire`: the
    /// admin queue's ICReq and Connect, DH-HMAC-CHAP when the controller
    /// asks for it, CC.EN, CSTS.RDY awaited (within CAP.TO and the queue's
    /// timeout), Identify Controller.
    ///
    /// # Errors
    ///
    /// The queue's, [`Error::Status`] when a step fails,
    /// [`Error::ControllerFatal`], [`Error::Timeout`] when the controller
    /// does not become ready, [`Error::AuthRequired`] or [`Error::Auth`].
    pub fn connect(
        wire: W,
        host: &HostIdentity,
        subnqn: &str,
        opts: &ControllerOptions,
    ) -> Result<Self, Error> {
        let mut admin = Queue::open(wire, &opts.queue)?;
        let kato_ms = u32::try_from(opts.kato.as_millis()).unwrap_or(u32::MAX);
        let entries = opts.queue.entries.max(2);
        let cntlid = connect_queue(
            &mut admin,
            host,
            subnqn,
            0,
            NEW_CONTROLLER,
            entries,
            kato_ms,
        )?;
        let cap = property(&mut admin, prop::CAP)?;
        admin.call(enable(0), Transfer::None)?;
        // CAP.TO: the worst case to ready, in 500 ms units.
        let to = Duration::from_millis(((cap >> 24) & 0xff) * 500).max(Duration::from_millis(500));
        let limit = opts.queue.timeout.map_or(to, |t| t.min(to));
        wait_csts(&mut admin, limit, |csts| csts & CSTS_RDY != 0)?;
        let id = admin
            .call(identify(1, 0), Transfer::Read(vec![0; IDENTIFY_LEN]))?
            .data;
        let info = ControllerInfo::parse(&id, cntlid, cap)?;
        Ok(Self {
            admin,
            host: host.clone(),
            subnqn: subnqn.to_owned(),
            info,
            opts: opts.clone(),
        })
    }

    /// Brings up a controller of the discovery subsystem, as
    /// [`Controller::connect`] does.
    ///
    /// # Errors
    ///
    /// As [`Controller::connect`].
    pub fn discovery(
        wire: W,
        host: &HostIdentity,
        opts: &ControllerOptions,
    ) -> Result<Self, Error> {
        Self::connect(wire, host, DISCOVERY_NQN, opts)
    }

    /// What the controller said of itself.
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// The subsystem NQN connected to.
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    /// The admin queue, for commands of the caller's own.
    pub fn admin(&mut self) -> &mut Queue<W> {
        &mut self.admin
    }

    /// Asks for `n` I/O queues (Set Features, Number of Queues); returns
    /// how many the controller granted (the fewer of submission and
    /// completion queues).
    ///
    /// # Errors
    ///
    /// As [`Queue::call`].
    pub fn set_io_queues(&mut self, n: u16) -> Result<u16, Error> {
        let c = self.admin.call(set_queue_count(n), Transfer::None)?;
        let granted = (c.cqe.dw0 & 0xffff).min(c.cqe.dw0 >> 16);
        Ok(u16::try_from(granted + 1).unwrap_or(u16::MAX))
    }

    /// The size of namespace `nsid` (Identify Namespace).
    ///
    /// # Errors
    ///
    /// [`Error::InactiveNamespace`] when the controller has no such
    /// namespace active, [`Error::Malformed`] for a block size outside
    /// 512 bytes ..= 2 GiB, and as [`Queue::call`].
    pub fn identify_namespace(&mut self, nsid: u32) -> Result<NamespaceSize, Error> {
        let d = self
            .admin
            .call(identify(0, nsid), Transfer::Read(vec![0; IDENTIFY_LEN]))?
            .data;
        NamespaceSize::parse(&d, nsid)
    }

    /// Opens I/O queue `qid` of `entries` entries of this controller over
    /// `wire`: ICReq, Connect, authentication when asked for; its writes
    /// then go in the capsule up to the controller's
    /// [`ControllerInfo::in_capsule`].
    ///
    /// # Errors
    ///
    /// As [`Queue::open`] and [`Queue::call`], [`Error::AuthRequired`] or
    /// [`Error::Auth`].
    pub fn io_queue<V: Wire>(&self, wire: V, qid: u16, entries: u16) -> Result<Queue<V>, Error> {
        let entries = entries.max(2);
        let opts = QueueOptions {
            entries,
            ..self.opts.queue.clone()
        };
        let mut q = Queue::open(wire, &opts)?;
        connect_queue(
            &mut q,
            &self.host,
            &self.subnqn,
            qid,
            self.info.cntlid,
            entries,
            0,
        )?;
        q.pair_mut().set_in_capsule(self.info.in_capsule);
        Ok(q)
    }

    /// The discovery log: one entry per subsystem port, at most 255.
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for a header shorter than the specification's,
    /// and as [`Queue::call`].
    pub fn discovery_log(&mut self) -> Result<Vec<DiscoveryEntry>, Error> {
        let mut get = |len: usize| -> Result<Vec<u8>, Error> {
            let sqe = get_log_page(DISCOVERY_LOG, len as u32);
            Ok(self.admin.call(sqe, Transfer::Read(vec![0; len]))?.data)
        };
        let head = get(DISCOVERY_RECORD)?;
        let numrec = head
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or(Error::Malformed(
                "discovery log header shorter than 16 bytes",
            ))?;
        let n = numrec.min(MAX_DISCOVERY_ENTRIES) as usize;
        let log = get(DISCOVERY_RECORD * (n + 1))?;
        Ok(log
            .chunks_exact(DISCOVERY_RECORD)
            .skip(1)
            .take(n)
            .filter_map(DiscoveryEntry::parse)
            .collect())
    }

    /// Sends a Keep Alive.
    ///
    /// # Errors
    ///
    /// As [`Queue::call`].
    pub fn keep_alive(&mut self) -> Result<(), Error> {
        self.admin.call(keep_alive(), Transfer::None)?;
        Ok(())
    }

    /// Shuts the controller down normally (CC.SHN, then CSTS.SHST
    /// awaited within the queue's timeout) and closes the admin queue.
    /// Its I/O queues are closed first by the caller.
    ///
    /// # Errors
    ///
    /// As [`Queue::call`], and [`Error::Timeout`].
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.admin
            .call(property_set(0, prop::CC, CC_SHUTDOWN), Transfer::None)?;
        let limit = self.opts.queue.timeout.unwrap_or(Duration::from_secs(30));
        wait_csts(&mut self.admin, limit, |csts| {
            csts & CSTS_SHST_MASK == CSTS_SHST_COMPLETE
        })
    }
}

/// Connects queue `qid` of controller `cntlid` and authenticates it when
/// the controller asks; the controller ID it answers with.
fn connect_queue<W: Wire>(
    q: &mut Queue<W>,
    host: &HostIdentity,
    subnqn: &str,
    qid: u16,
    cntlid: u16,
    entries: u16,
    kato_ms: u32,
) -> Result<u16, Error> {
    let data = connect_data(host.id, cntlid, subnqn, &host.nqn);
    let c = q.call(connect(0, qid, entries, kato_ms), Transfer::Write(data))?;
    // AUTHREQ.ATR: authenticate before anything else.
    if c.cqe.dw0 & 1 << 17 != 0 {
        authenticate(q, host, subnqn, qid)?;
    }
    Ok(c.cqe.dw0 as u16)
}

/// An 8-byte property (CAP) of the controller.
fn property<W: Wire>(q: &mut Queue<W>, offset: u32) -> Result<u64, Error> {
    let c = q.call(property_get(0, offset, true), Transfer::None)?;
    Ok(u64::from(c.cqe.dw0) | u64::from(c.cqe.dw1) << 32)
}

/// Polls CSTS until `done` says so, within `limit`.
fn wait_csts<W: Wire>(
    q: &mut Queue<W>,
    limit: Duration,
    done: impl Fn(u32) -> bool,
) -> Result<(), Error> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let csts = q
            .call(property_get(0, prop::CSTS, false), Transfer::None)?
            .cqe
            .dw0;
        if csts & CSTS_CFS != 0 {
            return Err(Error::ControllerFatal);
        }
        if done(csts) {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(Error::Timeout);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identify_controller_fields() {
        let mut id = vec![0u8; IDENTIFY_LEN];
        id[4..8].copy_from_slice(b"SN01");
        id[8..24].fill(b' ');
        id[24..29].copy_from_slice(b"model");
        id[77] = 5;
        id[516..520].copy_from_slice(&32u32.to_le_bytes());
        id[768..773].copy_from_slice(b"nqn.x");
        id[520] = 0x0c;
        id[525] = 1;
        id[1792..1796].copy_from_slice(&516u32.to_le_bytes());
        let i = ControllerInfo::parse(&id, 7, 0).unwrap();
        assert_eq!(
            i,
            ControllerInfo {
                cntlid: 7,
                in_capsule: 8192,
                max_transfer: Some(128 << 10),
                namespaces: 32,
                serial: "SN01".into(),
                model: "model".into(),
                subnqn: "nqn.x".into(),
                oncs: 0x0c,
                volatile_write_cache: true,
                max_queue_entries: 1,
            }
        );
        // A huge MDTS is no limit rather than an overflow; short data an error.
        id[77] = 0xff;
        assert_eq!(
            ControllerInfo::parse(&id, 7, 0xf << 48)
                .unwrap()
                .max_transfer,
            None
        );
        assert!(matches!(
            ControllerInfo::parse(&id[..100], 7, 0),
            Err(Error::Malformed(_))
        ));
    }

    #[test]
    fn discovery_entry_fields() {
        let mut e = vec![0u8; DISCOVERY_RECORD];
        e[0] = 3;
        e[1] = 1;
        e[2] = 2;
        e[4..6].copy_from_slice(&1u16.to_le_bytes());
        e[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
        e[32..36].copy_from_slice(b"4420");
        e[36..64].fill(b' ');
        e[256..261].copy_from_slice(b"nqn.y");
        e[512..521].copy_from_slice(b"127.0.0.1");
        let d = DiscoveryEntry::parse(&e).unwrap();
        assert_eq!(
            (d.trtype, d.adrfam, d.subtype, d.portid, d.cntlid),
            (3, 1, 2, 1, 0xffff)
        );
        assert_eq!(
            (d.trsvcid.as_str(), d.subnqn.as_str(), d.traddr.as_str()),
            ("4420", "nqn.y", "127.0.0.1")
        );
        assert!(DiscoveryEntry::parse(&e[..1000]).is_none());
    }
}

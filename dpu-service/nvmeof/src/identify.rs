//! Identify data structures and log pages, encoded byte for byte as the NVMe
//! Base Specification (and NVMe over Fabrics for the fabrics fields and the
//! discovery log) lays them out.

/// What a controller serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// An I/O controller.
    Io,
    /// A discovery controller.
    Discovery,
}

/// What Identify Controller reports.
#[derive(Debug, Clone)]
pub struct ControllerInfo<'a> {
    /// Controller type.
    pub kind: ControllerKind,
    /// PCI vendor ID.
    pub vid: u16,
    /// PCI subsystem vendor ID.
    pub ssvid: u16,
    /// Serial number (20 ASCII characters at most).
    pub serial: &'a str,
    /// Model number (40 ASCII characters at most).
    pub model: &'a str,
    /// Firmware revision (8 ASCII characters at most).
    pub firmware: &'a str,
    /// IEEE OUI.
    pub ieee_oui: [u8; 3],
    /// Controller ID.
    pub cntlid: u16,
    /// Version (VS register value).
    pub version: u32,
    /// Subsystem NQN.
    pub subnqn: &'a str,
    /// Maximum data transfer size, a power of two of 4 KiB pages.
    pub mdts: u8,
    /// Number of namespaces (NN).
    pub max_namespaces: u32,
    /// Keep-alive granularity, 100 ms units.
    pub kas: u16,
    /// Asynchronous event request limit (0-based).
    pub aerl: u8,
    /// Most commands outstanding per queue.
    pub maxcmd: u16,
    /// I/O queue command capsule size, 16-byte units.
    pub ioccsz: u32,
    /// I/O queue response capsule size, 16-byte units.
    pub iorcsz: u32,
    /// A volatile write cache is present.
    pub volatile_write_cache: bool,
    /// Namespace attribute notices are supported (OAES bit 8).
    pub namespace_mgmt_events: bool,
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn put_u128(b: &mut [u8], at: usize, v: u128) {
    b[at..at + 16].copy_from_slice(&v.to_le_bytes());
}
/// ASCII field, space padded, truncated to `len`.
fn put_ascii(b: &mut [u8], at: usize, len: usize, s: &str) {
    let f = &mut b[at..at + len];
    f.fill(b' ');
    let n = s.len().min(len);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}
/// String field, NUL padded, truncated to `len - 1` so it stays terminated.
fn put_nul(b: &mut [u8], at: usize, len: usize, s: &str) {
    let f = &mut b[at..at + len];
    f.fill(0);
    let n = s.len().min(len - 1);
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Identify Controller (CNS 01h), 4096 bytes.
pub fn identify_controller(c: &ControllerInfo) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put_u16(&mut b, 0, c.vid);
    put_u16(&mut b, 2, c.ssvid);
    put_ascii(&mut b, 4, 20, c.serial);
    put_ascii(&mut b, 24, 40, c.model);
    put_ascii(&mut b, 64, 8, c.firmware);
    b[72] = 0; // RAB
    b[73..76].copy_from_slice(&c.ieee_oui);
    b[76] = 0x02; // CMIC: may be reached by several controllers
    b[77] = c.mdts;
    put_u16(&mut b, 78, c.cntlid);
    put_u32(&mut b, 80, c.version);
    let io = c.kind == ControllerKind::Io;
    if io && c.namespace_mgmt_events {
        put_u32(&mut b, 92, 1 << 8); // OAES: namespace attribute notices
    } else if !io {
        put_u32(&mut b, 92, 1 << 31); // OAES: discovery log change notices
    }
    b[111] = if io { 1 } else { 2 }; // CNTRLTYPE
                                     // OACS (256) 0: no optional admin commands.
    b[258] = 3; // ACL: 4 aborts (0-based)
    b[259] = c.aerl;
    b[260] = if io { 0x03 } else { 0 }; // FRMW: slot 1 read-only, one slot
    b[261] = 0x04; // LPA: extended data for Get Log Page
    b[262] = 63; // ELPE: 64 error log entries (0-based)
    b[263] = 0; // NPSS: one power state
    put_u16(&mut b, 320, c.kas);
    if io {
        b[512] = 0x66; // SQES
        b[513] = 0x44; // CQES
    }
    put_u16(&mut b, 514, c.maxcmd);
    put_u32(&mut b, 516, c.max_namespaces);
    if io {
        put_u16(&mut b, 520, (1 << 2) | (1 << 3)); // ONCS: DSM, Write Zeroes
                                                   // VWC: present, broadcast flush NSID not supported (bits 2:1 = 10b).
        b[525] = if c.volatile_write_cache {
            0x01 | 0x04
        } else {
            0x04
        };
        // SGLS: SGLs supported (no alignment), offsets in data block descriptors.
        put_u32(&mut b, 536, 0x1 | (1 << 20));
    } else {
        put_u32(&mut b, 536, 0x1 | (1 << 20));
    }
    put_nul(&mut b, 768, 256, c.subnqn);
    // Fabrics fields.
    put_u32(&mut b, 1792, c.ioccsz);
    put_u32(&mut b, 1796, c.iorcsz);
    put_u16(&mut b, 1800, 0); // ICDOFF
    b[1802] = 0; // FCATT: dynamic controller model
    b[1803] = 1; // MSDBD
                 // Power state 0 (at 2048): 25 W max power, in 0.01 W units.
    put_u16(&mut b, 2048, 2500);
    b
}

/// What Identify Namespace reports.
#[derive(Debug, Clone)]
pub struct NamespaceInfo {
    /// Size in logical blocks (NSZE = NCAP = NUSE).
    pub blocks: u64,
    /// log2 of the logical block size.
    pub lba_shift: u8,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier, if any.
    pub eui64: Option<[u8; 8]>,
    /// May be attached to several controllers (NMIC bit 0).
    pub shared: bool,
    /// Deallocated blocks read as zeros.
    pub deallocate_reads_zero: bool,
    /// Writes may sit in a volatile cache.
    pub volatile_write_cache: bool,
    /// Optimal I/O boundary, in blocks.
    pub optimal_io_blocks: Option<u16>,
}

/// Identify Namespace (CNS 00h), 4096 bytes.
pub fn identify_namespace(n: &NamespaceInfo) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    put_u64(&mut b, 0, n.blocks);
    put_u64(&mut b, 8, n.blocks);
    put_u64(&mut b, 16, n.blocks);
    // NSFEAT: thin provisioning (deallocation) supported, NOIOB valid.
    b[24] = 0x01
        | if n.optimal_io_blocks.is_some() {
            0x10
        } else {
            0
        };
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0
    b[30] = u8::from(n.shared); // NMIC
                                // DLFEAT: deallocated blocks read zeros (001b), write zeroes may deallocate.
    b[33] = if n.deallocate_reads_zero {
        0x01 | 0x08
    } else {
        0
    };
    if let Some(o) = n.optimal_io_blocks {
        put_u16(&mut b, 72, o); // NOIOB
    }
    b[104..120].copy_from_slice(&n.nguid);
    if let Some(e) = n.eui64 {
        b[120..128].copy_from_slice(&e);
    }
    // LBAF0: LBADS in bits 23:16, no metadata, best performance.
    put_u32(&mut b, 128, u32::from(n.lba_shift) << 16);
    b
}

/// Active Namespace ID list (CNS 02h): the first 1024 active NSIDs above
/// `after`, ascending, zero filled; 4096 bytes.
pub fn active_namespace_list(nsids: impl IntoIterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut ids: Vec<u32> = nsids.into_iter().filter(|&n| n > after).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut b = vec![0u8; 4096];
    for (i, n) in ids.into_iter().take(1024).enumerate() {
        put_u32(&mut b, i * 4, n);
    }
    b
}

/// Namespace Identification Descriptor list (CNS 03h), 4096 bytes.
pub fn namespace_descriptors(eui64: Option<[u8; 8]>, nguid: [u8; 16], uuid: [u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let mut at = 0;
    let mut put = |nidt: u8, id: &[u8]| {
        b[at] = nidt;
        b[at + 1] = id.len() as u8;
        b[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    };
    if let Some(e) = eui64 {
        put(1, &e);
    }
    put(2, &nguid);
    put(3, &uuid);
    b
}

/// Error Information log page.
pub const LID_ERROR: u8 = 0x01;
/// SMART / Health Information log page.
pub const LID_SMART: u8 = 0x02;
/// Firmware Slot Information log page.
pub const LID_FW_SLOT: u8 = 0x03;
/// Changed Namespace List log page.
pub const LID_CHANGED_NS: u8 = 0x04;
/// Commands Supported and Effects log page.
pub const LID_CMD_EFFECTS: u8 = 0x05;
/// Discovery log page.
pub const LID_DISCOVERY: u8 = 0x70;

/// One Error Information log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorEntry {
    /// Error count (unique, increasing).
    pub error_count: u64,
    /// Submission queue ID.
    pub sqid: u16,
    /// Command ID.
    pub cid: u16,
    /// Status field (as in the CQE, phase bit clear).
    pub status: u16,
    /// Parameter error location (0xFFFF: not specific).
    pub param_location: u16,
    /// LBA of the failure.
    pub lba: u64,
    /// Namespace.
    pub nsid: u32,
}

/// Error Information log: 64 bytes per entry, `entries` newest first,
/// padded with zeros to `slots` entries.
pub fn error_log(entries: &[ErrorEntry], slots: usize) -> Vec<u8> {
    let mut b = vec![0u8; 64 * slots];
    for (i, e) in entries.iter().take(slots).enumerate() {
        let at = i * 64;
        put_u64(&mut b, at, e.error_count);
        put_u16(&mut b, at + 8, e.sqid);
        put_u16(&mut b, at + 10, e.cid);
        put_u16(&mut b, at + 12, e.status);
        put_u16(&mut b, at + 14, e.param_location);
        put_u64(&mut b, at + 16, e.lba);
        put_u32(&mut b, at + 24, e.nsid);
        b[at + 29] = 3; // TRTYPE: TCP
    }
    b
}

/// What the SMART / Health log reports.
#[derive(Debug, Clone, Default)]
pub struct SmartInfo {
    /// Critical warning bits.
    pub critical_warning: u8,
    /// Composite temperature, kelvin.
    pub temperature_kelvin: u16,
    /// Available spare, percent.
    pub available_spare: u8,
    /// Available spare threshold, percent.
    pub spare_threshold: u8,
    /// Percentage used.
    pub percentage_used: u8,
    /// Data units (1000 × 512 bytes) read.
    pub data_units_read: u128,
    /// Data units written.
    pub data_units_written: u128,
    /// Read commands.
    pub host_read_commands: u128,
    /// Write commands.
    pub host_write_commands: u128,
    /// Controller busy time, minutes.
    pub busy_time_minutes: u128,
    /// Power cycles.
    pub power_cycles: u128,
    /// Power-on hours.
    pub power_on_hours: u128,
    /// Unsafe shutdowns.
    pub unsafe_shutdowns: u128,
    /// Media and data integrity errors.
    pub media_errors: u128,
    /// Error log entries over the controller's life.
    pub error_log_entries: u128,
}

/// SMART / Health Information (02h), 512 bytes.
pub fn smart_log(s: &SmartInfo) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = s.critical_warning;
    put_u16(&mut b, 1, s.temperature_kelvin);
    b[3] = s.available_spare;
    b[4] = s.spare_threshold;
    b[5] = s.percentage_used;
    put_u128(&mut b, 32, s.data_units_read);
    put_u128(&mut b, 48, s.data_units_written);
    put_u128(&mut b, 64, s.host_read_commands);
    put_u128(&mut b, 80, s.host_write_commands);
    put_u128(&mut b, 96, s.busy_time_minutes);
    put_u128(&mut b, 112, s.power_cycles);
    put_u128(&mut b, 128, s.power_on_hours);
    put_u128(&mut b, 144, s.unsafe_shutdowns);
    put_u128(&mut b, 160, s.media_errors);
    put_u128(&mut b, 176, s.error_log_entries);
    b
}

/// Firmware Slot Information (03h), 512 bytes: slot 1 active.
pub fn firmware_slot_log(firmware: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // AFI: slot 1
    put_ascii(&mut b, 8, 8, firmware);
    b
}

/// Changed Namespace List (04h), 4096 bytes; more than 1024 changes are
/// reported as a single 0xFFFFFFFF.
pub fn changed_namespace_list(nsids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    if nsids.len() > 1024 {
        put_u32(&mut b, 0, u32::MAX);
    } else {
        for (i, n) in nsids.iter().enumerate() {
            put_u32(&mut b, i * 4, *n);
        }
    }
    b
}

/// Commands Supported and Effects (05h), 4096 bytes: `admin` and `io`
/// opcodes supported; `io_writes` also change logical block content.
pub fn command_effects_log(admin: &[u8], io: &[u8], io_writes: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for &op in admin {
        put_u32(&mut b, usize::from(op) * 4, 1);
    }
    for &op in io {
        let lbcc = if io_writes.contains(&op) { 1 << 1 } else { 0 };
        put_u32(&mut b, 1024 + usize::from(op) * 4, 1 | lbcc);
    }
    b
}

/// Address family of a discovery log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// Subsystem type of a discovery log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoverySubtype {
    /// Another discovery subsystem (a referral).
    Referral,
    /// An NVM subsystem.
    Nvme,
    /// The discovery subsystem being queried.
    CurrentDiscovery,
}

/// One discovery log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Subsystem type.
    pub subtype: DiscoverySubtype,
    /// Port ID.
    pub port_id: u16,
    /// Controller ID (0xFFFF: dynamic).
    pub cntlid: u16,
    /// Admin max submission queue size.
    pub asqsz: u16,
    /// Address family.
    pub family: AddressFamily,
    /// Transport address.
    pub traddr: String,
    /// Transport service ID (the TCP port).
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Duplicate returned information (EFLAGS bit 0).
    pub duplicate_returned_info: bool,
    /// Explicit persistent connection support (EFLAGS bit 1).
    pub explicit_persistent_connection: bool,
}

/// Discovery log page (70h): a 1024-byte header, then 1024 bytes per entry.
pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; 1024 * (1 + entries.len())];
    put_u64(&mut b, 0, genctr);
    put_u64(&mut b, 8, entries.len() as u64);
    put_u16(&mut b, 16, 0); // RECFMT
    for (i, e) in entries.iter().enumerate() {
        let at = 1024 * (i + 1);
        b[at] = 3; // TRTYPE: TCP
        b[at + 1] = match e.family {
            AddressFamily::Ipv4 => 1,
            AddressFamily::Ipv6 => 2,
        };
        b[at + 2] = match e.subtype {
            DiscoverySubtype::Referral => 1,
            DiscoverySubtype::Nvme => 2,
            DiscoverySubtype::CurrentDiscovery => 3,
        };
        b[at + 3] = 0x02; // TREQ: secure channel not required
        put_u16(&mut b, at + 4, e.port_id);
        put_u16(&mut b, at + 6, e.cntlid);
        put_u16(&mut b, at + 8, e.asqsz);
        put_u16(
            &mut b,
            at + 10,
            u16::from(e.duplicate_returned_info) | u16::from(e.explicit_persistent_connection) << 1,
        );
        put_ascii(&mut b, at + 32, 32, &e.trsvcid);
        put_nul(&mut b, at + 256, 256, &e.subnqn);
        put_ascii(&mut b, at + 512, 256, &e.traddr);
        b[at + 768] = 0; // TSAS: TCP SECTYPE none
    }
    b
}

/// Feature identifiers of Get/Set Features.
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MGMT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMP_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WC: u8 = 0x06;
    /// Number of Queues.
    pub const NUM_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const IRQ_COALESCE: u8 = 0x08;
    /// Interrupt Vector Configuration.
    pub const IRQ_CONFIG: u8 = 0x09;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMIC: u8 = 0x0a;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT: u8 = 0x0b;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE: u8 = 0x0f;
    /// Host Identifier.
    pub const HOST_ID: u8 = 0x81;
}

/// Completion dword 0 of an Asynchronous Event Request: event type, event
/// information and the log page to read.
pub fn async_event_dw0(event_type: u8, info: u8, lid: u8) -> u32 {
    u32::from(event_type & 7) | u32::from(info) << 8 | u32::from(lid) << 16
}

/// A Namespace Attribute Changed notice (type 2 notice, information 0,
/// Changed Namespace List log).
pub const AEN_NS_ATTR_CHANGED: u32 = 0x0004_0002;

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl(kind: ControllerKind) -> Vec<u8> {
        identify_controller(&ControllerInfo {
            kind,
            vid: 0x1234,
            ssvid: 0x5678,
            serial: "SN42",
            model: "model",
            firmware: "fw1",
            ieee_oui: [1, 2, 3],
            cntlid: 7,
            version: 0x0001_0300,
            subnqn: "nqn.2024-01.io.example:a",
            mdts: 7,
            max_namespaces: 32,
            kas: 1,
            aerl: 3,
            maxcmd: 1024,
            ioccsz: 516,
            iorcsz: 1,
            volatile_write_cache: true,
            namespace_mgmt_events: true,
        })
    }

    #[test]
    fn identify_controller_offsets() {
        let b = ctrl(ControllerKind::Io);
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[4..24], b"SN42                ");
        assert_eq!(&b[24..29], b"model");
        assert_eq!(b[63], b' ');
        assert_eq!(&b[64..72], b"fw1     ");
        assert_eq!(b[77], 7);
        assert_eq!(u16::from_le_bytes([b[78], b[79]]), 7);
        assert_eq!(
            u32::from_le_bytes(b[80..84].try_into().unwrap()),
            0x0001_0300
        );
        assert_eq!(u32::from_le_bytes(b[92..96].try_into().unwrap()), 1 << 8);
        assert_eq!(b[111], 1);
        assert_eq!((b[512], b[513]), (0x66, 0x44));
        assert_eq!(u32::from_le_bytes(b[516..520].try_into().unwrap()), 32);
        assert_eq!(u16::from_le_bytes([b[520], b[521]]), 0x0c);
        assert_eq!(b[525], 0x05);
        assert_eq!(&b[768..792], b"nqn.2024-01.io.example:a");
        assert_eq!(b[792], 0);
        assert_eq!(u32::from_le_bytes(b[1792..1796].try_into().unwrap()), 516);
        assert_eq!(b[1803], 1);
        assert_eq!(ctrl(ControllerKind::Discovery)[111], 2);
    }

    #[test]
    fn identify_namespace_offsets() {
        let b = identify_namespace(&NamespaceInfo {
            blocks: 2048,
            lba_shift: 12,
            nguid: [9; 16],
            eui64: None,
            shared: true,
            deallocate_reads_zero: true,
            volatile_write_cache: false,
            optimal_io_blocks: None,
        });
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 2048);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 2048);
        assert_eq!(b[30], 1);
        assert_eq!(b[33] & 7, 1);
        assert_eq!(&b[104..120], &[9; 16]);
        assert_eq!(b[128 + 2], 12);
    }

    #[test]
    fn lists() {
        let b = active_namespace_list([5, 1, 3], 1);
        assert_eq!(&b[0..12], &[3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        let many: Vec<u32> = (1..=1025).collect();
        assert_eq!(&changed_namespace_list(&many)[0..4], &[0xff; 4]);
        let d = namespace_descriptors(None, [1; 16], [2; 16]);
        assert_eq!(&d[0..4], &[2, 16, 0, 0]);
        assert_eq!(&d[20..24], &[3, 16, 0, 0]);
        assert_eq!(&d[24..40], &[2; 16]);
    }

    #[test]
    fn logs() {
        let e = ErrorEntry {
            error_count: 2,
            sqid: 1,
            cid: 9,
            status: 0x100,
            param_location: 0xffff,
            lba: 77,
            nsid: 1,
        };
        let b = error_log(&[e], 4);
        assert_eq!(b.len(), 256);
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 2);
        assert_eq!(u16::from_le_bytes([b[10], b[11]]), 9);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 77);
        let s = smart_log(&SmartInfo {
            temperature_kelvin: 300,
            data_units_read: 5,
            media_errors: 3,
            ..Default::default()
        });
        assert_eq!(u16::from_le_bytes([s[1], s[2]]), 300);
        assert_eq!(s[32], 5);
        assert_eq!(s[160], 3);
        let d = discovery_log(
            4,
            &[DiscoveryEntry {
                subtype: DiscoverySubtype::Nvme,
                port_id: 1,
                cntlid: 0xffff,
                asqsz: 32,
                family: AddressFamily::Ipv4,
                traddr: "10.0.0.1".into(),
                trsvcid: "4420".into(),
                subnqn: "nqn.x".into(),
                duplicate_returned_info: false,
                explicit_persistent_connection: false,
            }],
        );
        assert_eq!(d.len(), 2048);
        assert_eq!(u64::from_le_bytes(d[8..16].try_into().unwrap()), 1);
        assert_eq!((d[1024], d[1025], d[1026]), (3, 1, 2));
        assert_eq!(&d[1024 + 32..1024 + 36], b"4420");
        assert_eq!(&d[1024 + 512..1024 + 520], b"10.0.0.1");
        assert_eq!(&d[1024 + 256..1024 + 261], b"nqn.x");
        assert_eq!(async_event_dw0(2, 0, LID_CHANGED_NS), AEN_NS_ATTR_CHANGED);
    }
}

//! Identify data structures and log pages, encoded byte for byte as the NVMe
//! Base Specification 2.0 (and NVMe over Fabrics 1.1 for the fabrics fields
//! of Identify Controller and the discovery log page) lays them out.
//!
//! Every encoder is a pure function of a plain input struct and returns the
//! whole structure; the caller slices log pages by the command's offset and
//! length. Multi-byte fields are little endian. ASCII fields (SN, MN, FR,
//! FRS, TRSVCID) are space padded; NQN and transport address fields are NUL
//! padded and keep at least one terminating NUL. Overlong inputs are
//! truncated.

/// Size of every Identify data structure (CNS 00h to 03h).
pub const IDENTIFY_LEN: usize = 4096;

/// Identify CNS (Controller or Namespace Structure) values served.
pub mod cns {
    /// Identify Namespace data structure of the NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: u8 = 0x03;
}

/// Error Information log entries kept and reported (ELPE + 1).
pub const ERROR_LOG_ENTRIES: usize = 64;

/// Warning Composite Temperature Threshold reported (WCTEMP), kelvin.
pub const WCTEMP_KELVIN: u16 = 343;
/// Critical Composite Temperature Threshold reported (CCTEMP), kelvin.
pub const CCTEMP_KELVIN: u16 = 358;

/// What a controller serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// An I/O controller (CNTRLTYPE 1).
    Io,
    /// A discovery controller (CNTRLTYPE 2).
    Discovery,
}

/// What Identify Controller reports.
#[derive(Debug, Clone)]
pub struct ControllerInfo<'a> {
    /// Controller type.
    pub kind: ControllerKind,
    /// PCI vendor ID (VID).
    pub vid: u16,
    /// PCI subsystem vendor ID (SSVID).
    pub ssvid: u16,
    /// Serial number (SN, 20 ASCII characters at most).
    pub serial: &'a str,
    /// Model number (MN, 40 ASCII characters at most).
    pub model: &'a str,
    /// Firmware revision (FR, 8 ASCII characters at most).
    pub firmware: &'a str,
    /// IEEE OUI identifier, least significant byte first as on the wire.
    pub ieee_oui: [u8; 3],
    /// Controller ID (CNTLID).
    pub cntlid: u16,
    /// Version (VER, the VS property value, e.g. `0x0001_0300` for 1.3).
    pub version: u32,
    /// Subsystem NQN (SUBNQN).
    pub subnqn: &'a str,
    /// Maximum data transfer size (MDTS): a power of two of CAP.MPSMIN
    /// (4 KiB) units; 0 means no limit.
    pub mdts: u8,
    /// Number of namespaces (NN): the largest valid NSID (I/O only).
    pub max_namespaces: u32,
    /// Keep-alive granularity (KAS), 100 ms units.
    pub kas: u16,
    /// Asynchronous event request limit (AERL, 0-based).
    pub aerl: u8,
    /// Most commands outstanding per queue (MAXCMD).
    pub maxcmd: u16,
    /// I/O queue command capsule size (IOCCSZ), 16-byte units (I/O only).
    pub ioccsz: u32,
    /// I/O queue response capsule size (IORCSZ), 16-byte units (I/O only).
    pub iorcsz: u32,
    /// A volatile write cache is present (VWC bit 0, I/O only).
    pub volatile_write_cache: bool,
    /// Namespace attribute notices are supported (OAES bit 8, I/O only; a
    /// discovery controller always reports discovery log change notices,
    /// OAES bit 31).
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

/// ASCII field, left justified, space padded, truncated to `len`; bytes that
/// are not printable ASCII become `?`.
fn put_ascii(b: &mut [u8], at: usize, len: usize, s: &str) {
    let f = &mut b[at..at + len];
    f.fill(b' ');
    for (d, &c) in f.iter_mut().zip(s.as_bytes()) {
        *d = if (0x20..=0x7e).contains(&c) { c } else { b'?' };
    }
}

/// UTF-8 string field, NUL padded, truncated (on a character boundary) to
/// `len - 1` bytes so that it stays NUL terminated.
fn put_nul(b: &mut [u8], at: usize, len: usize, s: &str) {
    let f = &mut b[at..at + len];
    f.fill(0);
    let mut n = s.len().min(len - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Identify Controller field offsets (NVMe Base 2.0, Identify Controller
/// data structure; fabrics fields from byte 1792).
mod ctrl_off {
    pub const VID: usize = 0;
    pub const SSVID: usize = 2;
    pub const SN: usize = 4;
    pub const MN: usize = 24;
    pub const FR: usize = 64;
    pub const RAB: usize = 72;
    pub const IEEE: usize = 73;
    pub const CMIC: usize = 76;
    pub const MDTS: usize = 77;
    pub const CNTLID: usize = 78;
    pub const VER: usize = 80;
    pub const OAES: usize = 92;
    pub const CTRATT: usize = 96;
    pub const CNTRLTYPE: usize = 111;
    pub const OACS: usize = 256;
    pub const ACL: usize = 258;
    pub const AERL: usize = 259;
    pub const FRMW: usize = 260;
    pub const LPA: usize = 261;
    pub const ELPE: usize = 262;
    pub const NPSS: usize = 263;
    pub const WCTEMP: usize = 266;
    pub const CCTEMP: usize = 268;
    pub const KAS: usize = 320;
    pub const SQES: usize = 512;
    pub const CQES: usize = 513;
    pub const MAXCMD: usize = 514;
    pub const NN: usize = 516;
    pub const ONCS: usize = 520;
    pub const VWC: usize = 525;
    pub const SGLS: usize = 536;
    pub const SUBNQN: usize = 768;
    pub const IOCCSZ: usize = 1792;
    pub const IORCSZ: usize = 1796;
    pub const ICDOFF: usize = 1800;
    pub const FCATT: usize = 1802;
    pub const MSDBD: usize = 1803;
    pub const OFCS: usize = 1804;
    pub const PSD0: usize = 2048;
}

/// CMIC bit 1: the NVM subsystem may contain two or more controllers.
const CMIC_MULTI_CTRL: u8 = 1 << 1;
/// OAES bit 8: Namespace Attribute Notices.
const OAES_NS_ATTR: u32 = 1 << 8;
/// OAES bit 31: Discovery Log Page Change Notices.
const OAES_DISCOVERY_CHANGE: u32 = 1 << 31;
/// CTRATT bit 0: 128-bit Host Identifier supported (required by fabrics).
const CTRATT_HOST_ID_128: u32 = 1 << 0;
/// FRMW: bit 0 slot 1 read only, bits 3:1 number of slots (1).
const FRMW_SLOT1_RO_ONE_SLOT: u8 = 0x01 | (1 << 1);
/// LPA bit 1: Commands Supported and Effects log page.
const LPA_CMD_EFFECTS: u8 = 1 << 1;
/// LPA bit 2: extended data for Get Log Page (NUMDU, LPOL/LPOU).
const LPA_EXTENDED: u8 = 1 << 2;
/// ONCS bit 2: Dataset Management.
const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit 3: Write Zeroes.
const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// VWC bit 0: a volatile write cache is present.
const VWC_PRESENT: u8 = 1 << 0;
/// VWC bits 2:1 = 10b: Flush with NSID FFFFFFFFh is not supported.
const VWC_NO_BROADCAST_FLUSH: u8 = 0b10 << 1;
/// SGLS bits 1:0 = 01b: SGLs supported, no alignment requirement.
const SGLS_SUPPORTED: u32 = 0b01;
/// SGLS bit 20: the Address field of a Data Block descriptor may be an
/// offset (in-capsule data).
const SGLS_OFFSET: u32 = 1 << 20;
/// SGLS bit 21: Transport SGL Data Block descriptor supported (NVMe/TCP).
const SGLS_TRANSPORT: u32 = 1 << 21;
/// OFCS bit 0: Disconnect command supported.
const OFCS_DISCONNECT: u16 = 1 << 0;
/// PSD0 maximum power, 0.01 W units (25 W).
const PSD0_MAX_POWER: u16 = 2500;

/// Identify Controller (CNS 01h), 4096 bytes.
///
/// An I/O controller reports CNTRLTYPE 1, SQES 66h, CQES 44h, ONCS Dataset
/// Management and Write Zeroes, SGLs (with offsets and the transport data
/// block descriptor), the fabrics capsule sizes, MSDBD 1 and one power
/// state. A discovery controller reports CNTRLTYPE 2 and only the fields a
/// discovery controller fills (identity, MDTS, CNTLID, VER, discovery log
/// change notices, LPA, ELPE, KAS, MAXCMD, SGLS, SUBNQN, MSDBD).
pub fn identify_controller(c: &ControllerInfo) -> Vec<u8> {
    use ctrl_off as o;
    let io = c.kind == ControllerKind::Io;
    let mut b = vec![0u8; IDENTIFY_LEN];
    put_u16(&mut b, o::VID, c.vid);
    put_u16(&mut b, o::SSVID, c.ssvid);
    put_ascii(&mut b, o::SN, 20, c.serial);
    put_ascii(&mut b, o::MN, 40, c.model);
    put_ascii(&mut b, o::FR, 8, c.firmware);
    b[o::RAB] = 0; // One command per arbitration burst.
    b[o::IEEE..o::IEEE + 3].copy_from_slice(&c.ieee_oui);
    b[o::MDTS] = c.mdts;
    put_u16(&mut b, o::CNTLID, c.cntlid);
    put_u32(&mut b, o::VER, c.version);
    // RTD3R, RTD3E: not reported.
    b[o::CNTRLTYPE] = if io { 1 } else { 2 };
    b[o::AERL] = c.aerl;
    b[o::LPA] = LPA_EXTENDED | if io { LPA_CMD_EFFECTS } else { 0 };
    b[o::ELPE] = (ERROR_LOG_ENTRIES - 1) as u8;
    b[o::NPSS] = 0; // One power state (0-based).
    put_u16(&mut b, o::KAS, c.kas);
    put_u16(&mut b, o::MAXCMD, c.maxcmd);
    put_u32(
        &mut b,
        o::SGLS,
        SGLS_SUPPORTED | SGLS_OFFSET | SGLS_TRANSPORT,
    );
    put_nul(&mut b, o::SUBNQN, 256, c.subnqn);
    b[o::MSDBD] = 1;
    // ICDOFF 0 (in-capsule data right after the SQE), FCATT 0 (dynamic
    // controller model).
    put_u16(&mut b, o::ICDOFF, 0);
    b[o::FCATT] = 0;
    if !io {
        put_u32(&mut b, o::OAES, OAES_DISCOVERY_CHANGE);
        return b;
    }
    b[o::CMIC] = CMIC_MULTI_CTRL;
    if c.namespace_mgmt_events {
        put_u32(&mut b, o::OAES, OAES_NS_ATTR);
    }
    put_u32(&mut b, o::CTRATT, CTRATT_HOST_ID_128);
    put_u16(&mut b, o::OACS, 0); // No optional admin commands.
    b[o::ACL] = 3; // Four concurrent Aborts (0-based).
    b[o::FRMW] = FRMW_SLOT1_RO_ONE_SLOT;
    put_u16(&mut b, o::WCTEMP, WCTEMP_KELVIN);
    put_u16(&mut b, o::CCTEMP, CCTEMP_KELVIN);
    b[o::SQES] = 0x66; // Required and maximum: 64 bytes.
    b[o::CQES] = 0x44; // Required and maximum: 16 bytes.
    put_u32(&mut b, o::NN, c.max_namespaces);
    put_u16(&mut b, o::ONCS, ONCS_DSM | ONCS_WRITE_ZEROES);
    b[o::VWC] = VWC_NO_BROADCAST_FLUSH
        | if c.volatile_write_cache {
            VWC_PRESENT
        } else {
            0
        };
    put_u32(&mut b, o::IOCCSZ, c.ioccsz);
    put_u32(&mut b, o::IORCSZ, c.iorcsz);
    put_u16(&mut b, o::OFCS, OFCS_DISCONNECT);
    // Power state 0: maximum power (MXPS 0: 0.01 W units), operational,
    // entry and exit latencies and relative performance not reported.
    put_u16(&mut b, o::PSD0, PSD0_MAX_POWER);
    b
}

/// What Identify Namespace reports.
#[derive(Debug, Clone)]
pub struct NamespaceInfo {
    /// Size in logical blocks (NSZE = NCAP = NUSE).
    pub blocks: u64,
    /// log2 of the logical block size (LBADS of LBA format 0): 9 or 12.
    pub lba_shift: u8,
    /// Namespace globally unique identifier (NGUID; zeros: not reported).
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier (EUI64), if any.
    pub eui64: Option<[u8; 8]>,
    /// May be attached to several controllers (NMIC bit 0).
    pub shared: bool,
    /// Deallocated blocks read as zeros (DLFEAT 001b, and the Deallocate bit
    /// of Write Zeroes is supported).
    pub deallocate_reads_zero: bool,
    /// Writes may sit in a volatile cache. Not part of this structure (VWC
    /// is a controller field); kept for callers that build both.
    pub volatile_write_cache: bool,
    /// Optimal I/O boundary (NOIOB), in logical blocks.
    pub optimal_io_blocks: Option<u16>,
}

/// Identify Namespace field offsets (NVM Command Set, Identify Namespace).
mod ns_off {
    pub const NSZE: usize = 0;
    pub const NCAP: usize = 8;
    pub const NUSE: usize = 16;
    pub const NSFEAT: usize = 24;
    pub const NLBAF: usize = 25;
    pub const FLBAS: usize = 26;
    pub const NMIC: usize = 30;
    pub const DLFEAT: usize = 33;
    pub const NOIOB: usize = 46;
    pub const NVMCAP: usize = 48;
    pub const NGUID: usize = 104;
    pub const EUI64: usize = 120;
    pub const LBAF0: usize = 128;
}

/// DLFEAT bits 2:0 = 001b: deallocated blocks read as zeros.
const DLFEAT_READ_ZEROES: u8 = 0b001;
/// DLFEAT bit 3: the Deallocate bit of Write Zeroes is supported.
const DLFEAT_WRITE_ZEROES_DEALLOCATE: u8 = 1 << 3;

/// Identify Namespace (CNS 00h) of an active namespace, 4096 bytes: NSZE,
/// NCAP and NUSE, one LBA format (NLBAF 0, FLBAS 0) without metadata,
/// NMIC, DLFEAT, NOIOB, NVMCAP, NGUID and EUI64. Thin provisioning (NSFEAT
/// bit 0) is not claimed: the capacity is always the whole size.
pub fn identify_namespace(n: &NamespaceInfo) -> Vec<u8> {
    use ns_off as o;
    let mut b = vec![0u8; IDENTIFY_LEN];
    put_u64(&mut b, o::NSZE, n.blocks);
    put_u64(&mut b, o::NCAP, n.blocks);
    put_u64(&mut b, o::NUSE, n.blocks);
    b[o::NSFEAT] = 0;
    b[o::NLBAF] = 0; // One LBA format (0-based).
    b[o::FLBAS] = 0; // Format 0, no extended metadata.
    b[o::NMIC] = u8::from(n.shared);
    if n.deallocate_reads_zero {
        b[o::DLFEAT] = DLFEAT_READ_ZEROES | DLFEAT_WRITE_ZEROES_DEALLOCATE;
    }
    if let Some(noiob) = n.optimal_io_blocks {
        put_u16(&mut b, o::NOIOB, noiob);
    }
    let bytes = u128::from(n.blocks) << u32::from(n.lba_shift.min(63));
    put_u128(&mut b, o::NVMCAP, bytes);
    b[o::NGUID..o::NGUID + 16].copy_from_slice(&n.nguid);
    if let Some(e) = n.eui64 {
        b[o::EUI64..o::EUI64 + 8].copy_from_slice(&e);
    }
    // LBAF0: MS (15:0) 0, LBADS (23:16), RP (25:24) 00b best performance.
    put_u32(&mut b, o::LBAF0, u32::from(n.lba_shift) << 16);
    b
}

/// Identify Namespace of an allocated but inactive NSID (valid, below NN):
/// 4096 zero bytes.
pub fn identify_inactive_namespace() -> Vec<u8> {
    vec![0u8; IDENTIFY_LEN]
}

/// Active Namespace ID list (CNS 02h): the first 1024 active NSIDs greater
/// than `after`, ascending and without duplicates, zero filled; 4096 bytes.
pub fn active_namespace_list(nsids: impl IntoIterator<Item = u32>, after: u32) -> Vec<u8> {
    let mut ids: Vec<u32> = nsids.into_iter().filter(|&n| n > after).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, n) in ids.into_iter().take(IDENTIFY_LEN / 4).enumerate() {
        put_u32(&mut b, i * 4, n);
    }
    b
}

/// Namespace Identifier Type: IEEE EUI-64 (8 bytes).
pub const NIDT_EUI64: u8 = 1;
/// Namespace Identifier Type: NGUID (16 bytes).
pub const NIDT_NGUID: u8 = 2;
/// Namespace Identifier Type: UUID (16 bytes).
pub const NIDT_UUID: u8 = 3;

/// Namespace Identification Descriptor list (CNS 03h), 4096 bytes: an
/// EUI-64 descriptor (if any), then NGUID, then UUID; each is NIDT (byte 0),
/// NIDL (byte 1), two reserved bytes and the identifier. An all-zero
/// identifier means "none" and gets no descriptor; a zero NIDT ends the list.
pub fn namespace_descriptors(eui64: Option<[u8; 8]>, nguid: [u8; 16], uuid: [u8; 16]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    let mut put = |nidt: u8, id: &[u8]| {
        if id.iter().all(|&x| x == 0) {
            return;
        }
        b[at] = nidt;
        b[at + 1] = id.len() as u8;
        b[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    };
    if let Some(e) = eui64 {
        put(NIDT_EUI64, &e);
    }
    put(NIDT_NGUID, &nguid);
    put(NIDT_UUID, &uuid);
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

/// Transport type of NVMe/TCP (TRTYPE, in the error log and discovery log).
pub const TRTYPE_TCP: u8 = 3;

/// One Error Information log entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorEntry {
    /// Error count: unique and increasing; 0 marks an unused entry.
    pub error_count: u64,
    /// Submission queue ID.
    pub sqid: u16,
    /// Command ID.
    pub cid: u16,
    /// Status field, laid out as the upper half of CQE dword 3 (status in
    /// bits 15:1, phase tag bit 0 clear).
    pub status: u16,
    /// Parameter error location: byte in bits 7:0, bit in bits 10:8;
    /// 0xFFFF when not specific to a parameter.
    pub param_location: u16,
    /// First LBA that failed, if applicable.
    pub lba: u64,
    /// Namespace the error is about, if applicable.
    pub nsid: u32,
}

/// Size of one Error Information log entry.
pub const ERROR_ENTRY_LEN: usize = 64;

/// Error Information log (01h): 64 bytes per entry, `entries` given newest
/// first and written in that order, zero padded to `slots` entries
/// (ELPE + 1); entries past `slots` are dropped.
pub fn error_log(entries: &[ErrorEntry], slots: usize) -> Vec<u8> {
    let mut b = vec![0u8; ERROR_ENTRY_LEN * slots];
    for (i, e) in entries.iter().take(slots).enumerate() {
        let at = i * ERROR_ENTRY_LEN;
        put_u64(&mut b, at, e.error_count);
        put_u16(&mut b, at + 8, e.sqid);
        put_u16(&mut b, at + 10, e.cid);
        put_u16(&mut b, at + 12, e.status);
        put_u16(&mut b, at + 14, e.param_location);
        put_u64(&mut b, at + 16, e.lba);
        put_u32(&mut b, at + 24, e.nsid);
        // Byte 28: no vendor specific log page.
        b[at + 29] = TRTYPE_TCP;
        // Bytes 39:32 command specific, 41:40 transport specific: none.
    }
    b
}

/// What the SMART / Health Information log reports.
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
    /// Data units read: thousands of 512-byte units, rounded up.
    pub data_units_read: u128,
    /// Data units written: thousands of 512-byte units, rounded up.
    pub data_units_written: u128,
    /// Host read commands completed.
    pub host_read_commands: u128,
    /// Host write commands completed.
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
    /// Error information log entries over the controller's life.
    pub error_log_entries: u128,
}

/// Size of the SMART / Health Information and Firmware Slot logs.
pub const SMALL_LOG_LEN: usize = 512;

/// SMART / Health Information (02h), 512 bytes.
pub fn smart_log(s: &SmartInfo) -> Vec<u8> {
    let mut b = vec![0u8; SMALL_LOG_LEN];
    b[0] = s.critical_warning;
    put_u16(&mut b, 1, s.temperature_kelvin);
    b[3] = s.available_spare;
    b[4] = s.spare_threshold;
    b[5] = s.percentage_used;
    // Byte 6: endurance group critical warning summary, none.
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
    // Bytes 195:192 and 199:196 (time above the warning and critical
    // thresholds) and the temperature sensors from 200: not reported.
    b
}

/// Firmware Slot Information (03h), 512 bytes: AFI slot 1 active (no
/// firmware pending for the next reset), FRS1 = `firmware`.
pub fn firmware_slot_log(firmware: &str) -> Vec<u8> {
    let mut b = vec![0u8; SMALL_LOG_LEN];
    b[0] = 1; // AFI: bits 2:0 active slot 1, bits 6:4 next slot 0.
    put_ascii(&mut b, 8, 8, firmware); // FRS1 (FRS2..FRS7 at 16..64).
    b
}

/// Changed Namespace List (04h), 4096 bytes: up to 1024 NSIDs in the given
/// order, zero filled; more than 1024 changes are reported as a single
/// FFFFFFFFh entry followed by zeros.
pub fn changed_namespace_list(nsids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    if nsids.len() > IDENTIFY_LEN / 4 {
        put_u32(&mut b, 0, u32::MAX);
    } else {
        for (i, n) in nsids.iter().enumerate() {
            put_u32(&mut b, i * 4, *n);
        }
    }
    b
}

/// Commands Supported and Effects: command supported (CSUPP).
const EFFECT_CSUPP: u32 = 1 << 0;
/// Commands Supported and Effects: logical block content change (LBCC).
const EFFECT_LBCC: u32 = 1 << 1;

/// Commands Supported and Effects (05h), 4096 bytes: admin command entries
/// (ACS, 4 bytes per opcode from byte 0) and I/O command entries (IOCS,
/// from byte 1024). Every opcode in `admin` and `io` is marked supported;
/// those in `io_writes` (supported too) also change logical block content.
pub fn command_effects_log(admin: &[u8], io: &[u8], io_writes: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    for &op in admin {
        put_u32(&mut b, usize::from(op) * 4, EFFECT_CSUPP);
    }
    for &op in io {
        put_u32(&mut b, 1024 + usize::from(op) * 4, EFFECT_CSUPP);
    }
    for &op in io_writes {
        put_u32(
            &mut b,
            1024 + usize::from(op) * 4,
            EFFECT_CSUPP | EFFECT_LBCC,
        );
    }
    b
}

/// Address family of a discovery log entry (ADRFAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// IPv4 (1).
    Ipv4,
    /// IPv6 (2).
    Ipv6,
}

/// Subsystem type of a discovery log entry (SUBTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoverySubtype {
    /// A referral to another discovery subsystem (1).
    Referral,
    /// An NVM subsystem (2).
    Nvme,
    /// The discovery subsystem being queried (3).
    CurrentDiscovery,
}

/// One discovery log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Subsystem type.
    pub subtype: DiscoverySubtype,
    /// Port ID.
    pub port_id: u16,
    /// Controller ID (0xFFFF: dynamic controller model).
    pub cntlid: u16,
    /// Admin maximum submission queue size (ASQSZ).
    pub asqsz: u16,
    /// Address family.
    pub family: AddressFamily,
    /// Transport address (TRADDR): the IP address in text form.
    pub traddr: String,
    /// Transport service ID (TRSVCID): the TCP port in decimal.
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Duplicate returned information (EFLAGS bit 0).
    pub duplicate_returned_info: bool,
    /// Explicit persistent connection support for discovery (EFLAGS bit 1).
    pub explicit_persistent_connection: bool,
    /// Whether the port speaks TLS: TREQ says whether a secure channel is
    /// required, TSAS's SECTYPE names TLS 1.3.
    pub secure_channel: crate::target::SecureChannel,
}

/// Size of the discovery log header and of each discovery log entry.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

/// TREQ bits 1:0 = 10b: a secure channel is not required.
const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 0b10;
/// TREQ bits 1:0 = 01b: a secure channel is required.
const TREQ_SECURE_CHANNEL_REQUIRED: u8 = 0b01;
/// TSAS SECTYPE of NVMe/TCP: TLS 1.3.
const TCP_SECTYPE_TLS13: u8 = 2;

/// Discovery log page (70h): a 1024-byte header (GENCTR at 0, NUMREC at 8,
/// RECFMT 0 at 16), then one 1024-byte entry per record: TRTYPE TCP,
/// ADRFAM, SUBTYPE, TREQ (a secure channel required or not), PORTID,
/// CNTLID, ASQSZ, EFLAGS, TRSVCID at 32, SUBNQN at 256, TRADDR at 512 and
/// TSAS at 768 (TCP SECTYPE: 0 no security, 2 TLS 1.3).
pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; DISCOVERY_RECORD_LEN * (1 + entries.len())];
    put_u64(&mut b, 0, genctr);
    put_u64(&mut b, 8, entries.len() as u64);
    put_u16(&mut b, 16, 0); // RECFMT
    for (i, e) in entries.iter().enumerate() {
        let at = DISCOVERY_RECORD_LEN * (i + 1);
        b[at] = TRTYPE_TCP;
        b[at + 1] = match e.family {
            AddressFamily::Ipv4 => 1,
            AddressFamily::Ipv6 => 2,
        };
        b[at + 2] = match e.subtype {
            DiscoverySubtype::Referral => 1,
            DiscoverySubtype::Nvme => 2,
            DiscoverySubtype::CurrentDiscovery => 3,
        };
        b[at + 3] = match e.secure_channel {
            crate::target::SecureChannel::Required => TREQ_SECURE_CHANNEL_REQUIRED,
            _ => TREQ_SECURE_CHANNEL_NOT_REQUIRED,
        };
        put_u16(&mut b, at + 4, e.port_id);
        put_u16(&mut b, at + 6, e.cntlid);
        put_u16(&mut b, at + 8, e.asqsz);
        let eflags = u16::from(e.duplicate_returned_info)
            | (u16::from(e.explicit_persistent_connection) << 1);
        put_u16(&mut b, at + 10, eflags);
        put_ascii(&mut b, at + 32, 32, &e.trsvcid);
        put_nul(&mut b, at + 256, 256, &e.subnqn);
        put_nul(&mut b, at + 512, 256, &e.traddr);
        b[at + 768] = match e.secure_channel {
            crate::target::SecureChannel::None => 0,
            _ => TCP_SECTYPE_TLS13,
        };
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

/// Asynchronous event type: Notice.
pub const AEN_TYPE_NOTICE: u8 = 2;
/// Notice information: Namespace Attribute Changed.
pub const AEN_INFO_NS_ATTR_CHANGED: u8 = 0x00;
/// Notice information: Discovery Log Page Change.
pub const AEN_INFO_DISCOVERY_CHANGED: u8 = 0xf0;

/// Completion dword 0 of an Asynchronous Event Request: event type in bits
/// 2:0, event information in bits 15:8, the log page to read in 23:16.
pub const fn async_event_dw0(event_type: u8, info: u8, lid: u8) -> u32 {
    (event_type & 7) as u32 | (info as u32) << 8 | (lid as u32) << 16
}

/// A Namespace Attribute Changed notice (type 2 notice, information 00h,
/// Changed Namespace List log page).
pub const AEN_NS_ATTR_CHANGED: u32 =
    async_event_dw0(AEN_TYPE_NOTICE, AEN_INFO_NS_ATTR_CHANGED, LID_CHANGED_NS);

/// A Discovery Log Page Change notice (type 2 notice, information F0h,
/// discovery log page).
pub const AEN_DISCOVERY_CHANGED: u32 =
    async_event_dw0(AEN_TYPE_NOTICE, AEN_INFO_DISCOVERY_CHANGED, LID_DISCOVERY);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::SecureChannel;

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }
    fn u128_at(b: &[u8], at: usize) -> u128 {
        u128::from_le_bytes(b[at..at + 16].try_into().unwrap())
    }

    fn info(kind: ControllerKind) -> ControllerInfo<'static> {
        ControllerInfo {
            kind,
            vid: 0x1234,
            ssvid: 0x5678,
            serial: "SN42",
            model: "dpu model",
            firmware: "fw1.0",
            ieee_oui: [0xa1, 0xb2, 0xc3],
            cntlid: 0x0107,
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
        }
    }

    #[test]
    fn identify_controller_io_offsets() {
        let b = identify_controller(&info(ControllerKind::Io));
        assert_eq!(b.len(), 4096);
        assert_eq!(u16_at(&b, 0), 0x1234); // VID
        assert_eq!(u16_at(&b, 2), 0x5678); // SSVID
        assert_eq!(&b[4..24], b"SN42                "); // SN
        assert_eq!(&b[24..64], format!("{:<40}", "dpu model").as_bytes()); // MN
        assert_eq!(&b[64..72], b"fw1.0   "); // FR
        assert_eq!(b[72], 0); // RAB
        assert_eq!(&b[73..76], &[0xa1, 0xb2, 0xc3]); // IEEE
        assert_eq!(b[76], 0x02); // CMIC: multiple controllers
        assert_eq!(b[77], 7); // MDTS
        assert_eq!(u16_at(&b, 78), 0x0107); // CNTLID
        assert_eq!(u32_at(&b, 80), 0x0001_0300); // VER
        assert_eq!(u32_at(&b, 84), 0); // RTD3R
        assert_eq!(u32_at(&b, 88), 0); // RTD3E
        assert_eq!(u32_at(&b, 92), 1 << 8); // OAES: namespace attribute
        assert_eq!(u32_at(&b, 96), 1); // CTRATT: 128-bit host ID
        assert_eq!(b[111], 1); // CNTRLTYPE: I/O
        assert_eq!(u16_at(&b, 256), 0); // OACS
        assert_eq!(b[258], 3); // ACL
        assert_eq!(b[259], 3); // AERL
        assert_eq!(b[260], 0x03); // FRMW: one slot, slot 1 read only
        assert_eq!(b[261], 0x06); // LPA: effects log, extended data
        assert_eq!(b[262], 63); // ELPE
        assert_eq!(b[263], 0); // NPSS
        assert_eq!(u16_at(&b, 266), 343); // WCTEMP
        assert_eq!(u16_at(&b, 268), 358); // CCTEMP
        assert_eq!(u16_at(&b, 320), 1); // KAS
        assert_eq!((b[512], b[513]), (0x66, 0x44)); // SQES, CQES
        assert_eq!(u16_at(&b, 514), 1024); // MAXCMD
        assert_eq!(u32_at(&b, 516), 32); // NN
        assert_eq!(u16_at(&b, 520), 0x0c); // ONCS: DSM, Write Zeroes
        assert_eq!(u16_at(&b, 522), 0); // FUSES
        assert_eq!(b[524], 0); // FNA
        assert_eq!(b[525], 0x05); // VWC: present, no broadcast flush
        assert_eq!(u32_at(&b, 536), 1 | 1 << 20 | 1 << 21); // SGLS
        assert_eq!(&b[768..792], b"nqn.2024-01.io.example:a"); // SUBNQN
        assert!(b[792..1024].iter().all(|&x| x == 0));
        assert_eq!(u32_at(&b, 1792), 516); // IOCCSZ
        assert_eq!(u32_at(&b, 1796), 1); // IORCSZ
        assert_eq!(u16_at(&b, 1800), 0); // ICDOFF
        assert_eq!(b[1802], 0); // FCATT: dynamic model
        assert_eq!(b[1803], 1); // MSDBD
        assert_eq!(u16_at(&b, 1804), 1); // OFCS: Disconnect
        assert_eq!(u16_at(&b, 2048), 2500); // PSD0 MP
        assert_eq!(b[2051], 0); // PSD0 MXPS, NOPS
        assert!(b[2080..].iter().all(|&x| x == 0)); // PSD1.. and vendor

        // Reserved ranges stay zero.
        for r in [
            100..111,
            112..256,
            384..512,
            564..768,
            1024..1792,
            1806..2048,
        ] {
            assert!(b[r.clone()].iter().all(|&x| x == 0), "{r:?}");
        }
    }

    #[test]
    fn identify_controller_io_options() {
        let mut i = info(ControllerKind::Io);
        i.volatile_write_cache = false;
        i.namespace_mgmt_events = false;
        let b = identify_controller(&i);
        assert_eq!(b[525], 0x04);
        assert_eq!(u32_at(&b, 92), 0);
    }

    #[test]
    fn identify_controller_discovery() {
        let mut i = info(ControllerKind::Discovery);
        i.subnqn = "nqn.2014-08.org.nvmexpress.discovery";
        i.max_namespaces = 0;
        i.ioccsz = 0;
        i.iorcsz = 0;
        i.maxcmd = 32;
        i.namespace_mgmt_events = false;
        let b = identify_controller(&i);
        assert_eq!(b.len(), 4096);
        assert_eq!(b[111], 2); // CNTRLTYPE: discovery
        assert_eq!(u32_at(&b, 92), 1 << 31); // OAES: discovery log change
        assert_eq!(&b[64..72], b"fw1.0   ");
        assert_eq!(b[77], 7);
        assert_eq!(u16_at(&b, 78), 0x0107);
        assert_eq!(u32_at(&b, 80), 0x0001_0300);
        assert_eq!(b[259], 3); // AERL
        assert_eq!(b[261], 0x04); // LPA: extended data only
        assert_eq!(b[262], 63); // ELPE
        assert_eq!(u16_at(&b, 320), 1); // KAS
        assert_eq!(u16_at(&b, 514), 32); // MAXCMD
        assert_eq!(u32_at(&b, 536) & 3, 1); // SGLS supported
        assert_eq!(&b[768..804], b"nqn.2014-08.org.nvmexpress.discovery");
        assert_eq!(b[804], 0);
        assert_eq!(b[1803], 1); // MSDBD

        // I/O-only fields stay zero.
        assert_eq!(b[76], 0);
        assert_eq!(u32_at(&b, 96), 0);
        assert_eq!((b[258], b[260]), (0, 0));
        assert_eq!((b[512], b[513]), (0, 0));
        assert_eq!(u32_at(&b, 516), 0);
        assert_eq!((u16_at(&b, 520), b[525]), (0, 0));
        assert_eq!((u32_at(&b, 1792), u32_at(&b, 1796)), (0, 0));
        assert_eq!(u16_at(&b, 1804), 0);
        assert!(b[2048..].iter().all(|&x| x == 0));
    }

    #[test]
    fn strings_are_padded_and_truncated() {
        let mut i = info(ControllerKind::Io);
        let long_sn = "0123456789abcdefghijXYZ";
        let nqn = format!("nqn.2024-01.io.example:x{}", "é".repeat(200));
        i.serial = long_sn;
        i.firmware = "fw\u{7f}x";
        i.subnqn = &nqn;
        let b = identify_controller(&i);
        assert_eq!(&b[4..24], b"0123456789abcdefghij");
        assert_eq!(&b[64..72], b"fw?x    ");
        // 255 bytes at most, cut on a character boundary, NUL terminated.
        let f = &b[768..1024];
        let len = f.iter().position(|&x| x == 0).unwrap();
        assert!(len <= 255);
        assert!(std::str::from_utf8(&f[..len]).is_ok());
        assert!(nqn.as_bytes().starts_with(&f[..len]));
        assert_eq!(len, 254); // 24 ASCII bytes + 115 two-byte characters.
    }

    fn ns() -> NamespaceInfo {
        NamespaceInfo {
            blocks: 0x1_0000_0800,
            lba_shift: 12,
            nguid: [9; 16],
            eui64: Some([7; 8]),
            shared: true,
            deallocate_reads_zero: true,
            volatile_write_cache: false,
            optimal_io_blocks: Some(64),
        }
    }

    #[test]
    fn identify_namespace_offsets() {
        let b = identify_namespace(&ns());
        assert_eq!(b.len(), 4096);
        assert_eq!(u64_at(&b, 0), 0x1_0000_0800); // NSZE
        assert_eq!(u64_at(&b, 8), 0x1_0000_0800); // NCAP
        assert_eq!(u64_at(&b, 16), 0x1_0000_0800); // NUSE
        assert_eq!(b[24], 0); // NSFEAT
        assert_eq!(b[25], 0); // NLBAF
        assert_eq!(b[26], 0); // FLBAS
        assert_eq!((b[27], b[28], b[29]), (0, 0, 0)); // MC, DPC, DPS
        assert_eq!(b[30], 1); // NMIC: shared
        assert_eq!(b[31], 0); // RESCAP
        assert_eq!(b[33], 0x09); // DLFEAT: reads zeros, WZ deallocate
        assert_eq!(u16_at(&b, 46), 64); // NOIOB
        assert_eq!(u128_at(&b, 48), 0x1_0000_0800u128 << 12); // NVMCAP
        assert_eq!(u16_at(&b, 72), 0); // NOWS
        assert_eq!(u32_at(&b, 92), 0); // ANAGRPID
        assert_eq!(&b[104..120], &[9; 16]); // NGUID
        assert_eq!(&b[120..128], &[7; 8]); // EUI64
        assert_eq!(u32_at(&b, 128), 12 << 16); // LBAF0: LBADS 12
        assert_eq!(b[130], 12);
        assert!(b[132..].iter().all(|&x| x == 0));
    }

    #[test]
    fn identify_namespace_minimal() {
        let mut n = ns();
        n.lba_shift = 9;
        n.eui64 = None;
        n.shared = false;
        n.deallocate_reads_zero = false;
        n.optimal_io_blocks = None;
        let b = identify_namespace(&n);
        assert_eq!((b[30], b[33]), (0, 0));
        assert_eq!(u16_at(&b, 46), 0);
        assert_eq!(&b[120..128], &[0; 8]);
        assert_eq!(b[130], 9);
        assert_eq!(identify_inactive_namespace(), vec![0; 4096]);
    }

    #[test]
    fn active_namespace_list_order_and_after() {
        let b = active_namespace_list([5, 1, 3, 3], 1);
        assert_eq!(b.len(), 4096);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)), (3, 5, 0));
        let b = active_namespace_list([5, 1, 3], 0);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)), (1, 3, 5));
        assert!(active_namespace_list([5, 1, 3], 5).iter().all(|&x| x == 0));
        let b = active_namespace_list((1..=2000).rev(), 10);
        assert_eq!(u32_at(&b, 0), 11);
        assert_eq!(u32_at(&b, 4092), 1034);
    }

    #[test]
    fn namespace_descriptor_list() {
        let d = namespace_descriptors(Some([8; 8]), [1; 16], [2; 16]);
        assert_eq!(d.len(), 4096);
        assert_eq!(&d[0..4], &[1, 8, 0, 0]);
        assert_eq!(&d[4..12], &[8; 8]);
        assert_eq!(&d[12..16], &[2, 16, 0, 0]);
        assert_eq!(&d[16..32], &[1; 16]);
        assert_eq!(&d[32..36], &[3, 16, 0, 0]);
        assert_eq!(&d[36..52], &[2; 16]);
        assert!(d[52..].iter().all(|&x| x == 0));
        let d = namespace_descriptors(None, [1; 16], [2; 16]);
        assert_eq!(&d[0..4], &[2, 16, 0, 0]);
        assert_eq!(&d[20..24], &[3, 16, 0, 0]);
        assert_eq!(&d[24..40], &[2; 16]);
        // A zero NGUID is "not reported".
        let d = namespace_descriptors(None, [0; 16], [2; 16]);
        assert_eq!(&d[0..4], &[3, 16, 0, 0]);
        assert!(d[20..].iter().all(|&x| x == 0));
    }

    #[test]
    fn error_log_newest_first_and_padded() {
        let e = |n: u64| ErrorEntry {
            error_count: n,
            sqid: 1,
            cid: 9 + n as u16,
            status: 0x4004,
            param_location: 0xffff,
            lba: 77,
            nsid: 2,
        };
        let b = error_log(&[e(2), e(1)], 4);
        assert_eq!(b.len(), 256);
        assert_eq!(u64_at(&b, 0), 2); // Error Count
        assert_eq!(u16_at(&b, 8), 1); // SQID
        assert_eq!(u16_at(&b, 10), 11); // CMDID
        assert_eq!(u16_at(&b, 12), 0x4004); // Status Field
        assert_eq!(u16_at(&b, 14), 0xffff); // Parameter Error Location
        assert_eq!(u64_at(&b, 16), 77); // LBA
        assert_eq!(u32_at(&b, 24), 2); // Namespace
        assert_eq!(b[28], 0); // Vendor Specific Information Available
        assert_eq!(b[29], 3); // TRTYPE: TCP
        assert!(b[30..64].iter().all(|&x| x == 0));
        assert_eq!(u64_at(&b, 64), 1);
        assert_eq!(u16_at(&b, 74), 10);
        assert!(b[128..].iter().all(|&x| x == 0));
        let b = error_log(&[e(3), e(2), e(1)], 2);
        assert_eq!(b.len(), 128);
        assert_eq!((u64_at(&b, 0), u64_at(&b, 64)), (3, 2));
        assert_eq!(error_log(&[], 64), vec![0; 4096]);
    }

    #[test]
    fn smart_log_offsets() {
        let s = smart_log(&SmartInfo {
            critical_warning: 0x04,
            temperature_kelvin: 0x0139,
            available_spare: 100,
            spare_threshold: 10,
            percentage_used: 3,
            data_units_read: 1 | 1 << 64,
            data_units_written: 2,
            host_read_commands: 3,
            host_write_commands: 4,
            busy_time_minutes: 5,
            power_cycles: 6,
            power_on_hours: 7,
            unsafe_shutdowns: 8,
            media_errors: 9,
            error_log_entries: 10 | 1 << 120,
        });
        assert_eq!(s.len(), 512);
        assert_eq!(s[0], 0x04);
        assert_eq!(&s[1..3], &[0x39, 0x01]);
        assert_eq!((s[3], s[4], s[5]), (100, 10, 3));
        assert!(s[6..32].iter().all(|&x| x == 0));
        assert_eq!(u128_at(&s, 32), 1 | 1 << 64);
        assert_eq!(s[40], 1); // Upper 64 bits of the 128-bit counter.
        for (at, v) in [(48, 2), (64, 3), (80, 4), (96, 5)] {
            assert_eq!(u128_at(&s, at), v, "offset {at}");
        }
        for (at, v) in [(112, 6), (128, 7), (144, 8), (160, 9)] {
            assert_eq!(u128_at(&s, at), v, "offset {at}");
        }
        assert_eq!(u128_at(&s, 176), 10 | 1 << 120);
        assert!(s[192..].iter().all(|&x| x == 0));
    }

    #[test]
    fn firmware_slot() {
        let f = firmware_slot_log("dpu0.1");
        assert_eq!(f.len(), 512);
        assert_eq!(f[0], 1);
        assert!(f[1..8].iter().all(|&x| x == 0));
        assert_eq!(&f[8..16], b"dpu0.1  ");
        assert!(f[16..].iter().all(|&x| x == 0));
    }

    #[test]
    fn changed_namespaces() {
        let b = changed_namespace_list(&[4, 2]);
        assert_eq!(b.len(), 4096);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4), u32_at(&b, 8)), (4, 2, 0));
        let full: Vec<u32> = (1..=1024).collect();
        let b = changed_namespace_list(&full);
        assert_eq!((u32_at(&b, 0), u32_at(&b, 4092)), (1, 1024));
        let many: Vec<u32> = (1..=1025).collect();
        let b = changed_namespace_list(&many);
        assert_eq!(u32_at(&b, 0), 0xffff_ffff);
        assert!(b[4..].iter().all(|&x| x == 0));
    }

    #[test]
    fn command_effects() {
        let b = command_effects_log(&[0x02, 0x06, 0x18], &[0x00, 0x01, 0x02], &[0x01, 0x08]);
        assert_eq!(b.len(), 4096);
        assert_eq!(u32_at(&b, 0x02 * 4), 1);
        assert_eq!(u32_at(&b, 0x06 * 4), 1);
        assert_eq!(u32_at(&b, 0x18 * 4), 1);
        assert_eq!(u32_at(&b, 4), 0); // Admin opcode 01h
        assert_eq!(u32_at(&b, 1024), 1); // Flush
        assert_eq!(u32_at(&b, 1024 + 4), 3); // Write: CSUPP | LBCC
        assert_eq!(u32_at(&b, 1024 + 8), 1); // Read
        assert_eq!(u32_at(&b, 1024 + 0x08 * 4), 3); // Write Zeroes
        assert_eq!(u32_at(&b, 1024 + 0x09 * 4), 0);
        assert!(b[2048..].iter().all(|&x| x == 0));
    }

    #[test]
    fn discovery_log_says_which_ports_speak_tls() {
        let entry = |c| DiscoveryEntry {
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
            secure_channel: c,
        };
        let d = discovery_log(
            1,
            &[
                entry(SecureChannel::None),
                entry(SecureChannel::Allowed),
                entry(SecureChannel::Required),
            ],
        );
        // (TREQ, TSAS SECTYPE) of each entry.
        let got: Vec<(u8, u8)> = (1..4)
            .map(|i| (d[1024 * i + 3], d[1024 * i + 768]))
            .collect();
        assert_eq!(got, [(0b10, 0), (0b10, 2), (0b01, 2)]);
    }

    #[test]
    fn discovery_log_offsets() {
        let entry = |i: u16| DiscoveryEntry {
            subtype: if i == 0 {
                DiscoverySubtype::Nvme
            } else {
                DiscoverySubtype::CurrentDiscovery
            },
            port_id: 1 + i,
            cntlid: 0xffff,
            asqsz: 32,
            family: if i == 0 {
                AddressFamily::Ipv4
            } else {
                AddressFamily::Ipv6
            },
            traddr: if i == 0 { "10.0.0.1" } else { "fd00::1" }.into(),
            trsvcid: if i == 0 { "4420" } else { "8009" }.into(),
            subnqn: "nqn.x".into(),
            duplicate_returned_info: i == 1,
            explicit_persistent_connection: i == 1,
            secure_channel: SecureChannel::None,
        };
        let d = discovery_log(0x1_0000_0004, &[entry(0), entry(1)]);
        assert_eq!(d.len(), 3072);
        assert_eq!(u64_at(&d, 0), 0x1_0000_0004); // GENCTR
        assert_eq!(u64_at(&d, 8), 2); // NUMREC
        assert_eq!(u16_at(&d, 16), 0); // RECFMT
        assert!(d[18..1024].iter().all(|&x| x == 0));
        let e = &d[1024..2048];
        assert_eq!((e[0], e[1], e[2], e[3]), (3, 1, 2, 0x02)); // TRTYPE..TREQ
        assert_eq!(u16_at(e, 4), 1); // PORTID
        assert_eq!(u16_at(e, 6), 0xffff); // CNTLID
        assert_eq!(u16_at(e, 8), 32); // ASQSZ
        assert_eq!(u16_at(e, 10), 0); // EFLAGS
        assert!(e[12..32].iter().all(|&x| x == 0));
        assert_eq!(&e[32..64], format!("{:<32}", "4420").as_bytes()); // TRSVCID
        assert!(e[64..256].iter().all(|&x| x == 0));
        assert_eq!(&e[256..261], b"nqn.x"); // SUBNQN
        assert!(e[261..512].iter().all(|&x| x == 0));
        assert_eq!(&e[512..520], b"10.0.0.1"); // TRADDR
        assert!(e[520..].iter().all(|&x| x == 0)); // NUL padding, TSAS
        let e = &d[2048..3072];
        assert_eq!((e[0], e[1], e[2]), (3, 2, 3));
        assert_eq!(u16_at(e, 4), 2);
        assert_eq!(u16_at(e, 10), 3); // EFLAGS: DUPRETINFO, EPCSC
        assert_eq!(&e[32..36], b"8009");
        assert_eq!(&e[512..520], b"fd00::1\0");
        assert_eq!(discovery_log(7, &[]).len(), 1024);
    }

    #[test]
    fn async_events() {
        assert_eq!(AEN_NS_ATTR_CHANGED, 0x0004_0002);
        assert_eq!(async_event_dw0(2, 0, LID_CHANGED_NS), AEN_NS_ATTR_CHANGED);
        assert_eq!(AEN_DISCOVERY_CHANGED, 0x0070_f002);
        assert_eq!(async_event_dw0(0xff, 0x12, 0x34), 0x0034_1207);
    }
}

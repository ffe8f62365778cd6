//! Fuzzes the host side of NVMe/TCP against a hostile controller: what
//! the service's initiator (remote namespaces, `nvmf-perf`) reads from a
//! remote target. A [`QueuePair`] with reads, writes (in the capsule and
//! through R2T), a discarded read and a command without data in flight
//! takes the input as the controller's bytes, in pieces whose sizes the
//! input also chooses, and is polled after each. It must never panic;
//! every completion must name a command in flight and bring no more data
//! than the command asked for; what it queues to send stays within the
//! writes' data and their PDU headers; after an error the queue is
//! dropped, as its callers do. The tail of the input is also read as
//! Identify Namespace data. Run with `fuzz/run.sh host` from the
//! repository root.

use std::sync::Arc;

use dpu_nvmeof::host::{self, NamespaceSize, QueueOptions, QueuePair, Transfer};
use dpu_nvmeof::pdu::{self, Digests, IcResp};

/// Entries of the queue: CIDs 0..8, at most 7 in flight.
const ENTRIES: u16 = 8;
/// Largest PDU data the queue accepts.
const MAX_DATA: u32 = 64 << 10;

/// The commands kept in flight, by CID: what each transfers.
fn transfer(cid: u16) -> Transfer {
    match cid % 6 {
        0 => Transfer::Read(vec![0; 4096]),
        1 => Transfer::Write(vec![0x5a; 16 << 10]),
        2 => Transfer::Discard(512),
        3 => Transfer::None,
        4 => Transfer::WriteShared(Arc::from(vec![0xa5u8; 8192])),
        _ => Transfer::Write(vec![7; 512]),
    }
}

/// Bytes of data command `cid` moves.
fn length(cid: u16) -> usize {
    match cid % 6 {
        0 => 4096,
        1 => 16 << 10,
        2 => 512,
        3 => 0,
        4 => 8192,
        _ => 512,
    }
}

/// Fuzzer entry point.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    let mut q = QueuePair::new(&QueueOptions {
        digests,
        max_data: MAX_DATA,
        entries: ENTRIES,
        timeout: None,
    });
    // Bit 2: the controller's ICResp is made right, so the input goes
    // straight to the commands; otherwise the input must make it.
    if mode & 4 != 0 {
        let mut b = Vec::new();
        pdu::encode_ic_resp(
            &mut b,
            &IcResp {
                pfv: 0,
                cpda: 0,
                digests,
                maxh2cdata: 4096 << (mode >> 5 & 3),
            },
        );
        assert_eq!(fill(&mut q, &b), b.len());
        if !matches!(q.poll_completion(), Ok(None)) || !q.is_ready() {
            panic!("a valid ICResp was not taken");
        }
    }
    // Bit 3: writes go in the capsule up to 8 KiB; else all through R2T.
    if mode & 8 == 0 {
        q.set_in_capsule(0);
    }
    let mut in_flight = [false; ENTRIES as usize];
    let mut rest = rest;
    while let Some((&n, tail)) = rest.split_first() {
        refill(&mut q, &mut in_flight);
        // One byte: how much of the input comes next (1..=256 bytes, or
        // 4 KiB at once for 0).
        let take = if n == 0 { 4096 } else { usize::from(n) };
        let (mut piece, tail) = tail.split_at(take.min(tail.len()));
        rest = tail;
        while !piece.is_empty() {
            let n = fill(&mut q, piece);
            piece = &piece[n..];
            if drain(&mut q, &mut in_flight).is_err() {
                // Fatal for the queue: its callers drop it.
                return identify(rest);
            }
            if n == 0 {
                // A partial PDU fills the buffer: the decoder refuses
                // such a PDU from its header, so this is not reached.
                panic!("the receive buffer is full and nothing decodes");
            }
        }
        // What waits to be sent is the commands' capsules and the data the
        // controller asked for, never more.
        let bound = usize::from(ENTRIES) * (128 + (16 << 10) + 2 * 4096);
        assert!(
            q.output().len() <= bound,
            "{} bytes queued",
            q.output().len()
        );
        let n = q.output().len();
        q.sent(n);
    }
    identify(rest);
}

/// Takes every completion the queue has, checking each against what is
/// in flight; `Err` when the queue failed.
fn drain(q: &mut QueuePair, in_flight: &mut [bool]) -> Result<(), ()> {
    loop {
        match q.poll_completion() {
            Ok(Some(c)) => {
                let cid = c.cid();
                let slot = in_flight
                    .get_mut(usize::from(cid))
                    .unwrap_or_else(|| panic!("completion of CID {cid}, past the queue"));
                assert!(*slot, "completion of CID {cid}, not in flight");
                *slot = false;
                assert!(
                    c.data.len() <= length(cid),
                    "{} bytes for a command of {}",
                    c.data.len(),
                    length(cid)
                );
            }
            Ok(None) => return Ok(()),
            Err(_) => return Err(()),
        }
    }
}

/// Keeps every free CID's command in flight (once the queue is ready).
fn refill(q: &mut QueuePair, in_flight: &mut [bool]) {
    while let Some(cid) = q.free_cid() {
        let sqe = match cid % 6 {
            0 | 2 => host::read(1, u64::from(cid), 7),
            3 => host::keep_alive(),
            _ => host::write(1, u64::from(cid), 7),
        };
        if q.submit(cid, sqe, transfer(cid)).is_err() {
            return;
        }
        in_flight[usize::from(cid)] = true;
    }
}

/// Copies what the queue's receive buffer takes of `bytes` into it, as
/// read from the controller; answers how many.
fn fill(q: &mut QueuePair, bytes: &[u8]) -> usize {
    let buf = q.receive_buffer();
    let n = buf.len().min(bytes.len());
    buf[..n].copy_from_slice(&bytes[..n]);
    q.received(n);
    n
}

/// Reads `data` as Identify Namespace data: an answer or an error, and a
/// block size the specification allows.
fn identify(data: &[u8]) {
    if let Ok(ns) = NamespaceSize::parse(data, 1) {
        assert!(ns.blocks > 0 && (512..=1 << 31).contains(&ns.block_size));
    }
}

//! The journal's record framing, and reading a journal back.
//!
//! A record is a 12-byte header and a payload:
//!
//! ```text
//! offset  size  field
//!      0     4  payload length, little-endian (at most MAX_RECORD)
//!      4     4  CRC-32C of the payload, little-endian
//!      8     4  CRC-32C of bytes 0..8, little-endian
//!     12     n  payload: JSON {"seq": N, "ops": [...]}
//! ```
//!
//! The header checks itself, so a length damaged in the middle of the
//! journal is never taken for a record cut short at its end. The store
//! appends a record and fsyncs it before it answers, and never appends
//! after a record it does not know to be whole, so only the last record
//! can be torn by a crash. [`read`] therefore ignores, as a torn tail:
//! a header cut short, a payload cut short, a last record whose payload
//! checksum fails, and zeros to the end of the file where a header should
//! be (what some filesystems show of an extension whose data never
//! landed). Anything else that does not check out is corruption, reported
//! with its offset, and stops the load.

use serde::{Deserialize, Serialize};

use super::change::Op;

/// Bytes of a record header.
pub(crate) const HEADER: usize = 12;
/// Largest payload a record may have; a change whose record would be
/// larger is written as a snapshot instead.
pub(crate) const MAX_RECORD: usize = 64 << 20;

/// A record's payload.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The change's sequence number: the snapshot's plus one for the first
    /// change after it, one more for each change after that.
    pub seq: u64,
    /// What the change did.
    pub ops: Vec<Op>,
}

/// Frames `entry` as one record.
///
/// # Errors
/// If the entry cannot be serialized or its payload would exceed
/// [`MAX_RECORD`] (the caller then writes a snapshot).
pub(crate) fn encode(entry: &Entry) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; HEADER];
    serde_json::to_writer(&mut out, entry).map_err(|e| e.to_string())?;
    let len = out.len() - HEADER;
    if len > MAX_RECORD {
        return Err(format!("record of {len} bytes, at most {MAX_RECORD}"));
    }
    let len = u32::try_from(len).map_err(|_| "record too large".to_string())?;
    let crc = crc32c::crc32c(&out[HEADER..]);
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32c::crc32c(&out[0..8]);
    out[8..12].copy_from_slice(&hcrc.to_le_bytes());
    Ok(out)
}

/// A journal as read back.
#[derive(Debug, Default)]
pub(crate) struct Read {
    /// Its whole records, in order.
    pub entries: Vec<Entry>,
    /// Where the last whole record ends: the journal's valid length.
    pub valid_len: u64,
    /// What was ignored after it as a torn tail, if anything.
    pub torn: Option<String>,
}

/// Reads the records of `bytes`.
///
/// # Errors
/// A description, with the offset, of a record that is damaged other than
/// by a torn write at the end.
pub(crate) fn read(bytes: &[u8]) -> Result<Read, String> {
    let mut out = Read::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let torn = |why: &str| Some(format!("{why} at offset {at} ({} bytes)", rest.len()));
        if rest.len() < HEADER {
            out.torn = torn("a header cut short");
            break;
        }
        let word = |i: usize| u32::from_le_bytes([rest[i], rest[i + 1], rest[i + 2], rest[i + 3]]);
        let (len, crc, hcrc) = (word(0), word(4), word(8));
        if crc32c::crc32c(&rest[0..8]) != hcrc {
            if rest.iter().all(|&b| b == 0) {
                out.torn = torn("zeros");
                break;
            }
            return Err(format!("record at offset {at}: header checksum mismatch"));
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > MAX_RECORD {
            return Err(format!(
                "record at offset {at}: length {len} exceeds {MAX_RECORD}"
            ));
        }
        let Some(payload) = rest.get(HEADER..HEADER + len) else {
            out.torn = torn("a record cut short");
            break;
        };
        let last = rest.len() == HEADER + len;
        if crc32c::crc32c(payload) != crc {
            if last {
                out.torn = torn("a last record with a bad checksum");
                break;
            }
            return Err(format!(
                "record at offset {at}: payload checksum mismatch ({} more bytes follow)",
                rest.len() - HEADER - len
            ));
        }
        let entry: Entry =
            serde_json::from_slice(payload).map_err(|e| format!("record at offset {at}: {e}"))?;
        out.entries.push(entry);
        at += HEADER + len;
        out.valid_len = at as u64;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64) -> Entry {
        Entry {
            seq,
            ops: vec![Op::IdSeq { value: seq * 7 }],
        }
    }

    fn journal(n: u64) -> Vec<u8> {
        (1..=n).flat_map(|s| encode(&entry(s)).unwrap()).collect()
    }

    #[test]
    fn records_round_trip() {
        let bytes = journal(3);
        let r = read(&bytes).unwrap();
        assert_eq!(r.entries.len(), 3);
        assert_eq!(r.entries[2].seq, 3);
        assert_eq!(r.entries[2].ops, vec![Op::IdSeq { value: 21 }]);
        assert_eq!(r.valid_len, bytes.len() as u64);
        assert!(r.torn.is_none());
        assert!(read(&[]).unwrap().entries.is_empty());
    }

    #[test]
    fn every_cut_of_the_last_record_is_a_torn_tail() {
        let two = journal(2);
        let three = journal(3);
        for cut in two.len()..three.len() {
            let r = read(&three[..cut]).unwrap();
            assert_eq!(r.entries.len(), 2, "cut at {cut}");
            assert_eq!(r.valid_len, two.len() as u64, "cut at {cut}");
            assert_eq!(r.torn.is_some(), cut > two.len(), "cut at {cut}");
        }
    }

    #[test]
    fn zeros_and_a_damaged_last_payload_are_torn_tails() {
        let mut bytes = journal(2);
        let good = bytes.len();
        bytes.extend_from_slice(&[0u8; 100]);
        let r = read(&bytes).unwrap();
        assert_eq!((r.entries.len(), r.valid_len), (2, good as u64));
        assert!(r.torn.unwrap().contains("zeros"));

        let mut bytes = journal(2);
        let last = bytes.len() - 2;
        bytes[last] ^= 0x40;
        let r = read(&bytes).unwrap();
        assert_eq!(r.entries.len(), 1);
        assert!(r.torn.unwrap().contains("bad checksum"));
    }

    #[test]
    fn damage_in_the_middle_is_an_error_not_a_tail() {
        let first = encode(&entry(1)).unwrap().len();
        // Payload of the first record.
        let mut bytes = journal(3);
        bytes[first - 3] ^= 1;
        let err = read(&bytes).unwrap_err();
        assert!(
            err.contains("offset 0") && err.contains("payload checksum"),
            "{err}"
        );
        // Length of the second record, made to point past the end.
        let mut bytes = journal(3);
        bytes[first + 3] = 0x7f;
        let err = read(&bytes).unwrap_err();
        assert!(
            err.contains(&format!("offset {first}")) && err.contains("header"),
            "{err}"
        );
        // Garbage after the last record that is not zeros.
        let mut bytes = journal(2);
        bytes.extend_from_slice(&[0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
        assert!(read(&bytes).unwrap_err().contains("header checksum"));
        // A whole record whose payload is not an entry.
        let mut bytes = journal(1);
        let mut bad = b"{\"seq\":\"x\"}".to_vec();
        let mut rec = vec![0u8; HEADER];
        rec[0..4].copy_from_slice(&(bad.len() as u32).to_le_bytes());
        rec[4..8].copy_from_slice(&crc32c::crc32c(&bad).to_le_bytes());
        let h = crc32c::crc32c(&rec[0..8]);
        rec[8..12].copy_from_slice(&h.to_le_bytes());
        rec.append(&mut bad);
        bytes.extend_from_slice(&rec);
        assert!(read(&bytes)
            .unwrap_err()
            .contains(&format!("offset {first}")));
    }
}

//! The conformance suite every backend runs (tests only): round trips,
//! range errors, zeroing, resizing, concurrent I/O, prefetch.

use std::io;

use super::{is_out_of_range, Backend, OutOfRange};

pub(super) const MIB: u64 = 1 << 20;

/// Waits up to 30 s for `f`, looking every few milliseconds; fails
/// naming `what`.
pub(super) fn eventually(what: &str, f: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Bytes that differ at every position and between seeds.
pub(super) fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .map(|b| b | 1)
        .collect()
}

pub(super) fn read(b: &dyn Backend, offset: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0xEEu8; n];
    b.read_at(offset, &mut v).expect("read");
    v
}

pub(super) fn is_zero(v: &[u8]) -> bool {
    v.iter().all(|&x| x == 0)
}

/// Round trips at unaligned offsets and lengths across segment
/// boundaries; never-written space reads zeros. Wants `len >= 4 MiB`.
pub(super) fn round_trip(b: &dyn Backend) {
    assert!(is_zero(&read(b, 0, 4 * MIB as usize)));
    let off = MIB - 1003;
    let data = pattern(1, 2 * MIB as usize + 777);
    b.write_at(off, &data, false).unwrap();
    assert_eq!(read(b, off, data.len()), data);
    // Sub-ranges at other odd offsets, and the zeros around.
    assert_eq!(read(b, off + 5, 4099), data[5..5 + 4099]);
    let around = read(b, off - 17, data.len() + 34);
    assert!(is_zero(&around[..17]) && is_zero(&around[17 + data.len()..]));
    assert_eq!(around[17..17 + data.len()], data);
    // Tiny writes, FUA, and an empty one.
    b.write_at(3, &[9, 8, 7], true).unwrap();
    b.write_at(4 * MIB - 1, &[5], false).unwrap();
    b.write_at(7, &[], false).unwrap();
    b.flush().unwrap();
    assert_eq!(read(b, 2, 5), [0, 9, 8, 7, 0]);
    assert_eq!(read(b, 4 * MIB - 2, 2), [0, 5]);
    let mut empty = [];
    b.read_at(b.len(), &mut empty).unwrap();
}

/// True when `r` failed with the backend's typed out-of-range error.
pub(super) fn oor(r: io::Result<()>) -> bool {
    r.as_ref().is_err_and(is_out_of_range)
}

/// Out-of-range I/O is an [`OutOfRange`] error, not a panic.
pub(super) fn out_of_range(b: &dyn Backend) {
    let len = b.len();
    let mut buf = [0u8; 20];
    assert!(oor(b.read_at(len - 10, &mut buf)));
    assert!(oor(b.read_at(len + 1, &mut buf[..0])));
    assert!(oor(b.read_at(u64::MAX - 5, &mut buf)));
    assert!(oor(b.write_at(len - 10, &buf, false)));
    assert!(oor(b.write_at(u64::MAX, &buf, true)));
    assert!(oor(b.write_zeroes(len - 10, 11)));
    assert!(oor(b.deallocate(len, 1)));
    assert!(oor(b.deallocate(1, u64::MAX)));
    let e = b.read_at(len - 10, &mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(
        e.get_ref().and_then(|i| i.downcast_ref::<OutOfRange>()),
        Some(&OutOfRange {
            offset: len - 10,
            len: 20,
            size: len
        })
    );
    // What was in range is untouched.
    assert!(is_zero(&read(b, len - 10, 10)));
}

/// write_zeroes and deallocate leave zeros, at odd bounds and whole
/// segments. Wants `len >= 4 MiB`.
pub(super) fn zeroing(b: &dyn Backend) {
    let data = pattern(2, 4 * MIB as usize);
    b.write_at(0, &data, false).unwrap();
    let check_zeroed = |zeroed: &[(u64, u64)]| {
        let got = read(b, 0, data.len());
        for (i, (&g, &d)) in got.iter().zip(&data).enumerate() {
            let z = zeroed
                .iter()
                .any(|&(o, n)| (o..o + n).contains(&(i as u64)));
            assert_eq!(g, if z { 0 } else { d }, "byte {i}");
        }
    };
    b.write_zeroes(1000, 333).unwrap();
    b.write_zeroes(5, 0).unwrap();
    check_zeroed(&[(1000, 333)]);
    b.deallocate(MIB - 100, 2 * MIB + 200).unwrap();
    check_zeroed(&[(1000, 333), (MIB - 100, 2 * MIB + 200)]);
    b.write_zeroes(4 * MIB - 4096 - 7, 4096).unwrap();
    b.deallocate(512, 512).unwrap();
    b.deallocate(7, 0).unwrap();
    check_zeroed(&[
        (1000, 333),
        (MIB - 100, 2 * MIB + 200),
        (4 * MIB - 4096 - 7, 4096),
        (512, 512),
    ]);
}

/// Grows and shrinks; I/O past the new end fails; grown space reads
/// zeros. Wants `len == 4 MiB`.
pub(super) fn resize(b: &dyn Backend) {
    let data = pattern(3, 100_000);
    b.write_at(4 * MIB - 100_000, &data, false).unwrap();
    let cut = 4 * MIB - 50_001;
    b.resize(cut).unwrap();
    assert_eq!(b.len(), cut);
    assert!(oor(b.read_at(cut - 10, &mut [0u8; 11])));
    assert!(oor(b.write_at(cut, &[1], false)));
    assert_eq!(read(b, 4 * MIB - 100_000, 49_999), data[..49_999]);
    b.resize(6 * MIB + 3).unwrap();
    assert_eq!(b.len(), 6 * MIB + 3);
    assert_eq!(read(b, 4 * MIB - 100_000, 49_999), data[..49_999]);
    assert!(is_zero(&read(b, cut, (6 * MIB + 3 - cut) as usize)));
    b.write_at(6 * MIB, &[1, 2, 3], false).unwrap();
    assert_eq!(read(b, 6 * MIB - 1, 4), [0, 1, 2, 3]);
    b.resize(3 * MIB).unwrap();
    b.resize(4 * MIB).unwrap();
    assert!(is_zero(&read(b, 3 * MIB, MIB as usize)));
}

/// Four threads write interleaved 1000-byte stripes (so neighbours share
/// blocks and segments), then everything is verified. Wants `len >=
/// 2 MiB`.
pub(super) fn concurrent(b: &dyn Backend) {
    const STRIPE: usize = 1000;
    let stripes = 2 * MIB as usize / STRIPE;
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                for i in (t as usize..stripes).step_by(4) {
                    let data = pattern(t.wrapping_mul(31) ^ i as u8, STRIPE);
                    b.write_at((i * STRIPE) as u64, &data, i % 7 == 0).unwrap();
                }
            });
        }
    });
    let got = read(b, 0, stripes * STRIPE);
    for i in 0..stripes {
        let t = (i % 4) as u8;
        let want = pattern(t.wrapping_mul(31) ^ i as u8, STRIPE);
        assert_eq!(got[i * STRIPE..(i + 1) * STRIPE], want, "stripe {i}");
    }
}

/// Every generic check, each on a fresh backend from `make(4 MiB)`.
/// Prefetch hints anywhere, in range or not, change no byte.
pub(super) fn prefetch_changes_nothing(b: &dyn Backend) {
    let len = b.len();
    let data = pattern(3, 3 * 4096);
    b.write_at(len / 2 - 4096, &data, false).unwrap();
    for (offset, n) in [
        (0, 4096),
        (len / 2 - 4096, 3 * 4096),
        (len / 2 - 1, 1 << 20),
        (len - 100, 4096),
        (len, 1),
        (len + 4096, 0),
        (u64::MAX - 5, u64::MAX),
    ] {
        b.prefetch(offset, n);
    }
    assert_eq!(read(b, len / 2 - 4096, data.len()), data);
    assert!(is_zero(&read(b, 0, 4096)));
    assert!(is_zero(&read(b, len - 100, 100)));
}

pub(super) fn suite(make: &dyn Fn(u64) -> Box<dyn Backend>) {
    prefetch_changes_nothing(&*make(4 * MIB + 100));
    round_trip(&*make(4 * MIB));
    out_of_range(&*make(4 * MIB));
    zeroing(&*make(4 * MIB));
    resize(&*make(4 * MIB));
    concurrent(&*make(4 * MIB));
}

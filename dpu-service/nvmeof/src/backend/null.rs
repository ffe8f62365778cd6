//! [`NullBackend`]: reads zeros and forgets writes, for benchmarks of the
//! protocol alone.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{check, Backend};

/// Reads zeros, forgets writes: for benchmarks of the protocol alone.
#[derive(Debug)]
pub struct NullBackend {
    len: AtomicU64,
}

impl NullBackend {
    /// A null device of `len` bytes.
    pub fn new(len: u64) -> Self {
        Self {
            len: AtomicU64::new(len),
        }
    }
}

impl Backend for NullBackend {
    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "null"
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check(self.len(), offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        check(self.len(), offset, data.len() as u64)
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check(self.len(), offset, len)
    }

    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        check(self.len(), offset, len)
    }

    fn resize(&self, new_len: u64) -> io::Result<()> {
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    fn volatile_write_cache(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::suite::*;

    #[test]
    fn null_backend() {
        let b = NullBackend::new(4096);
        assert_eq!((b.kind(), b.len()), ("null", 4096));
        b.write_at(0, &[1; 4096], true).unwrap();
        assert!(is_zero(&read(&b, 0, 4096)));
        assert!(b.write_at(1, &[1; 4096], false).is_err());
        assert!(b.read_at(4096, &mut [0]).is_err());
        b.write_zeroes(0, 4096).unwrap();
        b.deallocate(0, 10).unwrap();
        assert!(b.deallocate(4000, 100).is_err());
        b.flush().unwrap();
        b.resize(8192).unwrap();
        assert_eq!(b.len(), 8192);
        assert!(!b.volatile_write_cache());
    }
}

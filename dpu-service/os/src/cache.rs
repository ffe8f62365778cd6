//! Hints to the CPU's caches, what DPDK's `rte_prefetch0` gives C code:
//! a worker that knows which memory its next steps read asks for it early,
//! so that the cache misses of several packets overlap.

/// Asks the CPU to bring the cache line holding `value` into all cache
/// levels, without waiting for it. Never faults and changes nothing a
/// program can observe but its speed; on CPUs without a prefetch
/// instruction it does nothing.
#[inline(always)]
pub fn prefetch<T: ?Sized>(value: &T) {
    let p = (value as *const T).cast::<u8>();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 reads nothing architecturally and cannot fault,
    // whatever the address; `p` comes from a reference anyway. SSE, which
    // has it, is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint: it cannot fault or change memory, registers
    // or flags, and `p` comes from a reference.
    unsafe {
        std::arch::asm!(
            "prfm pldl1keep, [{p}]",
            p = in(reg) p,
            options(nostack, readonly, preserves_flags)
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::prefetch;

    #[test]
    fn prefetching_changes_nothing() {
        let v: Vec<u64> = (0..1024).collect();
        for x in &v {
            prefetch(x);
        }
        prefetch(&v[..]);
        assert_eq!(v.iter().sum::<u64>(), 1023 * 1024 / 2);
    }
}

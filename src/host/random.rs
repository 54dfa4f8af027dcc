//! Random numbers, one source for every layer: the kernel's (getrandom(2),
//! through ring, already linked for TLS). getrandom does not fail on Linux
//! once the pool is ready; should it, the bytes come from std's randomly
//! keyed hasher over a counter, the time and the process id instead, which
//! still differ between calls and processes.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) {
    let rng = ring::rand::SystemRandom::new();
    if ring::rand::SecureRandom::fill(&rng, buf).is_err() {
        for chunk in buf.chunks_mut(8) {
            let seed = hashed_u64().to_le_bytes();
            chunk.copy_from_slice(&seed[..chunk.len()]);
        }
    }
}

pub fn u32() -> u32 {
    let mut b = [0u8; 4];
    fill(&mut b);
    u32::from_le_bytes(b)
}

pub fn u64() -> u64 {
    let mut b = [0u8; 8];
    fill(&mut b);
    u64::from_le_bytes(b)
}

pub fn u128() -> u128 {
    let mut b = [0u8; 16];
    fill(&mut b);
    u128::from_le_bytes(b)
}

/// A number in [0, 1).
pub fn fraction() -> f64 {
    (u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The fallback: std's randomly keyed hasher over what differs between calls.
fn hashed_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_stay_in_range() {
        for _ in 0..100 {
            let f = fraction();
            assert!((0.0..1.0).contains(&f));
        }
    }

    #[test]
    fn calls_differ() {
        assert_ne!(u128(), u128());
        assert_ne!(hashed_u64(), hashed_u64());
        let mut odd = [0u8; 13];
        fill(&mut odd);
        assert!(odd.iter().any(|b| *b != 0));
    }
}

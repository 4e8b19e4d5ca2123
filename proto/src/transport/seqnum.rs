//! Widening 32-bit wire numbers (sequence, ack, message numbers) to the 64-bit values the
//! state machines count in, so that wrap-around never confuses an ordering.

/// The 64-bit number whose low 32 bits are `wire` and which lies nearest to `expected`
/// (exactly half way round: the later one); where that number would fall below zero or
/// past `u64::MAX`, the one in `expected`'s own span of 2^32.
///
/// Every frame widens four or five numbers: one signed 32-bit distance, not the span
/// arithmetic it stands for (checked against it in the tests).
#[inline]
pub fn expand(wire: u32, expected: u64) -> u64 {
    let d = wire.wrapping_sub(expected as u32) as i32;
    let near = if d >= 0 || d == i32::MIN {
        expected.checked_add(u64::from(d as u32))
    } else {
        expected.checked_sub(u64::from(d.unsigned_abs()))
    };
    near.unwrap_or((expected & !0xFFFF_FFFF) | u64::from(wire))
}

/// The low 32 bits that go on the wire.
pub fn truncate(v: u64) -> u32 {
    v as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The span arithmetic `expand` computes, as first written: the oracle.
    pub(super) fn reference(wire: u32, expected: u64) -> u64 {
        const SPAN: u64 = 1 << 32;
        const HALF: u64 = 1 << 31;
        let candidate = (expected & !(SPAN - 1)) | u64::from(wire);
        if candidate.saturating_add(HALF) <= expected && candidate <= u64::MAX - SPAN {
            candidate + SPAN
        } else if candidate > expected.saturating_add(HALF) && candidate >= SPAN {
            candidate - SPAN
        } else {
            candidate
        }
    }

    #[test]
    fn expand_agrees_with_the_span_arithmetic() {
        let mut rng = crate::rng::SplitMix64::new(7);
        let edges = [
            0u64,
            1,
            (1 << 31) - 1,
            1 << 31,
            (1 << 31) + 1,
            (1 << 32) - 1,
            1 << 32,
            (1 << 32) + (1 << 31),
            u64::MAX - (1 << 32),
            u64::MAX - (1 << 31),
            u64::MAX - 1,
            u64::MAX,
        ];
        let wires = [
            0u32,
            1,
            (1 << 31) - 1,
            1 << 31,
            (1 << 31) + 1,
            u32::MAX - 1,
            u32::MAX,
        ];
        for &e in &edges {
            for &w in &wires {
                assert_eq!(
                    expand(w, e),
                    reference(w, e),
                    "wire {w:#x}, expected {e:#x}"
                );
            }
        }
        for _ in 0..200_000 {
            let e = rng.next_u64() >> (rng.next_u64() % 64);
            let w = if rng.next_u64().is_multiple_of(2) {
                rng.next_u64() as u32
            } else {
                (e as u32)
                    .wrapping_add((rng.next_u64() % 64) as u32)
                    .wrapping_sub(32)
            };
            assert_eq!(
                expand(w, e),
                reference(w, e),
                "wire {w:#x}, expected {e:#x}"
            );
        }
    }

    #[test]
    fn nearest_across_wrap() {
        assert_eq!(expand(5, 3), 5);
        assert_eq!(expand(0xFFFF_FFFF, 1 << 32), 0xFFFF_FFFF);
        assert_eq!(expand(2, 0xFFFF_FFF0), (1 << 32) + 2);
        assert_eq!(expand(0xFFFF_FFF0, (1 << 32) + 2), 0xFFFF_FFF0);
        assert_eq!(expand(7, 0), 7);
        for e in [0u64, 100, 1 << 31, (1 << 32) - 1, 1 << 32, 5 << 32] {
            for d in [-1000i64, -1, 0, 1, 1000] {
                let v = e as i64 + d;
                if v >= 0 {
                    assert_eq!(expand(truncate(v as u64), e), v as u64);
                }
            }
        }
    }
}

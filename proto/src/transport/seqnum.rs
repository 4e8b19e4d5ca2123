//! Widening 32-bit wire numbers (sequence, ack, message numbers) to the 64-bit values the
//! state machines count in, so that wrap-around never confuses an ordering.

/// The 64-bit number whose low 32 bits are `wire` and which lies nearest to `expected`.
pub fn expand(wire: u32, expected: u64) -> u64 {
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

/// The low 32 bits that go on the wire.
pub fn truncate(v: u64) -> u32 {
    v as u32
}

#[cfg(test)]
mod tests {
    use super::*;

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

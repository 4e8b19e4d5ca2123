//! Runs of one byte value: benchmark payloads are such runs, and the simulator holds them
//! as a value and a count rather than as bytes (frames on its links, messages in the
//! engines' compacting send queues). Both ask the same question of a buffer, so one scan
//! answers it.

/// Length of the run of bytes equal to the last one at the end of `b`, not reaching into
/// `b[..floor]`.
pub(crate) fn trailing_run(b: &[u8], floor: usize) -> usize {
    let Some(&last) = b.last() else { return 0 };
    let body = b.get(floor..).unwrap_or(&[]);
    let word = u64::from_ne_bytes([last; 8]);
    // Every frame a simulated server sends is scanned, and every long message a compacting
    // queue takes: 64-byte blocks folded without a branch per
    // word let the compiler compare a block in a few vector instructions; the block that
    // differs (and the remainder) is finished byte by byte.
    let mut blocks = body.rchunks_exact(64);
    let mut run = 0;
    for blk in blocks.by_ref() {
        let diff = blk.chunks_exact(8).fold(0u64, |acc, c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            acc | (u64::from_ne_bytes(w) ^ word)
        });
        if diff != 0 {
            return run + blk.iter().rev().take_while(|x| **x == last).count();
        }
        run += 64;
    }
    run + blocks
        .remainder()
        .iter()
        .rev()
        .take_while(|x| **x == last)
        .count()
}

/// The value every byte of `data` has, if they all have one.
pub(crate) fn run_value(data: &[u8]) -> Option<u8> {
    let &last = data.last()?;
    (trailing_run(data, 0) == data.len()).then_some(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_measured_from_the_end_and_stop_at_the_floor() {
        assert_eq!(trailing_run(&[1, 2, 3, 3, 3], 0), 3);
        assert_eq!(trailing_run(&[3; 20], 5), 15);
        let mut b = vec![7u8; 100];
        b[50] = 1;
        assert_eq!(trailing_run(&b, 0), 49);
        assert_eq!(trailing_run(&[], 0), 0);
        assert_eq!(trailing_run(&[9], 4), 0);
    }

    #[test]
    fn runs_agree_with_a_byte_by_byte_count_across_block_edges() {
        let naive = |b: &[u8], floor: usize| {
            let Some(&last) = b.last() else { return 0 };
            b.get(floor..)
                .unwrap_or(&[])
                .iter()
                .rev()
                .take_while(|x| **x == last)
                .count()
        };
        let mut rng = crate::rng::SplitMix64::new(11);
        for _ in 0..2000 {
            let len = (rng.next_u64() % 600) as usize;
            let mut b = vec![0x5au8; len];
            // Zero, one or two bytes that break the run, anywhere (block edges included).
            for _ in 0..rng.next_u64() % 3 {
                if len > 0 {
                    let at = (rng.next_u64() % len as u64) as usize;
                    b[at] = 0xa5;
                }
            }
            let floor = (rng.next_u64() % 80) as usize;
            assert_eq!(
                trailing_run(&b, floor),
                naive(&b, floor),
                "len {len} floor {floor}"
            );
        }
    }

    #[test]
    fn runs_are_recognised_only_when_every_byte_agrees() {
        assert_eq!(run_value(&[7; 1000]), Some(7));
        assert_eq!(run_value(&[]), None);
        for at in [0, 63, 64, 500, 999] {
            let mut b = vec![7u8; 1000];
            b[at] = 8;
            assert_eq!(run_value(&b), None, "differs at {at}");
        }
    }
}

//! Short fuzz runs inside the tests, and the seed corpus of the long ones.
//!
//! Every decoder of untrusted input has a `check_untrusted(bytes)` body beside it: it must
//! not panic on any input, and what it decodes must encode back to the same thing. The
//! long runs are libFuzzer's (`fuzz/`, one target per body, `fuzz/run.sh`); the test
//! command runs every body on a few hundred thousand inputs made here from valid encodings
//! ([`run`]): bits flipped, bytes cut, appended, spliced from another seed, or random. The
//! valid encodings are also written out as the long runs' seed corpus ([`write_seeds`]), so
//! the fuzzer starts past the decoders' first checks.

use std::path::Path;

use crate::rng::SplitMix64;

/// One mutation of `seed` (or of a splice of `seed` and `other`).
pub fn mutate(rng: &mut SplitMix64, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    match rng.below(6) {
        0 | 1 => {
            // A few bits flipped: most inputs stay past the first checks.
            for _ in 0..1 + rng.below(4) {
                if !b.is_empty() {
                    let at = rng.below(b.len() as u64) as usize;
                    b[at] ^= 1 << rng.below(8);
                }
            }
        }
        2 => b.truncate(rng.below(b.len() as u64 + 1) as usize),
        3 => {
            let mut extra = vec![0u8; rng.below(24) as usize];
            rng.fill(&mut extra);
            b.extend_from_slice(&extra);
        }
        4 => {
            // The head of one seed and the tail of another.
            let cut = rng.below(b.len() as u64 + 1) as usize;
            let from = rng.below(other.len() as u64 + 1) as usize;
            b.truncate(cut);
            b.extend_from_slice(&other[from..]);
        }
        _ => {
            // A field set to an extreme: a byte to 0x00 or 0xff, or a run of them.
            if !b.is_empty() {
                let at = rng.below(b.len() as u64) as usize;
                let n = (1 + rng.below(8) as usize).min(b.len() - at);
                let v = if rng.chance(0.5) { 0 } else { 0xff };
                b[at..at + n].fill(v);
            }
        }
    }
    b
}

/// Runs `check` on `runs` inputs mutated from `seeds` (every seed once as it is first),
/// with random inputs among them; `seed` makes the run repeatable.
pub fn run(seeds: &[Vec<u8>], runs: usize, seed: u64, mut check: impl FnMut(&[u8])) {
    assert!(!seeds.is_empty(), "a fuzz run needs seeds");
    for s in seeds {
        check(s);
    }
    let mut rng = SplitMix64::new(seed);
    for i in 0..runs {
        if i % 16 == 15 {
            let mut b = vec![0u8; rng.below(300) as usize];
            rng.fill(&mut b);
            check(&b);
            continue;
        }
        let a = &seeds[rng.below(seeds.len() as u64) as usize];
        let o = &seeds[rng.below(seeds.len() as u64) as usize];
        let mut b = mutate(&mut rng, a, o);
        // Sometimes twice: two changes reach states one does not.
        if rng.chance(0.25) {
            b = mutate(&mut rng, &b, o);
        }
        check(&b);
    }
}

/// Writes `seeds` as the seed corpus of fuzz target `target` (files `seedNN` in
/// `fuzz/seeds/<target>/` under `workspace`) when `TORUSNET_WRITE_SEEDS` is set: the
/// tests that make them also keep the committed corpus current.
pub fn write_seeds(workspace: &Path, target: &str, seeds: &[Vec<u8>]) {
    if std::env::var_os("TORUSNET_WRITE_SEEDS").is_none() {
        return;
    }
    let dir = workspace.join("fuzz/seeds").join(target);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed{i:02}")), s).expect("write a seed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_sees_every_seed_and_is_repeatable() {
        let seeds = vec![vec![1u8, 2, 3], vec![9u8; 40]];
        let mut a = Vec::new();
        run(&seeds, 500, 7, |b| a.push(b.to_vec()));
        assert_eq!(&a[..2], &seeds[..]);
        assert_eq!(a.len(), 502);
        let mut b = Vec::new();
        run(&seeds, 500, 7, |x| b.push(x.to_vec()));
        assert_eq!(a, b);
        // The mutations reach lengths below and above the seeds'.
        assert!(a.iter().any(|x| x.len() < 3) && a.iter().any(|x| x.len() > 40));
    }
}

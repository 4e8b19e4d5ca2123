//! Fault injection on a link, for tests and soaks: frames lost, sent twice, or overtaken by
//! the next one. Loss is the XDP program's (frames arriving on the link are dropped in the
//! kernel); duplication and reordering happen where frames leave, because netem cannot
//! touch torus frames (an AF_XDP transmit bypasses the qdisc, and the XDP program on the
//! receiving side runs before tc). Off unless a test asks for it (`{"cmd":"fault"}`).

use torusnet_proto::rng::SplitMix64;

use crate::xsk::{XdpDesc, MAX_FRAME_CHUNKS};

/// What a link does to its frames: each a probability per frame, 0 for none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Fault {
    /// Frames arriving on the link dropped (in the XDP program).
    pub drop: f64,
    /// Frames leaving by the link sent twice.
    pub duplicate: f64,
    /// Frames leaving by the link held back and sent after the next one.
    pub reorder: f64,
}

impl Fault {
    /// A fault from probabilities, each checked to lie in 0..=1.
    pub fn new(drop: f64, duplicate: f64, reorder: f64) -> Result<Fault, String> {
        for (name, p) in [
            ("drop", drop),
            ("duplicate", duplicate),
            ("reorder", reorder),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{name}: {p} is not a probability"));
            }
        }
        Ok(Fault {
            drop,
            duplicate,
            reorder,
        })
    }
}

/// What to do with a frame about to leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Send it.
    Pass,
    /// Send it, and a copy after it.
    Duplicate,
    /// Kept here ([`LinkFault::take_held`]), to go after the next frame.
    Hold,
}

/// A frame held back: its descriptors, MAC addresses already written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    descs: [XdpDesc; MAX_FRAME_CHUNKS],
    n: usize,
}

impl Held {
    /// Its descriptors.
    pub(crate) fn descs(&self) -> &[XdpDesc] {
        &self.descs[..self.n]
    }
}

/// One link's transmit-side faults and the frame it holds back.
#[derive(Debug)]
pub(crate) struct LinkFault {
    duplicate: f64,
    reorder: f64,
    rng: SplitMix64,
    held: Option<Held>,
}

impl LinkFault {
    /// No faults; `seed` makes a link's choices its own.
    pub(crate) fn new(seed: u64) -> LinkFault {
        LinkFault {
            duplicate: 0.0,
            reorder: 0.0,
            rng: SplitMix64::new(seed),
            held: None,
        }
    }

    /// Takes the transmit side of `f`.
    pub(crate) fn set(&mut self, f: &Fault) {
        self.duplicate = f.duplicate;
        self.reorder = f.reorder;
    }

    /// Whether frames leaving need judging (a frame held back counts: it must go).
    pub(crate) fn active(&self) -> bool {
        self.duplicate > 0.0 || self.reorder > 0.0 || self.held.is_some()
    }

    /// Judges a frame about to leave; on [`Verdict::Hold`] it is kept here. One frame is
    /// held at a time: while one is, the next passes (and the held one goes after it).
    pub(crate) fn judge(&mut self, descs: &[XdpDesc]) -> Verdict {
        if self.held.is_none()
            && descs.len() <= MAX_FRAME_CHUNKS
            && self.reorder > 0.0
            && self.rng.chance(self.reorder)
        {
            let mut held = Held {
                descs: [XdpDesc::default(); MAX_FRAME_CHUNKS],
                n: descs.len(),
            };
            held.descs[..descs.len()].copy_from_slice(descs);
            self.held = Some(held);
            return Verdict::Hold;
        }
        if self.duplicate > 0.0 && self.rng.chance(self.duplicate) {
            Verdict::Duplicate
        } else {
            Verdict::Pass
        }
    }

    /// The frame held back, given up to be sent.
    pub(crate) fn take_held(&mut self) -> Option<Held> {
        self.held.take()
    }

    /// Puts back a held frame that found no room.
    pub(crate) fn keep_held(&mut self, h: Held) {
        self.held = Some(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(addr: u64) -> [XdpDesc; 1] {
        [XdpDesc {
            addr,
            len: 60,
            options: 0,
        }]
    }

    #[test]
    fn probabilities_outside_zero_to_one_are_refused() {
        assert!(Fault::new(0.0, 1.5, 0.0).is_err());
        assert!(Fault::new(-0.1, 0.0, 0.0).is_err());
        assert!(Fault::new(f64::NAN, 0.0, 0.0).is_err());
        assert!(Fault::new(0.05, 0.02, 0.02).is_ok());
    }

    #[test]
    fn no_fault_passes_every_frame() {
        let mut f = LinkFault::new(1);
        assert!(!f.active());
        for a in 0..100 {
            assert_eq!(f.judge(&desc(a)), Verdict::Pass);
        }
    }

    #[test]
    fn a_held_frame_is_the_only_one_and_is_given_back_whole() {
        let mut f = LinkFault::new(7);
        f.set(&Fault::new(0.0, 0.0, 1.0).expect("fault"));
        assert_eq!(f.judge(&desc(4096)), Verdict::Hold);
        // Held: the next frames pass until the held one has gone.
        assert_eq!(f.judge(&desc(8192)), Verdict::Pass);
        let h = f.take_held().expect("held");
        assert_eq!(h.descs(), &desc(4096));
        // Turned off, a frame still held is given back, and then nothing is judged.
        assert_eq!(f.judge(&desc(12288)), Verdict::Hold);
        f.set(&Fault::default());
        assert!(f.active());
        assert!(f.take_held().is_some());
        assert!(!f.active());
    }

    #[test]
    fn duplicates_come_at_about_their_probability() {
        let mut f = LinkFault::new(3);
        f.set(&Fault::new(0.0, 0.1, 0.0).expect("fault"));
        let dups = (0..10_000)
            .filter(|&a| f.judge(&desc(a)) == Verdict::Duplicate)
            .count();
        assert!((800..1200).contains(&dups), "{dups}");
    }
}

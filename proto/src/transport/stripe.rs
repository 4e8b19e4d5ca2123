//! Round-robin striping of frames over the usable links (MultiEdge: a connection's frames
//! take the links in turn, so one peer's traffic uses every link towards it).

use super::{LinkId, LinkSet};

/// The cursor of one stream of frames: the link its last frame went out on.
#[derive(Debug, Clone, Copy)]
pub struct Stripe {
    last: LinkId,
}

impl Default for Stripe {
    fn default() -> Stripe {
        Stripe { last: LinkId::MAX }
    }
}

impl Stripe {
    /// The first usable link after the one used last, which becomes the last.
    pub fn next(&mut self, usable: LinkSet) -> Option<LinkId> {
        if usable.is_empty() {
            return None;
        }
        let start = self.last.wrapping_add(1);
        let link = (0..LinkSet::CAPACITY)
            .map(|k| start.wrapping_add(k) % LinkSet::CAPACITY)
            .find(|l| usable.contains(*l))?;
        self.last = link;
        Some(link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_usable_links_in_turn() {
        let mut s = Stripe::default();
        let three = LinkSet::first(3);
        let picks: Vec<LinkId> = (0..6).filter_map(|_| s.next(three)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let two = three.without(1);
        let picks: Vec<LinkId> = (0..4).filter_map(|_| s.next(two)).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        assert_eq!(s.next(LinkSet::EMPTY), None);
    }
}

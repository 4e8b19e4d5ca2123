//! Frames passing through this server that found no room on any of their next-hop links:
//! held, in order and bounded, and sent ahead of the server's own frames as links drain.
//!
//! Dropping them instead (as before) cost a retransmission from their source for every
//! frame a busy link could not take at that instant, though the link would have taken it a
//! few microseconds later. The links they wait for are kept from the server's own traffic
//! until they have gone, so frames in transit are not starved by local sends, and the
//! server's own sources slow down instead (their windows fill).

use std::collections::VecDeque;

use torusnet_proto::topology::DirSet;

use crate::xsk::XdpDesc;

/// A frame waiting for a link.
#[derive(Debug)]
struct Held {
    hops: DirSet,
    descs: Vec<XdpDesc>,
    /// The port it came in on (for its counters).
    from: usize,
}

/// The waiting frames of one poller.
#[derive(Debug)]
pub struct Transit {
    q: VecDeque<Held>,
    chunks: usize,
    limit_chunks: usize,
    /// Every link some waiting frame could take (kept up to date on push and drain).
    wanted: DirSet,
}

impl Transit {
    /// A queue holding at most `limit_chunks` UMEM chunks (the rest stay for receiving).
    pub fn new(limit_chunks: usize) -> Transit {
        Transit {
            q: VecDeque::new(),
            chunks: 0,
            limit_chunks,
            wanted: DirSet::EMPTY,
        }
    }

    /// Holds a frame (its descriptors) for one of `hops`; false when full (the caller
    /// drops it).
    pub fn push(&mut self, hops: DirSet, descs: &[XdpDesc], from: usize) -> bool {
        if self.chunks + descs.len() > self.limit_chunks {
            return false;
        }
        self.chunks += descs.len();
        self.wanted = self.wanted.union(hops);
        self.q.push_back(Held {
            hops,
            descs: descs.to_vec(),
            from,
        });
        true
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Every link some waiting frame could take: kept from the server's own frames.
    pub fn wanted(&self) -> DirSet {
        self.wanted
    }

    /// Offers every waiting frame, oldest first, to `send(hops, descs, from)`, which
    /// returns whether it went; the ones that did not keep waiting, in order. How many went.
    pub fn drain(&mut self, mut send: impl FnMut(DirSet, &[XdpDesc], usize) -> bool) -> usize {
        let mut sent = 0;
        for _ in 0..self.q.len() {
            let Some(h) = self.q.pop_front() else { break };
            if send(h.hops, &h.descs, h.from) {
                self.chunks -= h.descs.len();
                sent += 1;
            } else {
                self.q.push_back(h);
            }
        }
        self.wanted = self.q.iter().fold(DirSet::EMPTY, |s, h| s.union(h.hops));
        sent
    }

    /// Gives every waiting frame's descriptors to `release` (shutdown).
    pub fn clear(&mut self, mut release: impl FnMut(&XdpDesc)) {
        for h in self.q.drain(..) {
            h.descs.iter().for_each(&mut release);
        }
        self.chunks = 0;
        self.wanted = DirSet::EMPTY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use torusnet_proto::topology::Dir;

    fn d(addr: u64) -> XdpDesc {
        XdpDesc {
            addr,
            len: 100,
            options: 0,
        }
    }

    #[test]
    fn holds_in_order_within_its_budget_and_lets_each_frame_go_when_its_link_drains() {
        let x = DirSet::EMPTY.with(Dir::PlusX);
        let y = DirSet::EMPTY.with(Dir::PlusY);
        let mut t = Transit::new(3);
        assert!(t.push(x, &[d(1)], 0));
        assert!(t.push(y, &[d(2), d(3)], 1));
        assert!(!t.push(x, &[d(4)], 0), "over budget");
        assert_eq!(t.wanted(), x.union(y));
        // Only +y has room: the +x frame keeps waiting, the +y frame goes.
        let mut went = Vec::new();
        assert_eq!(
            t.drain(|hops, descs, _| {
                let ok = hops.contains(Dir::PlusY);
                if ok {
                    went.push(descs[0].addr);
                }
                ok
            }),
            1
        );
        assert_eq!(went, vec![2]);
        assert_eq!(t.len(), 1);
        assert!(t.push(y, &[d(5), d(6)], 1), "room again");
        let mut order = Vec::new();
        t.drain(|_, descs, _| {
            order.push(descs[0].addr);
            true
        });
        assert_eq!(order, vec![1, 5]);
        assert!(t.is_empty());
    }
}

//! The way out of a poller: one frame built by the engine, in a UMEM buffer taken for it,
//! onto the TX ring of the link the engine chose.
//!
//! Two callers build frames: the poller's transmit loop (whatever the engine has queued,
//! [`Node::poll_transmit_keeping`](torusnet_proto::node::Node::poll_transmit_keeping)) and a
//! hosted service's send that goes straight into its frame
//! ([`Node::send_framing`](torusnet_proto::node::Node::send_framing): one copy of a large
//! message, from the service's bytes into the UMEM, where a queue would add another). Both
//! take buffers, offer them to be kept for retransmission and put descriptors on rings the
//! same way, here. Kicking the rings stays with the poller's turn, which batches the kicks.

use torusnet_proto::topology::{Dir, DirSet};
use torusnet_proto::transport::Keep;

use crate::counters::add;
use crate::poller::Port;
use crate::runtime::{Handoff, HandoffCounts, Shared};
use crate::xsk::sys::XDP_PKT_CONTD;
use crate::xsk::{Umem, XdpDesc, CHUNK};

/// UMEM chunks of the largest frame (MTU 9000, the most the configuration takes).
pub(crate) const MAX_FRAME_CHUNKS: usize = (9000 + 14usize).div_ceil(CHUNK);

/// Most descriptors a link's TX ring may hold before the link counts as full. The ring
/// could take 2048, but in copy mode the kernel drains a budget per kick, and frames parked
/// there for milliseconds make every round trip (and so every timeout and NACK guard) look
/// long; the transport keeps the rest, where it can still choose links and retransmit.
pub(crate) const TX_QUEUE_LIMIT: u32 = 256;

/// What a poller lends for putting frames on its links: borrowed from its fields for one
/// call, so that the engine can be borrowed beside it.
pub(crate) struct TxPath<'a> {
    pub(crate) umem: &'a mut Umem,
    pub(crate) ports: &'a mut [Port],
    /// Global link index (into `Shared::links`) of each port.
    pub(crate) link_idx: &'a [usize],
    /// The port of each direction this poller owns.
    pub(crate) by_dir: &'a [Option<usize>; 6],
    pub(crate) shared: &'a Shared,
    pub(crate) shard: usize,
    pub(crate) mtu: usize,
    pub(crate) chunks_per_frame: u32,
    /// Transmit slots kept free of retransmission copies.
    pub(crate) sending_slots: usize,
    /// Frames handed to other pollers, and dropped on the way (counted for status).
    pub(crate) handoffs: &'a mut HandoffCounts,
    /// Links that frames in transit wait for: new frames leave them alone.
    pub(crate) reserved: DirSet,
}

impl TxPath<'_> {
    /// The links a new frame may take now: this poller's with room on their TX ring, other
    /// pollers' whose hand-off queue has room, none that frames in transit wait for.
    pub(crate) fn room(&mut self) -> DirSet {
        let mut room = DirSet::EMPTY;
        for p in self.ports.iter_mut() {
            if p.xsk.tx.outstanding() + self.chunks_per_frame <= TX_QUEUE_LIMIT {
                room = room.with(p.dir);
            }
        }
        for d in Dir::ALL {
            if let Some(owner) = self.shared.link_shard[usize::from(d.index())] {
                if owner != self.shard && !self.shared.shards[owner].handoff.is_full() {
                    room = room.with(d);
                }
            }
        }
        DirSet::from_bits(room.bits() & !self.reserved.bits())
    }

    /// Whether a frame can be built now: a link in `room` and a buffer free.
    pub(crate) fn ready(&self, room: DirSet) -> bool {
        // Frames larger than a chunk always have slots: the configuration's smallest UMEM
        // (256 chunks over at most six pollers) gives every poller several.
        let free = if self.chunks_per_frame > 1 {
            self.umem.free_slots() > 0
        } else {
            self.umem.free_chunks() >= self.chunks_per_frame as usize
        };
        !room.is_empty() && free
    }

    /// Takes a buffer, lets `build` write a frame into it (given the links with room, the
    /// buffer and the offer to keep it) and puts what it built on its link; `build`
    /// returns the link, the frame's length and whether the engine kept the buffer, or
    /// `None` for no frame (the buffer goes back). Whether a frame went. The caller
    /// checked [`TxPath::ready`].
    pub(crate) fn send_one(
        &mut self,
        room: DirSet,
        build: impl FnOnce(DirSet, &mut [u8], Option<Keep<'_>>) -> Option<(Dir, usize, bool)>,
    ) -> bool {
        // A frame's descriptors, on the stack: an allocation per frame sent showed in the
        // latency of every round trip.
        let mut descs = [XdpDesc::default(); MAX_FRAME_CHUNKS];
        let out = if self.chunks_per_frame > 1 {
            // Built where it is sent: the slot's chunks are adjacent, so the frame is
            // written once and its descriptors are the chunks it covers.
            let Some(base) = self.umem.alloc_slot() else {
                return false;
            };
            // The engine may keep the frame here for retransmission instead of a copy,
            // while slots are plentiful.
            let handle = (self.umem.free_slots() >= self.sending_slots)
                .then(|| self.umem.slot_handle(base))
                .flatten();
            let frames = self.umem.slot_frames();
            let keep = Keep {
                handle,
                frames: &frames,
            };
            let buf = self.umem.slice_mut(base, self.mtu + 14);
            match build(room, buf, Some(keep)) {
                Some((dir, len, kept)) => {
                    let n = len.div_ceil(CHUNK).clamp(1, MAX_FRAME_CHUNKS);
                    for (k, d) in descs[..n].iter_mut().enumerate() {
                        let at = k * CHUNK;
                        *d = XdpDesc {
                            addr: base + at as u64,
                            len: len.saturating_sub(at).min(CHUNK) as u32,
                            options: if k + 1 < n { XDP_PKT_CONTD } else { 0 },
                        };
                    }
                    self.umem.commit_slot(base, n as u32, kept);
                    Some((dir, n))
                }
                None => {
                    self.umem.commit_slot(base, 0, false);
                    None
                }
            }
        } else {
            let Some(addr) = self.umem.alloc() else {
                return false;
            };
            let buf = self.umem.slice_mut(addr, CHUNK);
            match build(room, buf, None) {
                Some((dir, len, _)) => {
                    descs[0] = XdpDesc {
                        addr,
                        len: len as u32,
                        options: 0,
                    };
                    Some((dir, 1))
                }
                None => {
                    self.umem.release(addr);
                    None
                }
            }
        };
        let Some((dir, n)) = out else {
            return false;
        };
        let descs = &descs[..n];
        match self.by_dir[usize::from(dir.index())] {
            Some(o) => self.push(o, descs),
            None => {
                // Another poller's link: hand the frame over (copied).
                let mut bytes = Vec::new();
                for d in descs {
                    bytes.extend_from_slice(self.umem.slice(d.addr, d.len as usize));
                    self.umem.release(d.addr);
                }
                // Passed on or dropped, the frame is counted either way.
                match self.shared.link_shard[usize::from(dir.index())] {
                    Some(owner) => {
                        self.hand_off(owner, Handoff::Send(dir, bytes));
                    }
                    None => self.handoffs.dropped += 1,
                }
            }
        }
        true
    }

    /// Puts a frame's descriptors on port `o`'s TX ring, with the link's MAC addresses.
    pub(crate) fn push(&mut self, o: usize, descs: &[XdpDesc]) {
        let (src, dst) = (self.ports[o].local_mac, self.ports[o].neighbor_mac);
        let head = self.umem.slice_mut(descs[0].addr, 12);
        head[0..6].copy_from_slice(&dst.unwrap_or([0xff; 6]));
        head[6..12].copy_from_slice(&src);
        let n = descs.len() as u32;
        let bytes: u64 = descs.iter().map(|d| u64::from(d.len)).sum();
        for (k, d) in descs.iter().enumerate() {
            self.ports[o].xsk.tx.write(k as u32, *d);
        }
        self.ports[o].xsk.tx.submit(n);
        self.ports[o].unkicked += n;
        let c = &self.shared.links[self.link_idx[o]].counters;
        add(&c.tx_frames, 1);
        add(&c.tx_bytes, bytes);
    }

    /// Passes `h` to poller `owner` and wakes it; whether it was queued. A full queue
    /// drops the frame, as a full ring would (counted; a reliable sender resends it).
    pub(crate) fn hand_off(&mut self, owner: usize, h: Handoff) -> bool {
        self.shared.shards[owner].hand_off(h, self.handoffs)
    }
}

//! The links of one poller and the way out through them: its ports, the UMEM they share,
//! the transmit slots jumbo frames are built in, and putting frames on the TX rings.
//!
//! Frames leave three ways, all here: the poller's transmit loop (whatever the engine has
//! queued, `Node::poll_transmit`), a hosted service's send that goes straight into its frame
//! (`Node::send_framing`: one copy of a large message, from the service's bytes into the
//! UMEM, where a queue would add another), and frames passing through (their descriptors
//! moved from an RX ring to a TX ring, no copy: the links share the UMEM). A link another
//! poller owns is reached by handing the frame to that poller (copied). Kicking the rings
//! is done once per turn ([`Links::kick`]), which batches the kicks.

use std::sync::Arc;

use torusnet_proto::node::Outbound;
use torusnet_proto::topology::{Dir, DirSet};
use torusnet_proto::transport::Keep;

use crate::config::Polling;
use crate::counters::{add, LinkCounters};
use crate::fault::{Fault, LinkFault, Verdict};
use crate::fill_depth::FillDepth;
use crate::port::Port;
use crate::shared::{Handoff, HandoffCounts, Shared};
use crate::xsk::sys::XDP_PKT_CONTD;
use crate::xsk::{Umem, XdpDesc, CHUNK, MAX_FRAME_CHUNKS};

/// Frames handled per ring per turn, so no link starves the others.
pub(crate) const BATCH: u32 = 64;

/// Most descriptors a link's TX ring may hold before the link counts as full. The ring
/// could take 2048, but in copy mode the kernel drains a budget per kick, and frames parked
/// there for milliseconds make every round trip (and so every timeout and NACK guard) look
/// long; the transport keeps the rest, where it can still choose links and retransmit.
pub(crate) const TX_QUEUE_LIMIT: u32 = 256;

/// Jumbo frames kept in their slots for retransmission, at most: one default window (512
/// frames) in flight; beyond it, the transport keeps copies.
const KEPT_SLOTS: u32 = 512;

/// Transmit slots a poller with `ports` links needs when its frames span
/// `chunks_per_frame` chunks (none for single-chunk frames): every port's TX queue full
/// while a batch is built ([`sending_slots`]), and a window of frames the transport keeps
/// for retransmission where they were sent ([`KEPT_SLOTS`]). Its UMEM holds them on top of
/// the chunks configured for receiving and forwarding.
pub fn tx_slots(ports: usize, chunks_per_frame: u32) -> u32 {
    if chunks_per_frame < 2 {
        return 0;
    }
    sending_slots(ports, chunks_per_frame) + KEPT_SLOTS
}

/// Slots that are never kept for retransmission, so that frames (ACKs above all) can always
/// be sent: kept frames are freed by acknowledgements, which need frames sent both ways.
fn sending_slots(ports: usize, chunks_per_frame: u32) -> u32 {
    ports.max(1) as u32 * (TX_QUEUE_LIMIT / chunks_per_frame + 1) + BATCH
}

/// The links of one poller: what it owns to receive and send frames.
pub(crate) struct Links {
    shard: usize,
    shared: Arc<Shared>,
    pub(crate) umem: Umem,
    pub(crate) ports: Vec<Port>,
    /// Global link index (into `Shared::links`) of each port.
    link_idx: Vec<usize>,
    /// The port of each direction this poller owns.
    by_dir: [Option<usize>; 6],
    pub(crate) mtu: usize,
    pub(crate) chunks_per_frame: u32,
    /// Transmit slots kept free of retransmission copies ([`sending_slots`]).
    sending_slots: usize,
    /// How deep each port's fill ring is kept.
    fill: Vec<FillDepth>,
    /// Frames handed to other pollers, and dropped on the way (counted for status).
    pub(crate) handoffs: HandoffCounts,
    /// Each port's injected faults (tests and soaks only).
    faults: Vec<LinkFault>,
    /// Each port's load as frames' telemetry records it (`load::level`), from the meters.
    levels: Vec<u8>,
}

impl Links {
    /// What every thread of this torusd shares.
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Poller `shard`'s links over these ports (with their global link indices), all
    /// sharing `umem`, whose transmit slots it reserves.
    pub(crate) fn new(
        shard: usize,
        mut umem: Umem,
        ports: Vec<(usize, Port)>,
        shared: Arc<Shared>,
        mtu: usize,
    ) -> Links {
        let (link_idx, ports): (Vec<usize>, Vec<Port>) = ports.into_iter().unzip();
        let chunks_per_frame = (mtu + 14).div_ceil(CHUNK) as u32;
        umem.reserve_tx_slots(tx_slots(ports.len(), chunks_per_frame), chunks_per_frame);
        let sending_slots = sending_slots(ports.len(), chunks_per_frame) as usize;
        let mut by_dir = [None; 6];
        for (i, p) in ports.iter().enumerate() {
            by_dir[usize::from(p.dir.index())] = Some(i);
        }
        let ring = ports.first().map(|p| p.xsk.fill.size()).unwrap_or(2048);
        let fill_max = ring
            .min(umem.chunks() / (2 * ports.len().max(1) as u32))
            .max(16);
        // Busy pollers refill every turn and keep their rings only as deep as the traffic
        // needs (cold chunks cost every round trip); adaptive ones may be away, and keep
        // theirs full.
        let follow = matches!(shared.polling, Polling::Busy);
        let fill = vec![FillDepth::new(fill_max, follow); ports.len()];
        let nports = link_idx.len();
        let faults = link_idx
            .iter()
            .map(|&l| LinkFault::new(0x5eed + l as u64))
            .collect();
        Links {
            shard,
            shared,
            umem,
            ports,
            link_idx,
            by_dir,
            mtu,
            chunks_per_frame,
            sending_slots,
            fill,
            handoffs: HandoffCounts::default(),
            faults,
            levels: vec![1; nports],
        }
    }

    /// The counters of port `port`.
    pub(crate) fn counters(&self, port: usize) -> &LinkCounters {
        &self.shared.links[self.link_idx[port]].counters
    }

    /// The global link index (into `Shared::links`) of each port, in port order.
    pub(crate) fn link_indices(&self) -> &[usize] {
        &self.link_idx
    }

    /// The port of this poller's link in direction `dir`.
    pub(crate) fn port_of(&self, dir: Dir) -> Option<usize> {
        self.by_dir[usize::from(dir.index())]
    }

    /// The links a new frame may take now: this poller's with room on their TX ring, other
    /// pollers' whose hand-off queue has room, none in `reserved` (links that frames in
    /// transit wait for: new frames leave them alone).
    pub(crate) fn room(&mut self, reserved: DirSet) -> DirSet {
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
        room.minus(reserved)
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
    /// checked [`Links::ready`].
    pub(crate) fn send_one(
        &mut self,
        room: DirSet,
        build: impl FnOnce(DirSet, &mut [u8], Option<Keep<'_>>) -> Option<Outbound>,
    ) -> bool {
        // A frame's descriptors, on the stack: an allocation per frame sent showed in the
        // latency of every round trip.
        let mut descs = [XdpDesc::default(); MAX_FRAME_CHUNKS];
        let out = if self.chunks_per_frame > 1 {
            self.build_in_slot(room, &mut descs, build)
        } else {
            self.build_in_chunk(room, &mut descs, build)
        };
        let Some((dir, n)) = out else {
            return false;
        };
        let descs = &descs[..n];
        match self.port_of(dir) {
            Some(o) => self.push(o, descs),
            None => {
                // Another poller's link: hand the frame over (copied).
                let bytes = self.take_bytes(descs);
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

    /// [`Links::send_one`] for frames larger than a chunk: built where it is sent, in a
    /// transmit slot whose chunks are adjacent, so the frame is written once and its
    /// descriptors are the chunks it covers.
    fn build_in_slot(
        &mut self,
        room: DirSet,
        descs: &mut [XdpDesc; MAX_FRAME_CHUNKS],
        build: impl FnOnce(DirSet, &mut [u8], Option<Keep<'_>>) -> Option<Outbound>,
    ) -> Option<(Dir, usize)> {
        let base = self.umem.alloc_slot()?;
        // The engine may keep the frame here for retransmission instead of a copy, while
        // slots are plentiful.
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
            Some(Outbound { dir, len, kept }) => {
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
    }

    /// [`Links::send_one`] for frames that fit one chunk.
    fn build_in_chunk(
        &mut self,
        room: DirSet,
        descs: &mut [XdpDesc; MAX_FRAME_CHUNKS],
        build: impl FnOnce(DirSet, &mut [u8], Option<Keep<'_>>) -> Option<Outbound>,
    ) -> Option<(Dir, usize)> {
        let addr = self.umem.alloc()?;
        let buf = self.umem.slice_mut(addr, CHUNK);
        match build(room, buf, None) {
            Some(Outbound { dir, len, .. }) => {
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
    }

    /// A frame's bytes in one piece, its buffers given back (to hand it to another poller).
    fn take_bytes(&mut self, descs: &[XdpDesc]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for d in descs {
            bytes.extend_from_slice(self.umem.slice(d.addr, d.len as usize));
        }
        self.release_parts(descs);
        bytes
    }

    /// Puts a frame's descriptors on port `o`'s TX ring, with the link's MAC addresses
    /// (and the link's injected faults, when a test set some).
    pub(crate) fn push(&mut self, o: usize, descs: &[XdpDesc]) {
        let (src, dst) = (self.ports[o].local_mac, self.ports[o].neighbor_mac);
        let n = (descs[0].len as usize).min(torusnet_proto::wire::HEADERS_LEN);
        let head = self.umem.slice_mut(descs[0].addr, n);
        head[0..6].copy_from_slice(&dst.unwrap_or([0xff; 6]));
        head[6..12].copy_from_slice(&src);
        torusnet_proto::wire::raise_cong(head, self.levels[o]);
        if !self.faults[o].active() {
            self.put(o, descs);
            return;
        }
        match self.faults[o].judge(descs) {
            Verdict::Hold => {
                add(&self.counters(o).fault_reordered, 1);
                return;
            }
            Verdict::Pass => self.put(o, descs),
            Verdict::Duplicate => {
                self.put(o, descs);
                let mut bytes = Vec::new();
                for d in descs {
                    bytes.extend_from_slice(self.umem.slice(d.addr, d.len as usize));
                }
                if let Some(copy) = self.copy_in(o, &bytes) {
                    self.put(o, &copy);
                    add(&self.counters(o).fault_duplicated, 1);
                }
            }
        }
        self.release_held(o);
    }

    /// Sends the frame port `o` holds back, if its TX ring has room (else it waits for the
    /// next frame or kick).
    fn release_held(&mut self, o: usize) {
        let Some(h) = self.faults[o].take_held() else {
            return;
        };
        if self.ports[o].xsk.tx.free() >= h.descs().len() as u32 {
            self.put(o, h.descs());
        } else {
            self.faults[o].keep_held(h);
        }
    }

    /// Sets the faults of our link `dir` (whether it is ours): the drop in the XDP program,
    /// duplication and reordering here (so frames passing through to that link stop
    /// taking the XDP program's way out, which would skip them).
    pub(crate) fn set_fault(&mut self, dir: Dir, f: &Fault) -> Result<bool, String> {
        let Some(o) = self.port_of(dir) else {
            return Ok(false);
        };
        if let Some(x) = &self.shared.xdp {
            let mut x = x.lock();
            x.set_fault_drop(dir, f.drop).map_err(|e| e.to_string())?;
            x.set_faulty(dir, f.duplicate > 0.0 || f.reorder > 0.0)
                .map_err(|e| e.to_string())?;
        }
        self.faults[o].set(f);
        self.release_held(o);
        Ok(true)
    }

    /// Writes a frame's descriptors on port `o`'s TX ring as they are.
    fn put(&mut self, o: usize, descs: &[XdpDesc]) {
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
        self.shared.shards[owner].hand_off(h, &mut self.handoffs)
    }

    /// Moves a received frame's descriptors (from port `from`) to the TX ring of the first
    /// next-hop link with room, rewriting the Ethernet addresses for that link. No copy:
    /// the UMEM is shared. Else hands it to the poller of another next hop (copied).
    /// Whether the frame was taken (sent, handed over, or dropped by a full hand-off).
    pub(crate) fn forward(&mut self, from: usize, hops: DirSet, descs: &[XdpDesc]) -> bool {
        let need = descs.len() as u32;
        for d in hops.iter() {
            let Some(o) = self.port_of(d) else {
                continue;
            };
            if self.ports[o].xsk.tx.outstanding() + need > TX_QUEUE_LIMIT {
                add(&self.counters(o).tx_ring_full, 1);
                continue;
            }
            self.push(o, descs);
            add(&self.counters(from).forwarded, 1);
            return true;
        }
        // No link of ours can take it: a link of another poller (copied across).
        for d in hops.iter() {
            let Some(owner) = self.shared.link_shard[usize::from(d.index())] else {
                continue;
            };
            if owner == self.shard || self.shared.shards[owner].handoff.is_full() {
                continue;
            }
            let bytes = self.take_bytes(descs);
            // A full queue (another poller may have filled it since the check above)
            // drops the frame, counted as a hand-off dropped.
            if self.hand_off(owner, Handoff::Send(d, bytes)) {
                add(&self.counters(from).forwarded, 1);
            }
            return true;
        }
        false
    }

    /// Copies a whole frame into fresh chunks and puts it on the first of `hops` this
    /// poller has, else hands it to the poller of one; whether it went.
    pub(crate) fn send_on(&mut self, hops: DirSet, bytes: Vec<u8>) -> bool {
        if let Some(d) = hops.iter().find(|d| self.port_of(*d).is_some()) {
            self.send_bytes(d, &bytes);
            return true;
        }
        for d in hops.iter() {
            if let Some(owner) = self.shared.link_shard[usize::from(d.index())] {
                return self.hand_off(owner, Handoff::Send(d, bytes));
            }
        }
        false
    }

    /// Copies a whole frame into fresh chunks and puts it on our link `dir`.
    pub(crate) fn send_bytes(&mut self, dir: Dir, bytes: &[u8]) {
        let Some(o) = self.port_of(dir) else {
            self.handoffs.dropped += 1;
            return;
        };
        if let Some(descs) = self.copy_in(o, bytes) {
            self.push(o, &descs);
        }
    }

    /// A frame's bytes copied into fresh chunks for port `o`, if its TX ring and the UMEM
    /// have room (else counted as a full ring).
    fn copy_in(&mut self, o: usize, bytes: &[u8]) -> Option<Vec<XdpDesc>> {
        let need = bytes.len().div_ceil(CHUNK) as u32;
        if self.ports[o].xsk.tx.free() < need || self.umem.free_chunks() < need as usize {
            add(&self.counters(o).tx_ring_full, 1);
            return None;
        }
        let mut descs: Vec<XdpDesc> = Vec::new();
        for part in bytes.chunks(CHUNK) {
            let Some(addr) = self.umem.alloc() else {
                // Counted free above, so not expected; give back what was taken.
                self.release_parts(&descs);
                add(&self.counters(o).tx_ring_full, 1);
                return None;
            };
            self.umem.slice_mut(addr, part.len()).copy_from_slice(part);
            descs.push(XdpDesc {
                addr,
                len: part.len() as u32,
                options: XDP_PKT_CONTD,
            });
        }
        if let Some(last) = descs.last_mut() {
            last.options = 0;
        }
        Some(descs)
    }

    /// Gives the buffers of a frame back to the UMEM.
    pub(crate) fn release_parts(&mut self, parts: &[XdpDesc]) {
        for p in parts {
            self.umem.release(p.addr);
        }
    }

    /// Kicks the TX rings where descriptors wait. Copy mode sends only during a kick, and at
    /// most the TX budget per kick: keep kicking while descriptors wait, not only when new
    /// ones were added (a full ring with nobody kicking stalls the link). Zero-copy kicks
    /// when the ring asks.
    pub(crate) fn kick(&mut self) {
        // A frame held back by fault injection goes at the latest now.
        for o in 0..self.ports.len() {
            self.release_held(o);
        }
        for p in &mut self.ports {
            let waiting = p.unkicked > 0 || p.xsk.tx.outstanding() > 0;
            if waiting && (!p.xsk.info().zero_copy || p.xsk.tx.needs_wakeup()) {
                let _ = p.xsk.kick_tx();
            }
            p.unkicked = 0;
        }
    }

    /// Port `i`'s load, as the telemetry of frames leaving by it records it.
    pub(crate) fn set_level(&mut self, i: usize, level: u8) {
        if let Some(l) = self.levels.get_mut(i) {
            *l = level;
        }
    }

    /// Frees the transmit slots of `released` (frames the transport no longer keeps).
    pub(crate) fn unhold(&mut self, released: &mut Vec<u32>) {
        for h in released.drain(..) {
            self.umem.unhold(h);
        }
    }

    /// How many more chunks the rings can receive into before the next refill: per port,
    /// the fill chunks the kernel can receive into ([`FillDepth::can_take`]) and the room
    /// left in the RX ring, whichever is less.
    pub(crate) fn rx_room_chunks(&mut self) -> u32 {
        let mut chunks = 0u32;
        let free = self.umem.free_chunks() as u32;
        for (p, depth) in self.ports.iter_mut().zip(&self.fill) {
            let fill = depth.can_take(p.xsk.fill.outstanding(), free);
            let rx_room = p.xsk.rx.size() - p.xsk.rx.available(u32::MAX);
            chunks = chunks.saturating_add(fill.min(rx_room));
        }
        chunks
    }

    /// Takes back chunks the kernel has finished sending on port `i`.
    pub(crate) fn complete(&mut self, i: usize) {
        let n = self.ports[i].xsk.comp.available(u32::MAX);
        for k in 0..n {
            let a = self.ports[i].xsk.comp.read(k);
            self.umem.release(a);
        }
        self.ports[i].xsk.comp.release(n);
    }

    /// Keeps port `i`'s fill ring stocked with free chunks.
    pub(crate) fn refill(&mut self, i: usize, now_ns: u64) {
        let outstanding = self.ports[i].xsk.fill.outstanding();
        let want = self.fill[i]
            .want(outstanding, now_ns)
            .min(self.ports[i].xsk.fill.free());
        if want == 0 {
            return;
        }
        let mut n = 0;
        while n < want {
            let Some(a) = self.umem.alloc() else {
                add(&self.counters(i).fill_starved, 1);
                break;
            };
            self.ports[i].xsk.fill.write(n, a);
            n += 1;
        }
        if n > 0 {
            self.fill[i].posted(n);
            self.ports[i].xsk.fill.submit(n);
            self.ports[i].xsk.wake_rx();
        }
    }

    /// Adopts the neighbours' MACs the control process learned (`None`: keep), for frames
    /// sent and for the status.
    pub(crate) fn set_neighbor_macs(&mut self, macs: &[Option<[u8; 6]>; 6]) {
        for (k, p) in self.ports.iter_mut().enumerate() {
            if let Some(m) = macs[usize::from(p.dir.index())] {
                p.neighbor_mac = Some(m);
                self.shared.links[self.link_idx[k]].set_neighbor_mac(m);
            }
        }
    }
}

//! Receiving: frames read off a port's RX ring (whole, or a multi-buffer frame's parts),
//! checked against the link's neighbour, then delivered through the engine, passed on
//! (held in transit while their next link is busy), or handed to the poller that owns
//! their connection; and the frames other pollers hand this one.

use torusnet_proto::node::{Received, RxAction};
use torusnet_proto::topology::{Dir, DirSet};
use torusnet_proto::wire::{Dest, FrameView, Header, Kind, HEADERS_LEN};

use super::services::Routed;
use super::Poller;
use crate::counters::add;
use crate::shared::Handoff;
use crate::transit::Transit;
use crate::transmit::BATCH;
use crate::xsk::sys::XDP_PKT_CONTD;
use crate::xsk::XdpDesc;

impl Poller {
    /// Reads up to a batch of frames from port `i` and acts on each.
    pub(super) fn receive(&mut self, i: usize) -> usize {
        let avail = self.links.ports[i].xsk.rx.available(BATCH);
        if avail == 0 {
            return 0;
        }
        let dir = self.links.ports[i].dir;
        let mut frames = 0;
        for k in 0..avail {
            let port = &mut self.links.ports[i];
            let d = port.xsk.rx.read(k);
            if d.options & XDP_PKT_CONTD != 0 || !port.parts.is_empty() {
                port.parts.push(d);
                if d.options & XDP_PKT_CONTD != 0 {
                    continue;
                }
            }
            frames += 1;
            if self.links.ports[i].parts.is_empty() {
                self.rx_single(i, dir, d);
            } else {
                self.rx_multi(i, dir);
            }
        }
        self.links.ports[i].xsk.rx.release(avail);
        frames
    }

    fn rx_single(&mut self, i: usize, dir: Dir, d: XdpDesc) {
        let c = self.links.counters(i);
        add(&c.rx_frames, 1);
        add(&c.rx_bytes, u64::from(d.len));
        let now = self.now();
        let frame = self.links.umem.slice(d.addr, d.len as usize);
        if !self.links.ports[i].is_from_neighbor(frame) {
            add(&self.links.counters(i).drop_bad_mac, 1);
            self.links.umem.release(d.addr);
            return;
        }
        if let Some(owner) = self.foreign_owner(frame) {
            let bytes = frame.to_vec();
            self.links.hand_off(owner, Handoff::Deliver(bytes));
            self.links.umem.release(d.addr);
            return;
        }
        let action = if self.delivery.may_lend() {
            // SAFETY: the chunk came off the RX ring and stays ours until it is released
            // below, after the last use of `frame` and of the message lent from it; the
            // services' answers are written only into chunks the UMEM hands out.
            let frame = unsafe { self.links.umem.held_mut(d.addr, d.len as usize) };
            match self.node.handle_rx_lending(now, dir, frame) {
                Received::Message(m) => {
                    // The services read the message where it lies and may answer straight
                    // into a frame of their own (a round trip's answer skips the queue).
                    let reserved = self.transit.wanted();
                    let mut engine = Routed::sending(
                        &mut self.node,
                        &self.shared,
                        self.shard,
                        &mut self.links,
                        reserved,
                    );
                    let buf = &mut self.delivery.msg_buf;
                    let copied = self.services.take_lent(&mut engine, now, &m, buf);
                    self.links.umem.release(d.addr);
                    self.hand_on_lent(copied);
                    return;
                }
                Received::Action(a) => a,
            }
        } else {
            let frame = self.links.umem.slice_mut(d.addr, d.len as usize);
            self.node.handle_rx(now, dir, frame)
        };
        match action {
            RxAction::Consumed => self.links.umem.release(d.addr),
            RxAction::Drop(r) => {
                self.links.counters(i).drop(r);
                self.links.umem.release(d.addr);
            }
            RxAction::Forward(hops) => self.forward_or_hold(i, hops, &[d]),
        }
    }

    fn rx_multi(&mut self, i: usize, dir: Dir) {
        let parts = std::mem::take(&mut self.links.ports[i].parts);
        self.rx_parts(i, dir, &parts);
        self.recycle_parts(i, parts);
    }

    /// Acts on the multi-buffer frame in `parts` from port `i`: passed on from its first
    /// buffer when that is enough, else assembled in the scratch buffer and run through the
    /// engine.
    fn rx_parts(&mut self, i: usize, dir: Dir, parts: &[XdpDesc]) {
        let total: usize = parts.iter().map(|p| p.len as usize).sum();
        let c = self.links.counters(i);
        add(&c.rx_frames, 1);
        add(&c.rx_bytes, total as u64);
        if total > self.scratch.len() {
            add(&self.links.counters(i).drop_malformed, 1);
            self.links.release_parts(parts);
            return;
        }
        if self.forward_by_head(i, parts, total) {
            return;
        }
        let mut at = 0;
        for p in parts {
            let s = self.links.umem.slice(p.addr, p.len as usize);
            self.scratch[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        if !self.links.ports[i].is_from_neighbor(&self.scratch[..total]) {
            add(&self.links.counters(i).drop_bad_mac, 1);
            self.links.release_parts(parts);
            return;
        }
        if let Some(owner) = self.foreign_owner(&self.scratch[..total]) {
            let bytes = self.scratch[..total].to_vec();
            self.links.hand_off(owner, Handoff::Deliver(bytes));
            self.links.release_parts(parts);
            return;
        }
        let now = self.now();
        let mut scratch = std::mem::take(&mut self.scratch);
        let action = if self.delivery.may_lend() {
            match self.node.handle_rx_lending(now, dir, &mut scratch[..total]) {
                Received::Message(m) => {
                    let reserved = self.transit.wanted();
                    let mut engine = Routed::sending(
                        &mut self.node,
                        &self.shared,
                        self.shard,
                        &mut self.links,
                        reserved,
                    );
                    let buf = &mut self.delivery.msg_buf;
                    let copied = self.services.take_lent(&mut engine, now, &m, buf);
                    self.scratch = scratch;
                    self.links.release_parts(parts);
                    self.hand_on_lent(copied);
                    return;
                }
                Received::Action(a) => a,
            }
        } else {
            self.node.handle_rx(now, dir, &mut scratch[..total])
        };
        match action {
            RxAction::Consumed => self.links.release_parts(parts),
            RxAction::Drop(r) => {
                self.links.counters(i).drop(r);
                self.links.release_parts(parts);
            }
            RxAction::Forward(hops) => {
                // The header (TTL) changed in the scratch copy; it lies in the first
                // buffer, so write that buffer back and move all of them.
                let first = parts[0];
                let n = first.len as usize;
                self.links
                    .umem
                    .slice_mut(first.addr, n)
                    .copy_from_slice(&scratch[..n]);
                self.forward_or_hold(i, hops, parts);
            }
        }
        self.scratch = scratch;
    }

    /// Handles a multi-buffer frame passing through (or dropped) from its first buffer
    /// alone, which holds its headers: a jumbo frame forwarded is moved between rings
    /// without being copied into one piece. False when the frame is for this server, an
    /// interceptor reads it, or the first buffer is not all headers and neighbour: the
    /// caller then assembles it.
    fn forward_by_head(&mut self, i: usize, parts: &[XdpDesc], total: usize) -> bool {
        let Some(&first) = parts.first() else {
            return false;
        };
        let n = first.len as usize;
        if n < HEADERS_LEN
            || !self.links.ports[i].is_from_neighbor(self.links.umem.slice(first.addr, n))
        {
            return false;
        }
        let head = self.links.umem.slice_mut(first.addr, n);
        let Some(action) = self.node.handle_rx_head(head, total) else {
            return false;
        };
        match action {
            RxAction::Forward(hops) => self.forward_or_hold(i, hops, parts),
            RxAction::Drop(r) => {
                self.links.counters(i).drop(r);
                self.links.release_parts(parts);
            }
            RxAction::Consumed => self.links.release_parts(parts),
        }
        true
    }

    /// Gives the (emptied) parts vector back to port `i`, keeping its allocation.
    fn recycle_parts(&mut self, i: usize, mut parts: Vec<XdpDesc>) {
        parts.clear();
        self.links.ports[i].parts = parts;
    }

    /// Sends a frame passing through on one of `hops`, or holds it until a link has room
    /// (behind frames already waiting for those links, so none overtakes another); drops
    /// it, counted, only when the transit queue is full.
    fn forward_or_hold(&mut self, from: usize, hops: DirSet, descs: &[XdpDesc]) {
        let queued_before = self.transit.wanted().bits() & hops.bits() != 0;
        if !queued_before && self.links.forward(from, hops, descs) {
            return;
        }
        if self.transit.push(hops, descs, from) {
            add(&self.links.counters(from).forward_waited, 1);
        } else if !(queued_before && self.links.forward(from, hops, descs)) {
            add(&self.links.counters(from).drop_no_room, 1);
            self.links.release_parts(descs);
        }
    }

    /// Sends what waits in transit, oldest first, on links that have room now.
    pub(super) fn drain_transit(&mut self) -> usize {
        if self.transit.is_empty() {
            return 0;
        }
        let mut t = std::mem::replace(&mut self.transit, Transit::new(0));
        let dead = self.carrier_down;
        let links = &mut self.links;
        let n = t.drain(|hops, descs, from| {
            // Every link it could take lost its carrier: it would wait for ever.
            if hops.bits() & !dead.bits() == 0 {
                add(&links.counters(from).drop_no_room, 1);
                links.release_parts(descs);
                return true;
            }
            links.forward(from, hops, descs)
        });
        self.transit = t;
        n
    }

    /// The poller that must handle `frame` instead of this one: a frame for this server
    /// from a peer whose connection another poller owns.
    fn foreign_owner(&self, frame: &[u8]) -> Option<usize> {
        if self.shared.shards.len() <= 1 {
            return None;
        }
        let h = FrameView::new_checked(frame)
            .and_then(|v| Header::parse(&v))
            .ok()?;
        if h.dst != Dest::Server(self.shared.coord) || h.kind == Kind::Control {
            return None;
        }
        let owner = self.shared.shard_of(h.src);
        (owner != self.shard).then_some(owner)
    }

    /// Frames other pollers passed to this one.
    pub(super) fn take_handoffs(&mut self) -> usize {
        let mut n = 0;
        while n < BATCH as usize {
            let Some(h) = self.me().handoff.pop() else {
                break;
            };
            n += 1;
            match h {
                Handoff::Deliver(mut bytes) => {
                    let now = self.now();
                    if let RxAction::Forward(hops) =
                        self.node.handle_rx(now, Dir::PlusX, &mut bytes)
                    {
                        // The view moved while it was handed over: send it on from here.
                        match hops.iter().find(|d| self.links.port_of(*d).is_some()) {
                            Some(d) => self.links.send_bytes(d, &bytes),
                            None => self.links.handoffs.dropped += 1,
                        }
                    }
                }
                Handoff::Send(dir, bytes) => self.links.send_bytes(dir, &bytes),
            }
        }
        n
    }
}

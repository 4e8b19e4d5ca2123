//! Sending a message straight into the frame that carries it, with no copy into a queue.
//!
//! [`Transport::send`] copies every message into its service's queue, where it waits in wire
//! form until [`Transport::poll_transmit`] copies it into a frame: two copies of every byte
//! on the sending core. A message that fills more than half a frame gains little from
//! waiting in a queue for something smaller to share its frame, so when nothing else waits
//! [`Transport::send_framing`] writes it into the caller's frame buffer at once: one copy,
//! from the sender's bytes into the frame (in the AF_XDP dataplane, the UMEM the kernel
//! sends from). Everything else about the frame is what `poll_transmit` would have built
//! from the queue had it been called right after `send`: the same header, sequence and
//! message numbers, fences, piggybacked ACK, kept copy and completion record (a test
//! compares the two frame by frame).
//!
//! A smaller message goes straight only by Nagle's rule, when nothing is in flight to its
//! server either: then nothing could share its frame, and queueing it would only have sent
//! it alone in the next frame (a round trip's request and answer). A stream of small
//! messages keeps frames in flight, so its messages still meet in the queue and share
//! frames.
//!
//! Order and fairness are kept by going straight only when nothing waits to be sent: no
//! queued message (of any service), retransmission or ACK is overtaken. A sender whose own
//! messages are queued is refused ([`SendError::WouldBlock`]) until they have gone (a large
//! message) or queued behind them (a small one), and a message that meets another service's
//! queued messages, a repair or an ACK due is queued as `send` queues it (its turn is the
//! fair queue's to give). A large message that would go straight but cannot go at once (the
//! window is closed, no link towards its peer has room, no buffer) is refused rather than
//! queued, so a sender that keeps up with the link never pays the queue's copy; a small one
//! is queued. Any message before its connection's handshake is queued as `send` queues it.

use super::{
    fence_distance, fence_flags, finish_data_frame, flags, seqnum, Dest, Header, Keep, Kind,
    LinkSet, Outgoing, Paths, SendError, SentFrame, Transmit, Transport, ETH_LEN, HEADERS_LEN,
    MSG_HEADER_LEN,
};
use crate::time::Time;

impl Transport {
    /// Whether a message of `len` bytes is one [`Transport::send_framing`] writes straight
    /// into its frame (when nothing waits): reliable, whole in one frame, and more than half
    /// of it. What could still share its frame is smaller, and aggregation gains too little
    /// from holding it back to wait for that (with aggregation off, every frame carries one
    /// message). A driver asks first, and finds no frame buffer for the others.
    #[inline]
    pub fn frames_straight(&self, len: usize, reliable: bool) -> bool {
        let max = self.cfg.max_payload();
        reliable && len <= max && (!self.cfg.aggregate || 2 * (len + MSG_HEADER_LEN) > max)
    }

    /// Whether a small reliable message (one [`Transport::frames_straight`] does not take)
    /// may go straight into a frame of its own, as far as the transport can tell without
    /// looking up its connection or walking its queues: aggregation holds nothing back for
    /// a deadline, and no repair, ACK or announce waits. (The queue used last is asked
    /// first, apart: a sender streaming small messages finds its own there, in one check.)
    #[inline(always)]
    fn may_go_alone(&self, len: usize, reliable: bool) -> bool {
        reliable
            && MSG_HEADER_LEN + len <= self.cfg.max_payload()
            && self.cfg.agg_delay.is_zero()
            && self.announce.is_empty()
            && self.urgent.is_empty()
    }

    /// Whether [`Transport::send_framing`] may write a reliable message of `len` bytes
    /// straight into a frame now, so that a driver should find it a buffer: a large one
    /// ([`Transport::frames_straight`]), or a small one that queueing would likely send alone
    /// in the next frame anyway. For a small message that is Nagle's rule, which
    /// `send_framing` completes: nothing waits to be sent and nothing is in flight to its
    /// server, so no frame is being filled that it could share and no ACK is awaited that a
    /// burst behind it would wait for. A request or answer of a round trip goes so, without
    /// the queue's copy, plan and take; a stream of small messages keeps its queue and
    /// window full, so its messages still meet one another in the queue (and this answer
    /// costs it one check of the queue it joins). `false` for every other message: the
    /// driver calls `send`.
    #[inline]
    pub fn may_frame_straight(&self, len: usize, reliable: bool) -> bool {
        self.frames_straight(len, reliable)
            || (!self.queues.last_holding() && self.may_go_alone(len, reliable))
    }

    /// As [`Transport::send`], but a message [`Transport::may_frame_straight`] takes is
    /// written straight into `buf` (which holds `mtu + 14` bytes; an empty one when the
    /// driver has none free) and the frame returned (`Ok(Some(..))`), on a link in `room`,
    /// as [`Transport::poll_transmit`] would have built it from the queue. `Ok(None)`:
    /// queued as `send` queues it (a small message with something in flight or waiting, or
    /// before its connection's handshake; any message that meets another service's
    /// messages, a repair or an ACK waiting; a small message also when it cannot go at
    /// once). `Err(WouldBlock)`: a large message would go straight but cannot
    /// now (the sender's own messages are queued, the window is closed, no link has room,
    /// no buffer); nothing was taken, try again after the next transmit.
    pub fn send_framing(
        &mut self,
        now: Time,
        m: Outgoing<'_>,
        room: LinkSet,
        paths: &impl Paths,
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Result<Option<Transmit>, SendError> {
        let len = m.data.len();
        let large = self.frames_straight(len, m.reliable);
        if !large && (self.queues.last_holding() || !self.may_go_alone(len, m.reliable)) {
            return self.send(now, m).map(|()| None);
        }
        self.frame_straight(now, m, large, (room, paths), buf, keep)
    }

    /// [`Transport::send_framing`] for a message that may go straight (`large`, or small
    /// with nothing waiting): the connection's part.
    #[inline(never)]
    fn frame_straight(
        &mut self,
        now: Time,
        m: Outgoing<'_>,
        large: bool,
        (room, paths): (LinkSet, &impl Paths),
        buf: &mut [u8],
        keep: Option<Keep<'_>>,
    ) -> Result<Option<Transmit>, SendError> {
        let len = m.data.len();
        if m.dest == self.local {
            return self.send(now, m).map(|()| None);
        }
        let Some(conn) = self
            .conns
            .get_mut(&m.dest)
            .filter(|c| c.life.established() && (large || c.send.in_flight() == 0))
        else {
            return self.send(now, m).map(|()| None);
        };
        let (own, others) = self.queues.holding(m.from);
        if own && large {
            // The sender's queued messages go first; it is refused until they have gone,
            // and then goes straight again (queueing behind them would only keep it queueing).
            return Err(SendError::WouldBlock);
        }
        if own || others || !self.announce.is_empty() || !self.urgent.is_empty() {
            // Another service's turn, a repair or an ACK is due: waiting in line is fair.
            return self.send(now, m).map(|()| None);
        }
        let usable = paths.links_for(m.dest, m.from).and(room);
        let link = if conn.send.can_send(false) && buf.len() >= ETH_LEN + self.cfg.mtu {
            conn.next_link(usable)
        } else {
            None
        };
        let Some(link) = link else {
            // A small message waits in the queue for the room; a large one is handed back.
            return if large {
                Err(SendError::WouldBlock)
            } else {
                self.send(now, m).map(|()| None)
            };
        };
        self.last_now = self.last_now.max(now);
        self.declared = None;
        super::grant(&self.pacing, &mut self.starved, conn);
        let mut h = Header::new(Kind::Data, self.local, Dest::Server(m.dest));
        h.service = m.service;
        h.flags |= flags::RELIABLE | flags::FRAG_FIRST | flags::FRAG_LAST | fence_flags(m.fences);
        h.conn = conn.life.cid();
        h.peer_conn = conn.life.peer_cid().unwrap_or(0);
        buf[HEADERS_LEN..HEADERS_LEN + len].copy_from_slice(m.data);
        let msn = conn.next_msn;
        conn.next_msn += 1;
        conn.sent
            .on_framed_alone(m.from, m.tag, msn, conn.send.next_seq());
        h.msn = seqnum::truncate(msn);
        h.fence = fence_distance(msn, conn.last_fwd);
        if m.fences.forward {
            conn.last_fwd = Some(msn);
        }
        let sent = SentFrame {
            link,
            plen: len,
            messages: 1,
            from: m.from,
        };
        let t = finish_data_frame(
            now,
            h,
            conn,
            sent,
            buf,
            &mut self.stats,
            &mut self.pool,
            keep.and_then(|k| k.handle),
        );
        self.stats.framed_straight += 1;
        super::schedule(&mut self.deadlines, conn);
        Ok(Some(t))
    }
}

//! The sending half of a connection's sliding window: frames in flight kept for
//! retransmission, acknowledgements (cumulative, selective, negative) retiring or
//! re-queueing them, the round-trip estimate, and the coarse retransmission timeout.

use std::collections::VecDeque;
use std::time::Duration;

use super::kept::KeptFrame;
use super::pool::BufferPool;
use super::seqnum;
use crate::time::Time;

/// Settings of the send side.
#[derive(Debug, Clone, Copy)]
pub struct SendConfig {
    /// Window in frames: at most this many unacknowledged frames in flight.
    pub window: u32,
    /// Lower bound of the retransmission timeout.
    pub min_rto: Duration,
    /// Upper bound of the retransmission timeout (after backoff).
    pub max_rto: Duration,
    /// Timeout before any round trip has been measured.
    pub initial_rto: Duration,
}

/// A duration in nanoseconds, saturating (the bounds are milliseconds).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A frame in flight.
#[derive(Debug)]
struct Inflight {
    bytes: KeptFrame,
    sent_at: Time,
    retransmitted: bool,
    queued: bool,
    sacked: bool,
}

/// Send-side window state of one connection.
#[derive(Debug)]
pub struct SendWindow {
    cfg: SendConfig,
    /// Oldest unacknowledged sequence number.
    una: u64,
    /// Next sequence number to assign.
    next: u64,
    /// Frames [una, next), index = seq - una.
    slots: VecDeque<Inflight>,
    /// Sequence numbers queued for retransmission.
    retx: VecDeque<u64>,
    rto_deadline: Option<Time>,
    backoff: u32,
    /// The round-trip estimate in nanoseconds, as [`Time`] counts: `Duration` arithmetic
    /// (normalising seconds and nanoseconds at every step) was a tenth of a ping-pong's
    /// transport work.
    srtt_ns: Option<u64>,
    rttvar_ns: u64,
    /// The configuration's bounds, in nanoseconds.
    min_rto_ns: u64,
    max_rto_ns: u64,
    initial_rto_ns: u64,
    /// The first sequence number the peer's receive window does not cover (None: the peer
    /// states none, and only our own window limits).
    peer_edge: Option<u64>,
    /// The congestion window, in frames (never above `cfg.window`).
    cwnd: u64,
}

/// Frames a small frame may go past a full congestion window.
pub const SMALL_HEADROOM: u64 = 4;

/// Message bytes (headers included) up to which a frame counts as small for
/// [`SendWindow::can_send`].
pub const SMALL_FRAME: usize = 512;

impl SendWindow {
    /// An empty window starting at sequence number 0.
    pub fn new(cfg: SendConfig) -> SendWindow {
        SendWindow {
            cfg,
            una: 0,
            next: 0,
            slots: VecDeque::new(),
            retx: VecDeque::new(),
            rto_deadline: None,
            backoff: 0,
            srtt_ns: None,
            rttvar_ns: 0,
            min_rto_ns: nanos(cfg.min_rto),
            max_rto_ns: nanos(cfg.max_rto),
            initial_rto_ns: nanos(cfg.initial_rto),
            peer_edge: None,
            cwnd: u64::from(cfg.window),
        }
    }

    /// Sets the congestion window (frames in flight at most, within the window).
    #[inline(always)]
    pub fn set_cwnd(&mut self, frames: u32) {
        self.cwnd = u64::from(frames.clamp(1, self.cfg.window));
    }

    /// Whether the window has room for one more new frame: ours, and the receive window
    /// the peer last granted. A `small` frame (a request, an answer: [`SMALL_FRAME`]) may
    /// go [`SMALL_HEADROOM`] frames past a full congestion window, so it does not wait for
    /// room a bulk flow to the same peer keeps taking; never past the window itself.
    #[inline(always)]
    pub fn can_send(&self, small: bool) -> bool {
        let cwnd = if small {
            (self.cwnd + SMALL_HEADROOM).min(u64::from(self.cfg.window))
        } else {
            self.cwnd
        };
        self.next - self.una < cwnd && self.peer_edge.is_none_or(|e| self.next < e)
    }

    /// The peer granted `rwnd` frames in its SYNC, before acknowledging anything: past
    /// what it has acknowledged so far (0: it states no window).
    pub fn on_sync_window(&mut self, rwnd: u16) {
        self.peer_edge = (rwnd != 0).then(|| self.una + u64::from(rwnd));
    }

    /// The peer granted `rwnd` frames past its acknowledgement `cum_wire` (0: it states no
    /// window). An acknowledgement older than what we know grants nothing new.
    pub fn on_window(&mut self, cum_wire: u32, rwnd: u16) {
        let cum = seqnum::expand(cum_wire, self.una);
        if cum < self.una || cum > self.next {
            return;
        }
        self.peer_edge = (rwnd != 0).then(|| cum + u64::from(rwnd));
    }

    /// Whether the next new frame fills a congestion window smaller than the window: its
    /// acknowledgement is what lets the next go, so the receiver should not delay it.
    #[inline(always)]
    pub fn fills_cwnd(&self) -> bool {
        self.cwnd < u64::from(self.cfg.window) && self.next - self.una + 1 >= self.cwnd
    }

    /// Frames in flight (sent, not cumulatively acknowledged).
    pub fn in_flight(&self) -> u64 {
        self.next - self.una
    }

    /// The sequence number the next new frame gets.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Records a new frame, already carrying sequence number [`SendWindow::next_seq`], as
    /// sent at `now`. The caller checked [`SendWindow::can_send`].
    pub fn on_sent(&mut self, now: Time, bytes: Vec<u8>) {
        self.on_sent_frame(now, KeptFrame::Owned(bytes));
    }

    /// As [`SendWindow::on_sent`], the frame kept as `frame` (a copy, or the driver's
    /// buffer).
    #[inline]
    pub fn on_sent_frame(&mut self, now: Time, frame: KeptFrame) {
        self.slots.push_back(Inflight {
            bytes: frame,
            sent_at: now,
            retransmitted: false,
            queued: false,
            sacked: false,
        });
        self.next += 1;
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(self.rto_from(now));
        }
    }

    /// The current retransmission timeout: srtt + 4 rttvar, clamped, doubled per backoff.
    pub fn rto(&self) -> Duration {
        Duration::from_nanos(self.rto_ns())
    }

    fn rto_ns(&self) -> u64 {
        let base = match self.srtt_ns {
            Some(s) => s.saturating_add(self.rttvar_ns.saturating_mul(4)),
            None => self.initial_rto_ns,
        };
        let base = base.clamp(self.min_rto_ns, self.max_rto_ns);
        base.saturating_mul(1u64 << self.backoff.min(6))
            .min(self.max_rto_ns)
    }

    /// When a timeout started at `now` expires.
    fn rto_from(&self, now: Time) -> Time {
        Time(now.0.saturating_add(self.rto_ns()))
    }

    /// How long to wait before answering another NACK for the same frame: about one
    /// round trip, so that one loss is not repaired several times.
    fn retx_guard(&self) -> Duration {
        Duration::from_nanos(self.srtt_ns.unwrap_or(self.min_rto_ns / 4))
    }

    fn sample_rtt(&mut self, rtt_ns: u64) {
        match self.srtt_ns {
            None => {
                self.srtt_ns = Some(rtt_ns);
                self.rttvar_ns = rtt_ns / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(rtt_ns);
                self.rttvar_ns = (self.rttvar_ns.saturating_mul(3).saturating_add(diff)) / 4;
                self.srtt_ns = Some(s.saturating_mul(7).saturating_add(rtt_ns) / 8);
            }
        }
    }

    /// The smoothed round-trip time, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt_ns.map(Duration::from_nanos)
    }

    /// Handles an acknowledgement: `cum_wire` cumulative, `sack` the selective bitmap (if
    /// valid), `nack` whether the peer reported gaps; the buffers of retired frames go back
    /// to `pool`. Returns how many frames it retired, or `None` when the ack acknowledges
    /// frames never sent (ignored).
    pub fn on_ack(
        &mut self,
        now: Time,
        cum_wire: u32,
        sack: Option<u64>,
        nack: bool,
        pool: &mut BufferPool,
    ) -> Option<u64> {
        let cum = seqnum::expand(cum_wire, self.una);
        if cum > self.next {
            return None;
        }
        if cum < self.una {
            // Overtaken by a newer ack (acks striped over several links reorder): its
            // selective bits and gap report are older than what we already know.
            return Some(0);
        }
        let mut retired = 0;
        // Karn's rule, widened: no sample when any retired frame was retransmitted or had
        // been selectively acked already, since then the ACK waited for a repaired gap and
        // the sample would measure loss recovery, not the path.
        let mut clean = sack.is_none_or(|b| b == 0);
        let mut sample = None;
        while self.una < cum {
            let Some(f) = self.slots.pop_front() else {
                break;
            };
            clean &= !f.retransmitted && !f.sacked;
            if self.una + 1 == cum {
                sample = Some(now.0.saturating_sub(f.sent_at.0));
            }
            pool.give_frame(f.bytes);
            self.una += 1;
            retired += 1;
        }
        if let (true, Some(rtt)) = (clean, sample) {
            self.sample_rtt(rtt);
        }
        if retired > 0 {
            self.backoff = 0;
            self.rto_deadline = (self.una < self.next).then(|| self.rto_from(now));
        }
        let mut highest_sacked = None;
        if let Some(mut bits) = sack {
            // Only the set bits: every frame to a peer carries the bitmap, mostly empty.
            while bits != 0 {
                let i = u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                let seq = cum + 1 + i;
                if seq >= self.next {
                    break;
                }
                let idx = (seq - self.una) as usize;
                // No RTT sample from selective acks: they may have waited in the
                // receiver's delayed-ACK timer; the cumulative sample covers the common case.
                if let Some(f) = self.slots.get_mut(idx) {
                    f.sacked = true;
                }
                highest_sacked = Some(seq);
            }
        }
        if nack && cum < self.next {
            // The receiver saw gaps: `cum` is missing, and so is every unsacked frame
            // below the highest sacked one.
            let end = highest_sacked.unwrap_or(cum).max(cum + 1).min(self.next);
            let guard = self.retx_guard();
            for seq in cum..end {
                let idx = (seq - self.una) as usize;
                if let Some(f) = self.slots.get_mut(idx) {
                    if !f.sacked && !f.queued && now.since(f.sent_at) >= guard {
                        f.queued = true;
                        self.retx.push_back(seq);
                    }
                }
            }
        }
        Some(retired)
    }

    /// Fires the coarse retransmission timeout if due: the oldest unacknowledged frame is
    /// queued for retransmission and the timeout backs off. Only the oldest, as MultiEdge
    /// does: NACKs repair the other gaps once the receiver hears from us again.
    pub fn on_timeout(&mut self, now: Time) -> bool {
        let Some(deadline) = self.rto_deadline else {
            return false;
        };
        if now < deadline || self.una == self.next {
            return false;
        }
        let mut queued = false;
        if let Some(f) = self.slots.front_mut() {
            if !f.sacked && !f.queued {
                f.queued = true;
                self.retx.push_back(self.una);
                queued = true;
            }
        }
        self.backoff += 1;
        self.rto_deadline = Some(self.rto_from(now));
        queued
    }

    /// Whether frames wait for retransmission.
    pub fn has_retransmit(&self) -> bool {
        !self.retx.is_empty()
    }

    /// The next frame to retransmit, marked as sent again at `now`: its bytes (or where the
    /// driver keeps them), to be copied out and given fresh acknowledgement fields by the
    /// caller.
    pub fn next_retransmit(&mut self, now: Time) -> Option<&KeptFrame> {
        while let Some(seq) = self.retx.pop_front() {
            if seq < self.una {
                continue;
            }
            let idx = (seq - self.una) as usize;
            let Some(f) = self.slots.get_mut(idx) else {
                continue;
            };
            f.queued = false;
            if f.sacked {
                continue;
            }
            f.sent_at = now;
            f.retransmitted = true;
            return Some(&self.slots[idx].bytes);
        }
        None
    }

    /// When the retransmission timer fires next.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.rto_deadline.filter(|_| self.una < self.next)
    }

    /// The oldest unacknowledged sequence number.
    pub fn una(&self) -> u64 {
        self.una
    }

    /// Gives every held frame's buffer back to `pool` and forgets them (the connection is
    /// being reset).
    pub fn release(&mut self, pool: &mut BufferPool) {
        for f in self.slots.drain(..) {
            pool.give_frame(f.bytes);
        }
        self.retx.clear();
        self.una = self.next;
        self.rto_deadline = None;
    }

    /// Bytes held for retransmission by the transport (for memory accounting; frames the
    /// driver keeps are its memory).
    pub fn held_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|f| match &f.bytes {
                KeptFrame::Owned(b) => b.len(),
                KeptFrame::Driver { .. } => 0,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win() -> SendWindow {
        SendWindow::new(SendConfig {
            window: 4,
            min_rto: Duration::from_millis(1),
            max_rto: Duration::from_millis(100),
            initial_rto: Duration::from_millis(2),
        })
    }

    fn ms(n: u64) -> Time {
        Time::from_nanos(n * 1_000_000)
    }

    #[test]
    fn a_small_frame_passes_a_full_congestion_window_by_a_few() {
        let mut w = win();
        w.set_cwnd(1);
        w.on_sent(ms(0), vec![1]);
        assert!(!w.can_send(false));
        // Within the window (4 here): the headroom is cut to it.
        for _ in 0..3 {
            assert!(w.can_send(true));
            w.on_sent(ms(0), vec![1]);
        }
        assert!(!w.can_send(true));
    }

    #[test]
    fn window_fills_and_acks_retire() {
        let mut w = win();
        let mut pool = BufferPool::new(8);
        for _ in 0..4 {
            assert!(w.can_send(false));
            w.on_sent(ms(0), vec![1, 2, 3]);
        }
        assert!(!w.can_send(false));
        assert_eq!(w.on_ack(ms(0), 2, None, false, &mut pool), Some(2));
        assert!(w.can_send(false));
        assert_eq!(w.in_flight(), 2);
        assert_eq!(
            w.on_ack(ms(0), 99, None, false, &mut pool),
            None,
            "acks beyond next are ignored"
        );
    }

    #[test]
    fn nack_queues_the_holes_once() {
        let mut w = win();
        let mut pool = BufferPool::new(8);
        for _ in 0..4 {
            w.on_sent(ms(0), vec![0]);
        }
        // Frames 0 and 2 missing; 1 and 3 arrived (cum 0, sack bits for 1.. = 0b101).
        w.on_ack(ms(5), 0, Some(0b101), true, &mut pool);
        assert!(matches!(w.next_retransmit(ms(5)), Some(KeptFrame::Owned(b)) if b.len() == 1));
        assert!(w.next_retransmit(ms(5)).is_some());
        assert!(w.next_retransmit(ms(5)).is_none());
        // A second NACK right away does not resend them again.
        w.on_ack(ms(5), 0, Some(0b101), true, &mut pool);
        assert!(!w.has_retransmit());
    }

    #[test]
    fn stale_ack_overtaken_by_a_newer_one_is_ignored() {
        let mut w = win();
        let mut pool = BufferPool::new(8);
        for _ in 0..4 {
            w.on_sent(ms(0), vec![0]);
        }
        assert_eq!(w.on_ack(ms(1), 3, None, false, &mut pool), Some(3));
        // An older ack (cum 1, gap report, selective bits) arrives late over another link.
        assert_eq!(w.on_ack(ms(2), 1, Some(0b11), true, &mut pool), Some(0));
        assert!(!w.has_retransmit());
        assert_eq!(w.in_flight(), 1);
    }

    #[test]
    fn timeout_resends_oldest_and_backs_off() {
        let mut w = win();
        let mut pool = BufferPool::new(8);
        w.on_sent(ms(0), vec![0]);
        assert!(!w.on_timeout(ms(0)));
        let d = w.poll_timeout().unwrap();
        assert!(w.on_timeout(d));
        assert!(w.next_retransmit(d).is_some());
        let d2 = w.poll_timeout().unwrap();
        assert!(d2.since(d) > d.since(ms(0)), "backoff doubles the timeout");
        w.on_ack(d2, 1, None, false, &mut pool);
        assert_eq!(w.poll_timeout(), None);
    }
}

//! Timers: connection deadlines, retransmission timeouts, delayed ACKs and NACKs.

use super::*;

impl Transport {
    /// Records `peer`'s current deadline (after anything that may have moved it).
    ///
    /// A connection keeps at most one live entry in the heap, its earliest: a deadline that
    /// moved later leaves the earlier entry to fire early and find nothing to do, which is
    /// cheaper than an entry per change (a busy peer changes its timers with every frame).
    pub(super) fn note(&mut self, peer: Coord) {
        if let Some(c) = self.conns.get_mut(&peer) {
            schedule(&mut self.deadlines, c);
        }
    }

    /// The next time [`Transport::handle_timeout`] must be called, if any (possibly early:
    /// a stale deadline makes a call that finds nothing to do).
    pub fn poll_timeout(&self) -> Option<Time> {
        let mut t: Option<Time> = self.deadlines.peek().map(|r| r.0 .0);
        let mut fold = |x: Option<Time>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        if !self.cfg.agg_delay.is_zero() {
            for i in 0..self.queues.services() {
                let due = self
                    .queues
                    .queue(i)
                    .head()
                    .map(|h| h.enqueued + self.cfg.agg_delay);
                fold(due.filter(|t| *t > self.last_now));
            }
        }
        t
    }

    /// Runs the timers due at `now`: retransmission timeouts, delayed ACKs, NACK retries.
    pub fn handle_timeout(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        while let Some(std::cmp::Reverse((t, peer))) = self.deadlines.peek().copied() {
            if t > now {
                break;
            }
            self.deadlines.pop();
            // Only the connection's live entry counts; others were superseded by it.
            if let Some(c) = self.conns.get_mut(&peer) {
                if c.timer == Some(t) {
                    c.timer = None;
                    due.push(peer);
                }
            }
        }
        for &peer in &due {
            if self.conns.get(&peer).is_some_and(|c| c.life.broken(now)) {
                self.abort(peer, FailReason::Silent);
                continue;
            }
            if let Some(c) = self.conns.get_mut(&peer) {
                c.send.on_timeout(now);
                let needs = c.send.has_retransmit()
                    || c.recv.ack_due(now)
                    || c.recv.nack_due(now)
                    || c.life.sync_due(now);
                if needs {
                    c.enlist(&mut self.urgent);
                }
            }
            self.note(peer);
        }
        self.due = due;
    }
}

/// Records `c`'s current deadline in `deadlines` ([`Transport::note`] for a connection in
/// hand: the paths that run per frame have it already, and a second lookup by peer cost
/// a hash per frame).
#[inline]
pub(super) fn schedule(deadlines: &mut Deadlines, c: &mut Connection) {
    let earliest = |a: Option<Time>, b: Option<Time>| match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    };
    let t = earliest(
        earliest(c.send.poll_timeout(), c.recv.poll_timeout()),
        c.life.poll_timeout(),
    );
    if let Some(t) = t {
        if c.timer.is_none_or(|r| t < r) {
            c.timer = Some(t);
            deadlines.push(std::cmp::Reverse((t, c.peer)));
        }
    }
}

//! The simulator's pending events: a calendar queue of two levels.
//!
//! A binary heap over every link's head frame (25,000 entries at 4096 servers) cost a
//! dozen cache-missing levels per event and was the simulator's largest cost. Events are
//! almost all link arrivals due within a few milliseconds, so they are kept in buckets by
//! due time: only the current bucket's few hundred events are ordered (sorted once when it
//! becomes current, then taken from the end: cheaper than a heap's sift per event, as an
//! event rarely joins the current bucket, links' delays being longer than a bucket).
//! Buckets are `2^SHIFT` ns wide within the current span of `2^SPAN_SHIFT` ns, and a span
//! wide beyond it: a frame is due tens of microseconds after it is sent, and pushing it
//! into one of thousands of narrow buckets missed the cache twice (the bucket's header and
//! its end, 9% of a run), where the few hundred spans' ends stay cached. A span's events
//! are spread over its narrow buckets when it becomes current, in one pass. Events beyond
//! the horizon (timers) wait in an overflow heap. Events come out in exactly the order of
//! one heap over all of them, `(time, id, address)`, so a run is the same.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Time;

/// `(due, id, address)`: see [`super::Sim`].
pub(super) type Entry = (Time, u32, u64);

/// Width of a bucket: 2^9 ns.
const SHIFT: u32 = 9;
/// Width of a span: 2^14 ns, 32 buckets.
const SPAN_SHIFT: u32 = 14;
/// Buckets in a span.
const PER_SPAN: u64 = 1 << (SPAN_SHIFT - SHIFT);
/// Spans ahead (a power of two): 16.4 us each, 8.4 ms, beyond a full link queue.
const SPANS: u64 = 1 << 9;
/// Bits of an event's place in the current bucket in its sort key (beside the due offset's
/// `SHIFT` and the id's 32).
const PLACE_BITS: u32 = 64 - 32 - SHIFT;

/// Pending events in due order.
pub(super) struct EventQueue {
    /// The current bucket's events, latest first (the next is at the end).
    cur: Vec<Entry>,
    /// Absolute number of the current bucket (`due >> SHIFT`).
    cb: u64,
    /// The later buckets of the current span (`cb >> (SPAN_SHIFT - SHIFT)`), by absolute
    /// number modulo `PER_SPAN`.
    buckets: Vec<Vec<Entry>>,
    /// The later spans within the horizon, by absolute number modulo `SPANS`.
    spans: Vec<Vec<Entry>>,
    /// Events in `buckets` and `spans`.
    in_buckets: usize,
    /// Events due beyond the horizon.
    overflow: BinaryHeap<Reverse<Entry>>,
    /// Scratch for ordering the current bucket: its events' keys.
    keys: Vec<u64>,
    /// Scratch the current bucket is ordered into (swapped with it).
    spare: Vec<Entry>,
}

impl Default for EventQueue {
    fn default() -> EventQueue {
        EventQueue {
            cur: Vec::new(),
            cb: 0,
            buckets: (0..PER_SPAN).map(|_| Vec::new()).collect(),
            spans: (0..SPANS).map(|_| Vec::new()).collect(),
            in_buckets: 0,
            overflow: BinaryHeap::new(),
            keys: Vec::new(),
            spare: Vec::new(),
        }
    }
}

impl EventQueue {
    /// The span of the current bucket.
    fn span(&self) -> u64 {
        self.cb >> (SPAN_SHIFT - SHIFT)
    }

    /// Adds an event.
    #[inline]
    pub(super) fn push(&mut self, e: Entry) {
        let b = e.0 .0 >> SHIFT;
        let s = b >> (SPAN_SHIFT - SHIFT);
        let span = self.span();
        // Due in (or, after a jump ahead, before) the current bucket: ordered now.
        if b <= self.cb {
            let at = self.cur.partition_point(|x| *x > e);
            self.cur.insert(at, e);
        } else if s == span {
            self.buckets[(b % PER_SPAN) as usize].push(e);
            self.in_buckets += 1;
        } else if s < span + SPANS {
            self.spans[(s % SPANS) as usize].push(e);
            self.in_buckets += 1;
        } else {
            self.overflow.push(Reverse(e));
        }
    }

    /// Whether no event is pending.
    pub(super) fn is_empty(&self) -> bool {
        self.cur.is_empty() && self.in_buckets == 0 && self.overflow.is_empty()
    }

    /// The next event, left in place.
    pub(super) fn peek(&mut self) -> Option<Entry> {
        self.fill();
        self.cur.last().copied()
    }

    /// The event after the next, if it is due in the current bucket (without moving on).
    pub(super) fn peek_second(&self) -> Option<Entry> {
        let n = self.cur.len();
        n.checked_sub(2).map(|i| self.cur[i])
    }

    /// Takes the next event.
    pub(super) fn pop(&mut self) -> Option<Entry> {
        self.fill();
        self.cur.pop()
    }

    /// Makes the current bucket hold the earliest events, moving on to the next non-empty
    /// bucket (or jumping to the overflow's first) when it ran out.
    fn fill(&mut self) {
        while self.cur.is_empty() {
            let span = self.span();
            if self.in_buckets == 0 {
                let Some(Reverse(first)) = self.overflow.peek() else {
                    return;
                };
                self.cb = self.cb.max(first.0 .0 >> SHIFT);
            } else {
                self.cb += 1;
            }
            if self.span() != span {
                self.enter_span();
            }
            let bucket = &mut self.buckets[(self.cb % PER_SPAN) as usize];
            self.in_buckets -= bucket.len();
            // The bucket's storage is swapped in rather than copied (both keep capacity),
            // unless events moved in from the overflow already.
            if self.cur.is_empty() {
                std::mem::swap(&mut self.cur, bucket);
            } else {
                self.cur.append(bucket);
            }
            self.order_current();
        }
    }

    /// The current bucket moved into a new span: its events are spread over the span's
    /// buckets, and events of the overflow now within the horizon move in.
    fn enter_span(&mut self) {
        let span = self.span();
        let mut events = std::mem::take(&mut self.spans[(span % SPANS) as usize]);
        for e in events.drain(..) {
            let b = e.0 .0 >> SHIFT;
            debug_assert!(b >> (SPAN_SHIFT - SHIFT) == span && b >= self.cb);
            self.buckets[(b % PER_SPAN) as usize].push(e);
        }
        // Its storage (kept) is the span's again when it comes round.
        self.spans[(span % SPANS) as usize] = events;
        while let Some(Reverse(first)) = self.overflow.peek() {
            if first.0 .0 >> SPAN_SHIFT >= span + SPANS {
                break;
            }
            if let Some(Reverse(e)) = self.overflow.pop() {
                self.push(e);
            }
        }
    }

    /// Orders the current bucket latest first. Its events are all due within its 2^SHIFT
    /// ns, so each one's due offset and id fit in one machine word with its place in the
    /// bucket: those words are sorted (a sort of plain integers, without branches to
    /// mispredict) and the events gathered in their order. Paced traffic makes whole
    /// groups of events due at the same nanosecond (at 4096 servers most are in groups of
    /// 32 to 127), so the order among them, by id, is most of the work; a comparison sort
    /// of the 24-byte events was 7% of a run. Events with the same due time and id (only
    /// ever identical wake-ups in the simulator) are put in address order after.
    fn order_current(&mut self) {
        let base = self.cb << SHIFT;
        let n = self.cur.len();
        if n >= 1 << PLACE_BITS {
            self.cur.sort_unstable_by_key(|e| std::cmp::Reverse(*e));
            return;
        }
        self.keys.clear();
        for (k, e) in self.cur.iter().enumerate() {
            debug_assert_eq!(e.0 .0 >> SHIFT, self.cb);
            let off = e.0 .0 - base;
            self.keys
                .push(off << (32 + PLACE_BITS) | u64::from(e.1) << PLACE_BITS | k as u64);
        }
        self.keys.sort_unstable();
        self.spare.clear();
        let cur = &self.cur;
        self.spare.extend(
            self.keys
                .iter()
                .rev()
                .map(|k| cur[(k & ((1 << PLACE_BITS) - 1)) as usize]),
        );
        std::mem::swap(&mut self.cur, &mut self.spare);
        for same in self.cur.chunk_by_mut(|a, b| a.0 == b.0 && a.1 == b.1) {
            if same.len() > 1 {
                same.sort_unstable_by_key(|e| std::cmp::Reverse(e.2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_as_from_one_heap() {
        let mut rng = crate::rng::SplitMix64::new(9);
        let mut q = EventQueue::default();
        let mut heap = BinaryHeap::new();
        let mut now = 0u64;
        for step in 0..200_000u32 {
            // Mostly near-future events, some far (timers), some due now; pops in between.
            if rng.below(3) != 0 {
                let ahead = match rng.below(10) {
                    0 => rng.below(1 << 34),
                    1 => 0,
                    _ => rng.below(1 << 21),
                };
                let e = (Time(now + ahead), rng.below(50) as u32, u64::from(step));
                q.push(e);
                heap.push(Reverse(e));
            } else {
                let want = heap.pop().map(|r| r.0);
                assert_eq!(q.peek(), want);
                assert_eq!(q.pop(), want);
                if let Some(e) = want {
                    now = e.0 .0;
                }
            }
            assert_eq!(q.is_empty(), heap.is_empty());
        }
        while let Some(Reverse(e)) = heap.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert!(q.is_empty() && q.pop().is_none());
    }

    #[test]
    fn crowded_buckets_with_ties_come_out_as_from_one_heap() {
        // Hundreds of events per bucket, many due at the same nanosecond (ordered then by
        // id and address), as at thousands of servers; some pushed into the current bucket.
        let mut rng = crate::rng::SplitMix64::new(4);
        let mut q = EventQueue::default();
        let mut heap = BinaryHeap::new();
        let mut now = 0u64;
        for round in 0..50u64 {
            for k in 0..2000u64 {
                let ahead = rng.below(4 << SHIFT) & !rng.below(8);
                let e = (Time(now + ahead), rng.below(20) as u32, round << 32 | k);
                q.push(e);
                heap.push(Reverse(e));
            }
            for _ in 0..1500 {
                let want = heap.pop().map(|r| r.0);
                assert_eq!(q.pop(), want);
                if let Some(e) = want {
                    now = e.0 .0;
                }
            }
        }
        while let Some(Reverse(e)) = heap.pop() {
            assert_eq!(q.pop(), Some(e));
        }
        assert!(q.is_empty());
    }
}

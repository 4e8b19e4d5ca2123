//! The simulator's pending events: a calendar queue.
//!
//! A binary heap over every link's head frame (25,000 entries at 4096 servers) cost a
//! dozen cache-missing levels per event and was the simulator's largest cost. Events are
//! almost all link arrivals due within a few milliseconds, so they are kept in buckets of
//! `2^SHIFT` ns by due time: only the current bucket's few hundred events are ordered
//! (sorted once when it becomes current, then taken from the end: cheaper than a heap's
//! sift per event, as an event rarely joins the current bucket, links' delays being longer
//! than a bucket); later buckets are plain lists, and events beyond the
//! buckets' horizon (timers) wait in an overflow heap. Events come out in exactly the
//! order of one heap over all of them, `(time, id, address)`, so a run is the same.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::time::Time;

/// `(due, id, address)`: see [`super::Sim`].
pub(super) type Entry = (Time, u32, u64);

/// Width of a bucket: 2^9 ns.
const SHIFT: u32 = 9;
/// Buckets (a power of two): with 512 ns each, 8.4 ms ahead, beyond a full link queue.
const BUCKETS: u64 = 1 << 14;

/// Pending events in due order.
pub(super) struct EventQueue {
    /// The current bucket's events, latest first (the next is at the end).
    cur: Vec<Entry>,
    /// Absolute number of the current bucket (`due >> SHIFT`).
    cb: u64,
    /// Later buckets within the horizon, by absolute number modulo `BUCKETS`.
    buckets: Vec<Vec<Entry>>,
    /// Events in `buckets`.
    in_buckets: usize,
    /// Events due beyond the horizon.
    overflow: BinaryHeap<Reverse<Entry>>,
}

impl Default for EventQueue {
    fn default() -> EventQueue {
        EventQueue {
            cur: Vec::new(),
            cb: 0,
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            in_buckets: 0,
            overflow: BinaryHeap::new(),
        }
    }
}

impl EventQueue {
    /// Adds an event.
    pub(super) fn push(&mut self, e: Entry) {
        let b = e.0 .0 >> SHIFT;
        // Due in (or, after a jump ahead, before) the current bucket: ordered now.
        if b <= self.cb {
            let at = self.cur.partition_point(|x| *x > e);
            self.cur.insert(at, e);
        } else if b < self.cb + BUCKETS {
            self.buckets[(b % BUCKETS) as usize].push(e);
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
            if self.in_buckets == 0 {
                let Some(Reverse(first)) = self.overflow.peek() else {
                    return;
                };
                self.cb = self.cb.max(first.0 .0 >> SHIFT);
            } else {
                self.cb += 1;
            }
            while let Some(Reverse(first)) = self.overflow.peek() {
                if first.0 .0 >> SHIFT >= self.cb + BUCKETS {
                    break;
                }
                if let Some(Reverse(e)) = self.overflow.pop() {
                    self.push(e);
                }
            }
            let bucket = &mut self.buckets[(self.cb % BUCKETS) as usize];
            self.in_buckets -= bucket.len();
            // The bucket's storage is swapped in rather than copied (both keep capacity),
            // unless events moved in from the overflow already.
            if self.cur.is_empty() {
                std::mem::swap(&mut self.cur, bucket);
            } else {
                self.cur.append(bucket);
            }
            // Every event here is due in bucket `cb`: its time is the bucket's start and
            // fewer than 2^SHIFT ns, so one 128-bit key orders it as the tuple does (two
            // machine compares instead of three branching ones: the sort was 7% of a run).
            let base = self.cb << SHIFT;
            self.cur.sort_unstable_by_key(|e| {
                debug_assert_eq!(e.0 .0 >> SHIFT, self.cb);
                let off = u128::from(e.0 .0 - base);
                std::cmp::Reverse(off << 96 | u128::from(e.1) << 64 | u128::from(e.2))
            });
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
}

//! Multicast bytes that members' sinks delivered for this server's applications and the
//! applications' host has not written into their channels yet: a bounded queue per service.
//! The multicast service fills it (`crate::apps::multicast`'s sinks), the host empties it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use torusnet_services::multicast::wire::Transfer;

/// Bytes one service's queue holds at most (what its application has not read yet).
const INBOX_BYTES: usize = 4 << 20;
/// Transfers remembered as dropped (their application left) until their member asks.
const MAX_DROPPED: usize = 1024;

/// One thing for an application: bytes of a transfer, or its end.
#[derive(Debug)]
pub enum Delivery {
    /// The transfer's bytes at `offset`, in order.
    Data {
        /// The transfer.
        t: Transfer,
        /// Where they start.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The transfer ended here (every byte delivered, or not).
    End {
        /// The transfer.
        t: Transfer,
        /// Every byte was delivered.
        complete: bool,
    },
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Delivery>,
    bytes: usize,
}

/// Where a transfer's deliveries to an application stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    /// Every one reached the application's channel.
    All,
    /// Some still wait in the queue.
    Waiting,
    /// Some were dropped: the application left.
    Dropped,
}

/// The queues, by service id.
#[derive(Debug, Default)]
pub struct McastInbox {
    queues: Mutex<HashMap<u16, Queue>>,
    /// Transfers whose queued deliveries were dropped because their application left.
    dropped: Mutex<HashSet<u64>>,
    /// Deliveries queued, over every service: the host's every turn looks here first, and
    /// takes the lock only when something waits.
    queued: AtomicUsize,
}

impl McastInbox {
    /// Queues bytes of `t` for its service; false when its queue is full (offered again).
    pub fn offer(&self, t: &Transfer, offset: u64, data: &[u8]) -> bool {
        let mut qs = self.queues.lock();
        let q = qs.entry(t.service).or_default();
        if q.bytes + data.len() > INBOX_BYTES && !q.items.is_empty() {
            return false;
        }
        q.bytes += data.len();
        q.items.push_back(Delivery::Data {
            t: *t,
            offset,
            data: data.to_vec(),
        });
        self.queued.fetch_add(1, Ordering::Release);
        true
    }

    /// Queues the end of `t`: always taken (it carries no bytes), so every transfer ends once
    /// for its application.
    pub fn end(&self, t: &Transfer, complete: bool) {
        let mut qs = self.queues.lock();
        qs.entry(t.service)
            .or_default()
            .items
            .push_back(Delivery::End { t: *t, complete });
        self.queued.fetch_add(1, Ordering::Release);
    }

    /// Where transfer `id`'s deliveries to service `service` stand (`Dropped` is answered
    /// once).
    pub fn flushed(&self, service: u16, id: u64) -> Flushed {
        if self.dropped.lock().remove(&id) {
            return Flushed::Dropped;
        }
        let waiting = self.queues.lock().get(&service).is_some_and(|q| {
            q.items.iter().any(|d| match d {
                Delivery::Data { t, .. } | Delivery::End { t, .. } => t.id == id,
            })
        });
        if waiting {
            Flushed::Waiting
        } else {
            Flushed::All
        }
    }

    /// Whether anything waits for service `id`.
    pub fn waiting_for(&self, id: u16) -> bool {
        self.queued.load(Ordering::Acquire) > 0
            && self
                .queues
                .lock()
                .get(&id)
                .is_some_and(|q| !q.items.is_empty())
    }

    /// Hands every service's deliveries, in order, to `take`: `Some(true)` took it,
    /// `Some(false)` has no room now (the rest of that service's wait), `None` nobody takes
    /// that service any more (its queue is dropped). Returns how many were taken.
    pub fn drain(&self, mut take: impl FnMut(u16, &Delivery) -> Option<bool>) -> usize {
        if self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut n = 0;
        let mut qs = self.queues.lock();
        for (id, q) in qs.iter_mut() {
            while let Some(d) = q.items.front() {
                match take(*id, d) {
                    Some(true) => {
                        if let Some(Delivery::Data { data, .. }) = q.items.pop_front() {
                            q.bytes = q.bytes.saturating_sub(data.len());
                        }
                        self.queued.fetch_sub(1, Ordering::AcqRel);
                        n += 1;
                    }
                    Some(false) => break,
                    None => {
                        self.queued.fetch_sub(q.items.len(), Ordering::AcqRel);
                        let mut dropped = self.dropped.lock();
                        for d in q.items.drain(..) {
                            if dropped.len() < MAX_DROPPED {
                                let (Delivery::Data { t, .. } | Delivery::End { t, .. }) = d;
                                dropped.insert(t.id);
                            }
                        }
                        q.bytes = 0;
                    }
                }
            }
        }
        qs.retain(|_, q| !q.items.is_empty());
        n
    }
}

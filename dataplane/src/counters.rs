//! Per-link counters, written by the poller that owns the link and read by status queries
//! from any thread (relaxed atomics: each is exact, a snapshot of several is approximate).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use torusnet_proto::node::DropReason;

/// Counters of one link.
#[derive(Debug, Default)]
pub struct LinkCounters {
    /// Frames received from the link's AF_XDP socket.
    pub rx_frames: AtomicU64,
    /// Their bytes.
    pub rx_bytes: AtomicU64,
    /// Frames put on the link's TX ring.
    pub tx_frames: AtomicU64,
    /// Their bytes.
    pub tx_bytes: AtomicU64,
    /// Frames received here and sent on towards another server (descriptor moved between
    /// rings of the shared UMEM: no copy in userspace).
    pub forwarded: AtomicU64,
    /// Drops: not a well-formed torus frame.
    pub drop_malformed: AtomicU64,
    /// Drops: source coordinate invalid.
    pub drop_bad_source: AtomicU64,
    /// Drops: Ethernet source is not the neighbour on this link.
    pub drop_bad_mac: AtomicU64,
    /// Drops: no live path to the destination.
    pub drop_unreachable: AtomicU64,
    /// Drops: hop budget spent.
    pub drop_ttl: AtomicU64,
    /// Drops: refused by the transport.
    pub drop_transport: AtomicU64,
    /// Drops: a frame of a connection instance that is gone (sent before a restart or a
    /// reset on either side).
    pub drop_stale: AtomicU64,
    /// Drops: consumed by an on-path service.
    pub drop_intercepted: AtomicU64,
    /// Drops: a malformed source route, or one not ending at the frame's destination.
    pub drop_bad_route: AtomicU64,
    /// Drops: the next hop a source route named was down here (its source was told).
    pub drop_path_failed: AtomicU64,
    /// Drops: a frame passing through found no next-hop link with TX room and the transit
    /// queue was full.
    pub drop_no_room: AtomicU64,
    /// Frames passing through that waited in the transit queue for a link to drain.
    pub forward_waited: AtomicU64,
    /// Times the TX ring had no room for a frame the runtime wanted to send.
    pub tx_ring_full: AtomicU64,
    /// Times the fill ring could not be topped up (UMEM exhausted).
    pub fill_starved: AtomicU64,
    /// Frames sent twice by fault injection ([`crate::fault`]).
    pub fault_duplicated: AtomicU64,
    /// Frames held back behind the next one by fault injection.
    pub fault_reordered: AtomicU64,
    /// Gauge: the link's sending utilisation, per mille of its capacity (moving average).
    pub load_tx_permille: AtomicU64,
    /// Gauge: its receiving utilisation, per mille.
    pub load_rx_permille: AtomicU64,
    /// Gauge: frames waiting in its TX ring, x1000 (moving average).
    pub load_queue_milli: AtomicU64,
}

/// A copy of a link's counters.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct LinkCountersSnapshot {
    /// See [`LinkCounters`].
    pub rx_frames: u64,
    /// See [`LinkCounters`].
    pub rx_bytes: u64,
    /// See [`LinkCounters`].
    pub tx_frames: u64,
    /// See [`LinkCounters`].
    pub tx_bytes: u64,
    /// See [`LinkCounters`].
    pub forwarded: u64,
    /// See [`LinkCounters`].
    pub drop_malformed: u64,
    /// See [`LinkCounters`].
    pub drop_bad_source: u64,
    /// See [`LinkCounters`].
    pub drop_bad_mac: u64,
    /// See [`LinkCounters`].
    pub drop_unreachable: u64,
    /// See [`LinkCounters`].
    pub drop_ttl: u64,
    /// See [`LinkCounters`].
    pub drop_transport: u64,
    /// See [`LinkCounters`].
    pub drop_stale: u64,
    /// See [`LinkCounters`].
    pub drop_intercepted: u64,
    /// See [`LinkCounters`].
    pub drop_bad_route: u64,
    /// See [`LinkCounters`].
    pub drop_path_failed: u64,
    /// See [`LinkCounters`].
    pub drop_no_room: u64,
    /// See [`LinkCounters`].
    pub forward_waited: u64,
    /// See [`LinkCounters`].
    pub tx_ring_full: u64,
    /// See [`LinkCounters`].
    pub fill_starved: u64,
    /// See [`LinkCounters`].
    pub fault_duplicated: u64,
    /// See [`LinkCounters`].
    pub fault_reordered: u64,
    /// See [`LinkCounters`].
    pub load_tx_permille: u64,
    /// See [`LinkCounters`].
    pub load_rx_permille: u64,
    /// See [`LinkCounters`].
    pub load_queue_milli: u64,
}

/// Adds `n` to a counter.
#[inline]
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl LinkCounters {
    /// Counts a drop by reason.
    pub fn drop(&self, r: DropReason) {
        let c = match r {
            DropReason::Malformed => &self.drop_malformed,
            DropReason::BadSource => &self.drop_bad_source,
            DropReason::Unreachable => &self.drop_unreachable,
            DropReason::TtlExpired => &self.drop_ttl,
            DropReason::Transport => &self.drop_transport,
            DropReason::Stale => &self.drop_stale,
            DropReason::Intercepted => &self.drop_intercepted,
            DropReason::BadRoute => &self.drop_bad_route,
            DropReason::PathFailed => &self.drop_path_failed,
        };
        add(c, 1);
    }

    /// A consistent-enough copy.
    pub fn snapshot(&self) -> LinkCountersSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LinkCountersSnapshot {
            rx_frames: g(&self.rx_frames),
            rx_bytes: g(&self.rx_bytes),
            tx_frames: g(&self.tx_frames),
            tx_bytes: g(&self.tx_bytes),
            forwarded: g(&self.forwarded),
            drop_malformed: g(&self.drop_malformed),
            drop_bad_source: g(&self.drop_bad_source),
            drop_bad_mac: g(&self.drop_bad_mac),
            drop_unreachable: g(&self.drop_unreachable),
            drop_ttl: g(&self.drop_ttl),
            drop_transport: g(&self.drop_transport),
            drop_stale: g(&self.drop_stale),
            drop_intercepted: g(&self.drop_intercepted),
            drop_bad_route: g(&self.drop_bad_route),
            drop_path_failed: g(&self.drop_path_failed),
            drop_no_room: g(&self.drop_no_room),
            forward_waited: g(&self.forward_waited),
            tx_ring_full: g(&self.tx_ring_full),
            fill_starved: g(&self.fill_starved),
            fault_duplicated: g(&self.fault_duplicated),
            fault_reordered: g(&self.fault_reordered),
            load_tx_permille: g(&self.load_tx_permille),
            load_rx_permille: g(&self.load_rx_permille),
            load_queue_milli: g(&self.load_queue_milli),
        }
    }
}

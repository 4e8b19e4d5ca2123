//! The lifecycle of a connection: which instance of the connection with a peer a frame
//! belongs to, the SYNC handshake that introduces two instances to each other, resets when
//! the peer's instance changes (it restarted, or gave up on us), and the deadline after which
//! a peer that makes no progress is declared broken.
//!
//! Every connection instance draws a fresh non-zero 32-bit id when it is created. Frames of a
//! connection carry the sender's id (`conn`) and the receiver's id as the sender learned it
//! (`peer_conn`); a receiver accepts a frame only when both match what it knows, so frames of
//! an earlier instance on either side, still in flight or retransmitted by a sender that has
//! not noticed the restart, are dropped instead of being taken for the new stream. Only a
//! SYNC frame may change the peer's id: a peer that comes back with a new id resets the
//! connection on this side, and the messages that were not acknowledged are reported failed.
//!
//! The rules, for a SYNC from the peer carrying `(conn, peer_conn)`:
//! - `conn` is one of the peer's retired ids: a straggler, ignored.
//! - `conn` is new while another id was known: the peer's instance changed, so everything
//!   exchanged with the old one is reset (a restart when its incarnation changed too).
//! - in every case the peer's id is now `conn`, and when `peer_conn` is not our id (the
//!   peer does not know us yet, or knows an instance of ours that is gone) we answer with a
//!   SYNC of our own, which completes the handshake on its side.

use std::time::Duration;

use crate::time::Time;
use crate::wire::FrameView;

/// Why messages to a peer were reported failed instead of delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// The peer's dataplane restarted (new incarnation): it lost what it had not
    /// acknowledged.
    PeerRestarted,
    /// The peer dropped its end of the connection (it had declared us broken) and started a
    /// new one.
    PeerReset,
    /// No progress for the connection's deadline: the peer is silent.
    Silent,
    /// The peer is unreachable in this server's view.
    Unreachable,
    /// The engine refused the message (too large, too many peers) after the application's
    /// send had returned.
    Refused,
    /// The peer took the message but no service there does (not, or no longer, hosted):
    /// its transport said so. This can follow the message's acknowledgement.
    NoService,
    /// The peer took the message but the service it was for had fallen behind (its queue
    /// at the peer full): nothing of it was delivered; sending again later may succeed.
    /// Like `NoService`, this can follow the acknowledgement.
    ReceiverFull,
    /// The peer took a message to a routing key but is not the key's root in its view
    /// (`key_gate`): nothing of it was delivered. The engine that sent it sends it to the
    /// key's root again; a service sees this only from a transport driven alone.
    NotRoot,
}

impl FailReason {
    /// What a failed send reports, where the send had already returned to its caller (an
    /// application's, handed on by torusd).
    pub fn of_send(e: super::SendError) -> FailReason {
        match e {
            super::SendError::Unreachable => FailReason::Unreachable,
            super::SendError::NotTaken(why) => why,
            _ => FailReason::Refused,
        }
    }

    /// Short name, for counters and reports.
    pub fn name(self) -> &'static str {
        match self {
            FailReason::PeerRestarted => "peer_restarted",
            FailReason::PeerReset => "peer_reset",
            FailReason::Silent => "silent",
            FailReason::Unreachable => "unreachable",
            FailReason::Refused => "refused",
            FailReason::NoService => "no_service",
            FailReason::ReceiverFull => "receiver_full",
            FailReason::NotRoot => "not_root",
        }
    }
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailReason::PeerRestarted => "the peer restarted",
            FailReason::PeerReset => "the peer reset the connection",
            FailReason::Silent => "the peer made no progress in time",
            FailReason::Unreachable => "the peer is unreachable",
            FailReason::Refused => "the engine refused the message",
            FailReason::NoService => "no service at the peer takes it",
            FailReason::ReceiverFull => "the service at the peer had no room for it",
            FailReason::NotRoot => "the peer is not the key's root",
        })
    }
}

/// What a SYNC from the peer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// A straggler from an instance of the peer already replaced: ignored.
    Stale,
    /// The peer's id was already known.
    Known,
    /// The peer's id is now known (first contact with this instance of ours).
    Adopted,
    /// The peer's instance changed: the caller must reset the connection's streams.
    Reset(FailReason),
}

/// Settings of the lifecycle.
#[derive(Debug, Clone, Copy)]
pub struct LifecycleConfig {
    /// A connection that waits for the peer this long without progress is broken.
    pub broken_after: Duration,
    /// First interval between unanswered SYNCs (doubles up to `broken_after / 8`).
    pub sync_retry: Duration,
}

/// How many superseded ids of the peer are remembered, to recognise stragglers.
const RETIRED: usize = 4;

/// Lifecycle state of one connection.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    cid: u32,
    peer_cid: Option<u32>,
    peer_incarnation: Option<u64>,
    retired: [u32; RETIRED],
    next_retired: usize,
    /// When a SYNC must go out next (none due: `None`).
    sync_at: Option<Time>,
    /// Interval to the next SYNC while unanswered.
    sync_interval: Duration,
    /// The last SYNC sent (answers to stale frames are limited to one per `sync_retry`).
    last_sync: Option<Time>,
    /// Since when the connection has waited for the peer without progress (`None`: it waits
    /// for nothing).
    waiting_since: Option<Time>,
    cfg: LifecycleConfig,
}

impl Lifecycle {
    /// A new instance with id `cid` (non-zero), knowing nothing of the peer yet.
    pub fn new(cid: u32, cfg: LifecycleConfig) -> Lifecycle {
        Lifecycle {
            cid: cid.max(1),
            peer_cid: None,
            peer_incarnation: None,
            retired: [0; RETIRED],
            next_retired: 0,
            sync_at: None,
            sync_interval: cfg.sync_retry,
            last_sync: None,
            waiting_since: None,
            cfg,
        }
    }

    /// This instance's id.
    pub fn cid(&self) -> u32 {
        self.cid
    }

    /// The peer's id, once a SYNC told us.
    pub fn peer_cid(&self) -> Option<u32> {
        self.peer_cid
    }

    /// The peer's incarnation, once a SYNC told us.
    pub fn peer_incarnation(&self) -> Option<u64> {
        self.peer_incarnation
    }

    /// Whether reliable frames may flow: the peer's id is known.
    pub fn established(&self) -> bool {
        self.peer_cid.is_some()
    }

    /// Whether a frame of the connection (data, ACK, NACK) carrying these ids belongs to
    /// this instance and the peer's current one.
    pub fn accepts(&self, conn: u32, peer_conn: u32) -> bool {
        self.peer_cid == Some(conn) && peer_conn == self.cid
    }

    /// Handles a SYNC from the peer.
    pub fn on_sync(
        &mut self,
        now: Time,
        conn: u32,
        peer_conn: u32,
        incarnation: u64,
    ) -> SyncOutcome {
        if conn == 0 || self.retired.contains(&conn) {
            return SyncOutcome::Stale;
        }
        let outcome = match self.peer_cid {
            Some(p) if p == conn => SyncOutcome::Known,
            Some(p) => {
                self.retired[self.next_retired] = p;
                self.next_retired = (self.next_retired + 1) % RETIRED;
                let restarted = self.peer_incarnation.is_some_and(|i| i != incarnation);
                SyncOutcome::Reset(if restarted {
                    FailReason::PeerRestarted
                } else {
                    FailReason::PeerReset
                })
            }
            None => SyncOutcome::Adopted,
        };
        self.peer_cid = Some(conn);
        self.peer_incarnation = Some(incarnation);
        self.sync_interval = self.cfg.sync_retry;
        if peer_conn == self.cid {
            self.sync_at = None;
        } else {
            // The peer does not know this instance (yet): tell it, once.
            self.sync_at = Some(now);
        }
        outcome
    }

    /// Handles the peer's announcement that it (re)started with `incarnation`: when this
    /// connection knew an older incarnation, that instance is gone, and the caller resets the
    /// streams; the new instance's id comes with its first SYNC.
    pub fn on_announce(&mut self, incarnation: u64) -> Option<FailReason> {
        if self.peer_incarnation.is_none_or(|i| i == incarnation) {
            return None;
        }
        if let Some(p) = self.peer_cid.take() {
            self.retired[self.next_retired] = p;
            self.next_retired = (self.next_retired + 1) % RETIRED;
        }
        self.peer_incarnation = Some(incarnation);
        self.sync_interval = self.cfg.sync_retry;
        Some(FailReason::PeerRestarted)
    }

    /// Asks for a SYNC soon: a frame of an unknown instance arrived, or there is something to
    /// send before the handshake. At most one per `sync_retry` while nothing was answered.
    pub fn want_sync(&mut self, now: Time) {
        if self.sync_at.is_some() {
            return;
        }
        let at = match self.last_sync {
            Some(t) => (t + self.cfg.sync_retry).max(now),
            None => now,
        };
        self.sync_at = Some(at);
    }

    /// Whether a SYNC is due at `now`.
    pub fn sync_due(&self, now: Time) -> bool {
        self.sync_at.is_some_and(|t| t <= now)
    }

    /// A SYNC went out at `now`: until the peer is known, the next follows after a growing
    /// interval.
    pub fn on_sync_sent(&mut self, now: Time) {
        self.last_sync = Some(now);
        if self.peer_cid.is_none() {
            self.sync_at = Some(now + self.sync_interval);
            let cap = (self.cfg.broken_after / 8).max(self.cfg.sync_retry);
            self.sync_interval = (self.sync_interval * 2).min(cap);
        } else {
            self.sync_at = None;
        }
    }

    /// The connection now waits for the peer (`true`: unacknowledged frames, or messages
    /// waiting for the handshake) or not; progress restarts the deadline.
    pub fn set_waiting(&mut self, now: Time, waiting: bool, progress: bool) {
        self.waiting_since = match (waiting, self.waiting_since) {
            (false, _) => None,
            (true, Some(t)) if !progress => Some(t),
            (true, _) => Some(now),
        };
    }

    /// Whether the connection has waited without progress for its whole deadline.
    pub fn broken(&self, now: Time) -> bool {
        self.waiting_since
            .is_some_and(|t| now.since(t) >= self.cfg.broken_after)
    }

    /// The next time something is due: a SYNC, or the broken deadline.
    pub fn poll_timeout(&self) -> Option<Time> {
        let broken = self.waiting_since.map(|t| t + self.cfg.broken_after);
        match (self.sync_at, broken) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Bytes of a SYNC payload: the sender's incarnation (u64) and flags (u8).
pub(super) const SYNC_PAYLOAD: usize = 9;
/// SYNC flag: an announcement of a (re)start, not a handshake (no connection id).
pub(super) const SYNC_ANNOUNCE: u8 = 1;

/// A SYNC's incarnation and flags.
pub(super) fn sync_payload(view: &FrameView<'_>) -> Option<(u64, u8)> {
    let p = view.payload();
    let inc = u64::from_be_bytes(p.get(..8)?.try_into().ok()?);
    Some((inc, *p.get(8)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LifecycleConfig {
        LifecycleConfig {
            broken_after: Duration::from_secs(1),
            sync_retry: Duration::from_millis(5),
        }
    }

    fn ms(n: u64) -> Time {
        Time::from_nanos(n * 1_000_000)
    }

    #[test]
    fn handshake_both_ways() {
        let mut a = Lifecycle::new(11, cfg());
        let mut b = Lifecycle::new(22, cfg());
        assert!(!a.established());
        a.want_sync(ms(0));
        assert!(a.sync_due(ms(0)));
        a.on_sync_sent(ms(0));
        // B hears A's SYNC (A does not know B yet): B adopts A and must answer.
        assert_eq!(b.on_sync(ms(1), 11, 0, 7), SyncOutcome::Adopted);
        assert!(b.sync_due(ms(1)));
        b.on_sync_sent(ms(1));
        assert!(!b.sync_due(ms(100)));
        // A hears B's answer, which names A: done, no answer back.
        assert_eq!(a.on_sync(ms(2), 22, 11, 8), SyncOutcome::Adopted);
        assert!(a.established() && b.established());
        assert!(!a.sync_due(ms(100)));
        assert!(a.accepts(22, 11) && b.accepts(11, 22));
        assert!(!a.accepts(22, 12) && !a.accepts(23, 11));
    }

    #[test]
    fn a_new_peer_instance_resets_and_stragglers_are_ignored() {
        let mut a = Lifecycle::new(11, cfg());
        a.on_sync(ms(0), 22, 11, 7);
        // Same incarnation, new id: the peer gave up on us and reconnects.
        assert_eq!(
            a.on_sync(ms(1), 23, 0, 7),
            SyncOutcome::Reset(FailReason::PeerReset)
        );
        // A new incarnation: the peer restarted.
        assert_eq!(
            a.on_sync(ms(2), 24, 0, 9),
            SyncOutcome::Reset(FailReason::PeerRestarted)
        );
        // A late SYNC of an instance already replaced changes nothing.
        assert_eq!(a.on_sync(ms(3), 22, 11, 7), SyncOutcome::Stale);
        assert_eq!(a.peer_cid(), Some(24));
        assert_eq!(a.on_sync(ms(3), 0, 11, 7), SyncOutcome::Stale);
    }

    #[test]
    fn an_announced_restart_forgets_the_old_instance() {
        let mut a = Lifecycle::new(11, cfg());
        assert_eq!(a.on_announce(7), None, "no connection known: nothing to do");
        a.on_sync(ms(0), 22, 11, 7);
        assert_eq!(a.on_announce(7), None, "the same incarnation");
        assert_eq!(a.on_announce(8), Some(FailReason::PeerRestarted));
        assert!(!a.established());
        // A straggler from the old instance changes nothing; the new one is adopted.
        assert_eq!(a.on_sync(ms(1), 22, 11, 7), SyncOutcome::Stale);
        assert_eq!(a.on_sync(ms(2), 33, 0, 8), SyncOutcome::Adopted);
    }

    #[test]
    fn unanswered_syncs_back_off_and_the_deadline_breaks() {
        let mut a = Lifecycle::new(11, cfg());
        a.want_sync(ms(0));
        a.set_waiting(ms(0), true, false);
        a.on_sync_sent(ms(0));
        let t1 = a.poll_timeout().unwrap();
        assert_eq!(t1, ms(5));
        a.on_sync_sent(t1);
        assert_eq!(a.poll_timeout(), Some(ms(15)));
        assert!(!a.broken(ms(999)));
        assert!(a.broken(ms(1000)));
        // Progress restarts the deadline; nothing outstanding clears it.
        a.set_waiting(ms(900), true, true);
        assert!(!a.broken(ms(1000)));
        a.set_waiting(ms(950), false, false);
        assert!(!a.broken(ms(5000)));
    }

    #[test]
    fn answers_to_stale_frames_are_rate_limited() {
        let mut a = Lifecycle::new(11, cfg());
        a.on_sync(ms(0), 22, 11, 7);
        a.want_sync(ms(0));
        assert!(a.sync_due(ms(0)));
        a.on_sync_sent(ms(0));
        a.want_sync(ms(1));
        assert!(!a.sync_due(ms(1)));
        assert!(a.sync_due(ms(5)));
    }
}

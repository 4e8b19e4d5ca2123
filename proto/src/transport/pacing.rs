//! Receiver pacing: end-to-end flow control sized in frames the receiver can take.
//!
//! The driver tells the transport how many more frames it can buffer right now
//! ([`super::Transport::set_rx_room`]: on AF_XDP, the chunks its fill rings hold for the
//! kernel and the room in its RX rings). The room is shared among the peers sending to this
//! server and granted to each in every acknowledgement it carries (the header's `rwnd`): a
//! sender sends no new frame past the peer's acknowledgement plus its grant. A receiver that
//! falls behind so slows its senders instead of losing frames in its rings and having them
//! sent again. A driver that never states its room grants nothing (`rwnd` 0), and the
//! sender's own window alone applies, as before pacing.

use std::time::Duration;

use crate::time::Time;

/// The least a peer is granted: a sender always has some frames to send, whose
/// acknowledgements carry the next grant (so a stalled sender is never stuck).
pub const MIN_GRANT: u32 = 8;

/// A peer that sent data within this long counts as an active sender.
const ACTIVE_FOR: Duration = Duration::from_millis(1);

/// What a connection keeps for pacing.
#[derive(Debug, Default, Clone, Copy)]
pub struct PeerPacing {
    /// When its last data frame arrived.
    pub last_data: Option<Time>,
    /// The grant it was last told.
    pub granted: u16,
    /// It was told a small grant, and is to hear at once when room comes back.
    pub starved: bool,
    /// An acknowledgement is due only to tell it a larger grant.
    pub window_update: bool,
}

/// The receiver's side of pacing for a whole transport.
#[derive(Debug)]
pub struct RxPacing {
    /// Frames the driver can still take (None: it never said).
    room: Option<u32>,
    /// The sender's own window: no grant exceeds it.
    window: u32,
    /// Active senders at the last count, and when that was.
    active: u32,
    counted_at: Option<Time>,
}

impl RxPacing {
    /// No room stated yet; grants never exceed `window`.
    pub fn new(window: u32) -> RxPacing {
        RxPacing {
            room: None,
            window,
            active: 1,
            counted_at: None,
        }
    }

    /// The driver can take `frames` more frames now.
    pub fn set_room(&mut self, frames: u32) {
        self.room = Some(frames);
    }

    /// Whether the active senders are to be counted again at `now` (at most once per
    /// `ACTIVE_FOR`, a millisecond, since counting visits every connection).
    pub fn count_due(&self, now: Time) -> bool {
        self.room.is_some() && self.counted_at.is_none_or(|t| now.since(t) >= ACTIVE_FOR)
    }

    /// Whether a peer whose last data frame arrived at `last` counts as active at `now`.
    pub fn is_active(last: Option<Time>, now: Time) -> bool {
        last.is_some_and(|t| now.since(t) < ACTIVE_FOR)
    }

    /// The count of active senders at `now`.
    pub fn set_active(&mut self, now: Time, n: u32) {
        self.active = n.max(1);
        self.counted_at = Some(now);
    }

    /// The grant for each peer now: the room shared among active senders, at least
    /// [`MIN_GRANT`], at most the window (0: no room stated, no grant).
    pub fn grant(&self) -> u16 {
        match self.room {
            None => 0,
            Some(r) => (r / self.active)
                .clamp(MIN_GRANT, self.window.max(MIN_GRANT))
                .min(u32::from(u16::MAX)) as u16,
        }
    }

    /// Whether `grant` is small enough that the peer is to hear at once when room returns.
    pub fn is_small(&self, grant: u16) -> bool {
        grant != 0 && u32::from(grant) < self.window / 4
    }

    /// Whether room came back: a starved peer now gets a grant worth telling it.
    pub fn room_returned(&self) -> bool {
        let g = self.grant();
        g != 0 && u32::from(g) >= self.window / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_shared_among_active_senders_within_bounds() {
        let mut p = RxPacing::new(512);
        assert_eq!(p.grant(), 0, "no room stated: no grant");
        p.set_room(2048);
        assert_eq!(p.grant(), 512, "at most the window");
        p.set_active(Time::ZERO, 8);
        assert_eq!(p.grant(), 256);
        p.set_room(10);
        assert_eq!(p.grant(), MIN_GRANT as u16, "never below the minimum");
        assert!(p.is_small(p.grant()));
        assert!(!p.room_returned());
        p.set_room(8 * 300);
        assert!(p.room_returned());
        assert!(!p.count_due(Time::ZERO + Duration::from_micros(500)));
        assert!(p.count_due(Time::ZERO + ACTIVE_FOR));
        assert!(RxPacing::is_active(
            Some(Time::ZERO),
            Time::ZERO + Duration::from_micros(999)
        ));
        assert!(!RxPacing::is_active(
            Some(Time::ZERO),
            Time::ZERO + ACTIVE_FOR
        ));
        assert!(!RxPacing::is_active(None, Time::ZERO));
    }
}

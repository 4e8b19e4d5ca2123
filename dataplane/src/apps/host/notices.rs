//! "Return buffer missing" notices an application owes, kept in order while the transport
//! has no room.

use std::collections::VecDeque;

use torusnet_proto::transport::SendError;

use super::{AppMessage, MAX_OWED_NOTICES};

/// Notices an application owes senders of messages into its return buffers that found no
/// buffer ("return buffer missing"): those messages were acknowledged, so the notice is
/// the only way their senders learn they were not placed. Sent at once when the transport
/// has room, else kept in order and sent first on later turns; beyond `MAX_OWED_NOTICES`,
/// or when the transport refuses one for good (its sender unreachable), counted lost.
#[derive(Default)]
pub(super) struct OwedNotices {
    queue: VecDeque<AppMessage>,
}

impl OwedNotices {
    /// Whether no notice waits.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Sends `o` through `send` unless older notices wait; how many were lost (0 or 1).
    pub(super) fn send(
        &mut self,
        o: AppMessage,
        send: &mut impl FnMut(&AppMessage) -> Result<(), SendError>,
    ) -> u64 {
        if self.queue.is_empty() {
            match send(&o) {
                Ok(()) => return 0,
                Err(SendError::WouldBlock) => {}
                Err(_) => return 1,
            }
        }
        if self.queue.len() >= MAX_OWED_NOTICES {
            return 1;
        }
        self.queue.push_back(o);
        0
    }

    /// Sends the waiting notices, oldest first, while the transport takes them; (sent,
    /// lost).
    pub(super) fn flush(
        &mut self,
        send: &mut impl FnMut(&AppMessage) -> Result<(), SendError>,
    ) -> (usize, u64) {
        let (mut sent, mut lost) = (0, 0);
        while let Some(o) = self.queue.front() {
            match send(o) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock) => break,
                Err(_) => lost += 1,
            }
            self.queue.pop_front();
        }
        (sent, lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use torusnet_proto::node::{MsgOptions, Target};
    use torusnet_proto::topology::Coord;

    fn notice(k: u8) -> AppMessage {
        AppMessage {
            target: Target::Server(Coord::new(1, 0, 0)),
            service: 7,
            data: vec![k],
            opts: MsgOptions::default(),
        }
    }

    #[test]
    fn a_notice_the_transport_cannot_take_is_kept_then_sent_in_order() {
        let mut owed = OwedNotices::default();
        let room = std::cell::Cell::new(false);
        let sent = std::cell::RefCell::new(Vec::new());
        let mut send = |o: &AppMessage| {
            if room.get() {
                sent.borrow_mut().push(o.data[0]);
                Ok(())
            } else {
                Err(SendError::WouldBlock)
            }
        };
        // Full transport: every notice is kept, up to the limit; past it, counted lost.
        let mut lost = 0;
        for k in 0..MAX_OWED_NOTICES + 3 {
            lost += owed.send(notice(k as u8), &mut send);
        }
        assert_eq!(lost, 3);
        assert_eq!(owed.queue.len(), MAX_OWED_NOTICES);
        assert_eq!(owed.flush(&mut send), (0, 0));
        room.set(true);
        assert_eq!(owed.flush(&mut send), (MAX_OWED_NOTICES, 0));
        assert!(owed.queue.is_empty());
        let got = sent.borrow().clone();
        let want: Vec<u8> = (0..MAX_OWED_NOTICES).map(|k| k as u8).collect();
        assert_eq!(got, want, "in the order they were owed");
        // A notice owed while an older one waits does not overtake it.
        sent.borrow_mut().clear();
        room.set(false);
        assert_eq!(owed.send(notice(1), &mut send), 0);
        room.set(true);
        assert_eq!(owed.send(notice(2), &mut send), 0);
        assert!(sent.borrow().is_empty());
        assert_eq!(owed.flush(&mut send), (2, 0));
        assert_eq!(*sent.borrow(), vec![1, 2]);
    }

    #[test]
    fn a_notice_refused_for_good_is_counted_lost() {
        let mut owed = OwedNotices::default();
        let mut gone = |_: &AppMessage| Err(SendError::Unreachable);
        assert_eq!(owed.send(notice(1), &mut gone), 1);
        assert!(owed.queue.is_empty());
    }
}

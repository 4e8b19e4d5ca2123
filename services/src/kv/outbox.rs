//! Messages the key-value service has decided to send, in order: encoded ones for other
//! servers wait here while the engine's queue for the service is full, and ones for this
//! server itself are handed back to the service on its next poll (so a server that is its own
//! primary or replica runs the same code, without re-entering itself).

use std::collections::VecDeque;

use torusnet_proto::node::{MsgOptions, Target};
use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::SendError;

use super::wire::Msg;
use super::KV;

/// Queued sends.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    local: Option<Coord>,
    queue: VecDeque<(Coord, Vec<u8>, u64)>,
    loopback: VecDeque<Msg>,
}

impl Outbox {
    /// Learns which server it runs on (before anything is sent).
    pub(super) fn set_local(&mut self, c: Coord) {
        self.local = Some(c);
    }

    /// Queues `msg` for `to`; `tag` (non-zero) comes back if it fails for good.
    pub(super) fn send(&mut self, now: Time, to: Coord, msg: &Msg, tag: u64) {
        if Some(to) == self.local {
            self.loopback.push_back(msg.clone());
        } else {
            self.queue.push_back((to, msg.encode(now), tag));
        }
    }

    /// The next message for this server itself.
    pub(super) fn take_loopback(&mut self) -> Option<Msg> {
        self.loopback.pop_front()
    }

    /// Messages waiting (for other servers).
    pub(super) fn backlog(&self) -> usize {
        self.queue.len()
    }

    /// Whether anything waits to be sent or handed back.
    pub(super) fn busy(&self) -> bool {
        !self.queue.is_empty() || !self.loopback.is_empty()
    }

    /// Hands the engine what it takes; returns the sends that failed for good (the server is
    /// unreachable, the message too large) with their tags.
    pub(super) fn transmit(&mut self, now: Time, node: &mut dyn Engine) -> Vec<(Coord, u64)> {
        let mut failed = Vec::new();
        while let Some((to, data, tag)) = self.queue.front() {
            let opts = MsgOptions {
                reliable: true,
                tag: *tag,
                ..MsgOptions::default()
            };
            match node.send(now, Target::Server(*to), KV, data, opts) {
                Ok(()) => {}
                Err(SendError::WouldBlock) => break,
                Err(_) => failed.push((*to, *tag)),
            }
            self.queue.pop_front();
        }
        failed
    }
}

//! Services hosted beside the engine: sans-IO state machines that own some service ids, see
//! the events for them, and send through the engine. torusd hosts them in its pollers, tests
//! drive them over in-memory engines, and the simulator can host the same code at scale.
//!
//! The host's contract, per turn of its loop: hand every engine event to the service that
//! owns its id ([`Service::on_event`]; broadcast events such as a server becoming
//! unreachable go to every service), then [`Service::poll`] each service, then let the engine
//! transmit. Events are handed over before anything is transmitted, so a service has seen a
//! message before the acknowledgement of its frame can leave this server.

use std::any::Any;

use crate::node::{Event, Node};
use crate::time::Time;

/// A request for a service from outside the engine (a management command), typed by the
/// service that understands it.
pub type Request = Box<dyn Any + Send>;

/// A service hosted beside an engine.
pub trait Service: Send {
    /// A short name, for status and logs.
    fn name(&self) -> &'static str;

    /// The service ids it owns: messages, acknowledgements and failures for these come to it.
    fn ids(&self) -> &[u16];

    /// An event for one of its ids, or a broadcast one (`Unreachable`, `Reachable`,
    /// `PeerReset`).
    fn on_event(&mut self, now: Time, event: &Event, node: &mut Node);

    /// A request from outside; handed back when the service does not understand it.
    fn on_request(&mut self, now: Time, request: Request, node: &mut Node) -> Result<(), Request>;

    /// Sends what is due now; returns how much work it did (0: idle).
    fn poll(&mut self, now: Time, node: &mut Node) -> usize;

    /// The latest time `poll` must run again (a deadline, a pacing timer); `None`: only when
    /// an event comes.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }

    /// Whether it owns service id `id` (for services whose ids change while they run, such
    /// as the host of attached applications); by default, the ids of [`Service::ids`].
    fn owns(&self, id: u16) -> bool {
        self.ids().contains(&id)
    }

    /// The host is about to sleep until something wakes it: arm whatever wakes it for this
    /// service, and say whether sleeping is still right (false: work arrived meanwhile).
    fn may_sleep(&mut self) -> bool {
        true
    }

    /// The host woke up (undo what `may_sleep` armed).
    fn woke(&mut self) {}
}

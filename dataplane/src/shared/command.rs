//! What crosses from other threads into a poller: commands (a send, a view, a request for a
//! hosted service, ...) and frames one poller hands another.

use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::routing::LinkView;
use torusnet_proto::service::Request;
use torusnet_proto::topology::Dir;

use crate::fault::Fault;

/// Something for the poller to do on an application's behalf.
pub enum Command {
    /// Send a message.
    Send {
        /// The server or key it goes to.
        target: Target,
        /// From which service (and to the same service on the other side).
        service: u16,
        /// The bytes.
        data: Vec<u8>,
        /// Reliable or short, tag, fences and the sending service's id.
        opts: MsgOptions,
    },
    /// Inject faults on a link (tests and soaks): loss in the kernel, duplication and
    /// reordering where frames leave.
    SetFault {
        /// The link.
        dir: Dir,
        /// What it does to frames; all zero turns it off.
        fault: Fault,
    },
    /// Adopt a new link-state view, and the neighbours' MACs per direction (None: keep);
    /// the sender learns when it is in force.
    SetView(
        Box<LinkView>,
        [Option<[u8; 6]>; 6],
        Option<std::sync::mpsc::Sender<()>>,
    ),
    /// A request for the hosted service that owns `service` (built-in ping, bench, ...).
    Request {
        /// The service id.
        service: u16,
        /// What it is asked, in its own type.
        request: Request,
    },
    /// Report acknowledgements of `service`'s reliable messages to it (or stop).
    NotifyAcks(u16, bool),
    /// Service `u16`'s fair-queuing weight is now `u32` (`crate::weights`).
    SetWeight(u16, u32),
    /// The congestion controller on or off, for every connection.
    SetCongestion(bool),
    /// Frames of service `u16` passing through are held for the application that asked
    /// (on: `true`), or pass again (`false`); every poller.
    Intercept(u16, bool),
    /// An event for service `u16`, from a poller that does not host it.
    Deliver(u16, Event),
    /// An event every service hears of, from a poller that hosts none.
    Broadcast(Event),
    /// The kernel says link `Dir` lost (false) or regained (true) its carrier.
    LinkCarrier(Dir, bool),
    /// Source routing of this server's own traffic on or off, for these services (`None`:
    /// all); the answer says whether it could be done (source routing configured).
    SetRouting(
        bool,
        Option<Vec<u16>>,
        Option<std::sync::mpsc::Sender<bool>>,
    ),
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Send {
                target,
                service,
                data,
                ..
            } => write!(f, "Send({target:?}, {service}, {} bytes)", data.len()),
            Command::SetFault { dir, fault } => write!(f, "SetFault({dir}, {fault:?})"),
            Command::SetView(..) => f.write_str("SetView"),
            Command::Request { service, .. } => write!(f, "Request({service})"),
            Command::NotifyAcks(s, on) => write!(f, "NotifyAcks({s}, {on})"),
            Command::SetWeight(s, w) => write!(f, "SetWeight({s}, {w})"),
            Command::SetCongestion(on) => write!(f, "SetCongestion({on})"),
            Command::Intercept(s, on) => write!(f, "Intercept({s}, {on})"),
            Command::Deliver(s, _) => write!(f, "Deliver({s})"),
            Command::Broadcast(_) => f.write_str("Broadcast"),
            Command::LinkCarrier(d, up) => write!(f, "LinkCarrier({d}, {up})"),
            Command::SetRouting(on, svc, _) => write!(f, "SetRouting({on}, {svc:?})"),
        }
    }
}

/// A frame one poller passes to another (pollers own disjoint links and connections).
#[derive(Debug)]
pub enum Handoff {
    /// A frame addressed to this server from a peer whose connection the receiving poller
    /// owns: run it through that poller's engine.
    Deliver(Vec<u8>),
    /// A frame to send on a link the receiving poller owns.
    Send(Dir, Vec<u8>),
}

impl Command {
    /// Copies, as many as taken, of a command every poller runs (a view: each acknowledges
    /// on the same channel; acknowledgement reports on or off; a weight; congestion control
    /// on or off); none of other commands.
    pub(crate) fn fan_out(&self) -> impl Iterator<Item = Command> + '_ {
        std::iter::from_fn(move || match self {
            Command::SetView(v, macs, ack) => Some(Command::SetView(v.clone(), *macs, ack.clone())),
            Command::NotifyAcks(id, on) => Some(Command::NotifyAcks(*id, *on)),
            Command::SetWeight(id, w) => Some(Command::SetWeight(*id, *w)),
            Command::SetCongestion(on) => Some(Command::SetCongestion(*on)),
            Command::Intercept(id, on) => Some(Command::Intercept(*id, *on)),
            _ => None,
        })
    }
}

/// Frames one poller passed to others, and those it dropped because the other's hand-off
/// queue was full.
#[derive(Debug, Clone, Copy, Default)]
pub struct HandoffCounts {
    /// Frames queued for another poller.
    pub passed: u64,
    /// Frames dropped: the other poller's queue was full, or (handed over to a poller
    /// whose view moved meanwhile) none of its links could take the frame on.
    pub dropped: u64,
}

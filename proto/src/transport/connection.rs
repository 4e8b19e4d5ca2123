//! One reliable connection: everything a server keeps about one peer, both directions.
//!
//! There is one connection per peer server, shared by all services. One window and one ACK
//! stream per peer amortise acknowledgements over all the traffic between the two servers,
//! and let aggregation pack small messages of different services to the same peer into one
//! frame; fences are per connection, as MultiEdge defines them ("operations issued by this
//! source node to the same destination").

use super::completion::Completions;
use super::delivery::Delivery;
use super::lifecycle::{Lifecycle, LifecycleConfig};
use super::pacing::PeerPacing;
use super::pool::BufferPool;
use super::receiver::{RecvConfig, RecvWindow};
use super::sender::{SendConfig, SendWindow};
use super::stripe::Stripe;
use super::{LinkId, LinkSet};
use crate::time::Time;
use crate::topology::Coord;

/// Settings a connection is built from (kept to rebuild its streams on a reset).
#[derive(Debug, Clone, Copy)]
pub struct ConnConfig {
    /// The send side.
    pub send: SendConfig,
    /// The receive side.
    pub recv: RecvConfig,
    /// The lifecycle (handshake, deadline).
    pub life: LifecycleConfig,
    /// Largest reassembled message.
    pub max_message: usize,
    /// The congestion controller's settings.
    pub congestion: super::congestion::CongestionConfig,
}

/// State of the connection with one peer.
#[derive(Debug)]
pub struct Connection {
    /// The peer server.
    pub peer: Coord,
    /// Frames we sent and have not seen acknowledged.
    pub send: SendWindow,
    /// Frames the peer sent us.
    pub recv: RecvWindow,
    /// Messages the peer sent us, on their way to the application.
    pub delivery: Delivery,
    /// Next message number to assign to a reliable message we send.
    pub next_msn: u64,
    /// The latest forward-fenced message we sent.
    pub last_fwd: Option<u64>,
    /// Service queue entries (messages, or groups of them) to this peer: nonzero while any
    /// message to it waits.
    pub queued: usize,
    /// Whether the connection sits in the transport's urgent list.
    pub urgent: bool,
    /// The deadline of its live entry in the transport's timer heap, if it has one.
    pub timer: Option<Time>,
    /// Which instance of the connection this is, and what it knows of the peer's.
    pub life: Lifecycle,
    /// Messages framed and not yet acknowledged, for the sender's reports.
    pub sent: Completions,
    /// What receiver pacing keeps about the peer.
    pub pace: PeerPacing,
    /// The load the peer's frames met, to echo to it.
    pub tele: super::congestion::Telemetry,
    /// Our window as the peer's echoes set it.
    pub cc: super::congestion::Controller,
    /// Striping of its reliable frames over the links.
    rr: Stripe,
    cfg: ConnConfig,
}

impl Connection {
    /// A fresh connection with `peer`, as instance `cid`.
    pub fn new(peer: Coord, cid: u32, cfg: ConnConfig) -> Connection {
        let cc = super::congestion::Controller::new(cfg.congestion, cfg.send.window);
        let mut send = SendWindow::new(cfg.send);
        send.set_cwnd(cc.window());
        Connection {
            peer,
            send,
            recv: RecvWindow::new(cfg.recv),
            delivery: Delivery::new(cfg.max_message),
            next_msn: 0,
            last_fwd: None,
            queued: 0,
            urgent: false,
            timer: None,
            life: Lifecycle::new(cid, cfg.life),
            sent: Completions::default(),
            pace: PeerPacing::default(),
            tele: super::congestion::Telemetry::default(),
            cc,
            rr: Stripe::default(),
            cfg,
        }
    }

    /// Congestion control as `cc` says from now on: a fresh controller (turned on, the
    /// window opens from its initial size; off, the connection's whole window).
    pub fn set_congestion(&mut self, cc: super::congestion::CongestionConfig) {
        self.cfg.congestion = cc;
        self.cc = super::congestion::Controller::new(cc, self.cfg.send.window);
        self.send.set_cwnd(self.cc.window());
    }

    /// Puts the connection on the transport's `urgent` list (it has a SYNC, a
    /// retransmission, an ACK or a NACK to send), once.
    #[inline(always)]
    pub fn enlist(&mut self, urgent: &mut std::collections::VecDeque<Coord>) {
        if !self.urgent {
            self.urgent = true;
            urgent.push_back(self.peer);
        }
    }

    /// Starts both streams over (the peer's instance changed): frames in flight and partly
    /// received messages are dropped, the buffers go back to `pool`. The unacknowledged
    /// messages stay in `sent` for the caller to report; the lifecycle is kept.
    pub fn reset_streams(&mut self, pool: &mut BufferPool) {
        self.send.release(pool);
        self.send = SendWindow::new(self.cfg.send);
        self.recv = RecvWindow::new(self.cfg.recv);
        self.delivery = Delivery::new(self.cfg.max_message);
        self.next_msn = 0;
        self.last_fwd = None;
    }

    /// Round-robin striping: the first usable link after the one used last.
    pub fn next_link(&mut self, usable: LinkSet) -> Option<LinkId> {
        self.rr.next(usable)
    }
}

//! Every server's own control plane in the simulator: one [`ControlNode`] per server whose
//! hellos and flooded records travel as frames on the simulated links (sharing their rate,
//! delay and queues with data), failures known only by missed hellos, and each engine's
//! view taken from its own control plane when it changes, as torusd takes it from the
//! control process. Servers then disagree while a failure spreads, which is the case
//! CamCube's churn experiment is about (CamCubeOS paper 4.2.5).

use super::frame::SimFrame;
use super::part::{Ctx, Part};
use super::{Sim, Time};
use crate::control::{ControlConfig, ControlEvent, ControlNode};
use crate::node::Node;
use crate::routing::LinkView;
use crate::topology::Coord;

impl Sim {
    /// Gives every server its own control plane, with `template`'s timers; ids, links and
    /// coordinates come from the torus (coordinates as persisted after a bootstrap). From
    /// now on each engine's view is its own control plane's, and [`Sim::crash`] and
    /// [`Sim::restart`] are the only way servers fail and return ([`Sim::set_server`]
    /// belongs to the shared-view mode). The views form within a few hello intervals.
    pub fn enable_control(&mut self, template: &ControlConfig) {
        let n = self.ctx.up.len();
        self.control_template = Some(template.clone());
        for p in 0..self.parts.len() {
            let (lo, len) = (self.parts[p].lo, self.parts[p].len());
            self.parts[p].control = (lo..lo + len).map(|i| self.new_control(i, 1)).collect();
        }
        for i in 0..n {
            let now = self.now;
            self.wake(i, now);
        }
    }

    /// Whether the servers run their own control planes.
    pub fn has_control(&self) -> bool {
        self.control_template.is_some()
    }

    /// Server `i`'s control plane, when the servers run their own.
    pub fn control(&self, i: usize) -> Option<&ControlNode> {
        let (p, li) = self.at(i);
        self.parts[p].control.get(li)
    }

    fn new_control(&self, i: usize, incarnation: u64) -> ControlNode {
        let dims = self.ctx.cfg.dims;
        let mut c = self
            .control_template
            .clone()
            .unwrap_or_else(|| ControlConfig::new(0, dims, dims.link_dirs()));
        c.node_id = i as u64 + 1;
        c.dims = dims;
        c.links = dims.link_dirs();
        c.coord = Some(dims.coord(i));
        c.origin = false;
        c.incarnation = incarnation;
        // One clock for the whole simulation: take-over instants mean the same everywhere.
        c.epoch_unix_ns = 0;
        ControlNode::new(c)
    }

    /// Restarts crashed server `c`, both daemons: a fresh engine (a new incarnation) that
    /// knows nothing of the torus, and a fresh control plane with its persisted coordinate,
    /// which learns the torus from its neighbours. Only with [`Sim::enable_control`].
    pub fn restart(&mut self, c: Coord) {
        let i = self.ctx.cfg.dims.index(c);
        if self.ctx.up[i] || !self.has_control() {
            return;
        }
        let Ok(mut view) = LinkView::all_up(self.ctx.cfg.dims) else {
            return;
        };
        for o in self.ctx.cfg.dims.coords().filter(|o| *o != c) {
            let _ = view.set_server(o, false);
        }
        let mut tc = self.ctx.cfg.transport;
        // Microseconds of simulated time: later than any earlier incarnation's, and its
        // control records' sequence numbers start past the old ones.
        let incarnation = self.now.0 / 1000 + 2;
        tc.incarnation = incarnation;
        let Ok(node) = Node::new(c, view, tc) else {
            return;
        };
        self.retired.key_no_root += self.node(i).stats().key_no_root;
        let ctl = self.new_control(i, incarnation);
        let (p, li) = self.at(i);
        self.parts[p].nodes[li] = node;
        self.parts[p].control[li] = ctl;
        std::sync::Arc::make_mut(&mut self.ctx.up)[i] = true;
        let now = self.now;
        self.wake(i, now);
    }
}

impl Part {
    /// Whether server `i`'s (local index) control plane has a timer due now.
    pub(super) fn control_due(&self, i: usize) -> bool {
        self.control
            .get(i)
            .and_then(ControlNode::poll_timeout)
            .is_some_and(|t| t <= self.now)
    }

    /// When server `i`'s (local index) control plane next needs to run, if later than now.
    pub(super) fn control_timeout(&self, i: usize) -> Option<Time> {
        self.control
            .get(i)
            .and_then(ControlNode::poll_timeout)
            .filter(|t| *t > self.now)
    }

    /// Runs server `i`'s (local index) control plane if a timer is due, puts its frames on the links and
    /// hands a changed view to the engine.
    pub(super) fn run_control(&mut self, ctx: &Ctx, i: usize) {
        let now = self.now;
        let Some(ctl) = self.control.get_mut(i) else {
            return;
        };
        if ctl.poll_timeout().is_some_and(|t| t <= now) {
            ctl.handle_timeout(now);
        }
        let mut changed = false;
        while let Some(e) = ctl.poll_event() {
            changed |= matches!(e, ControlEvent::ViewChanged(_));
        }
        let out: Vec<_> = std::iter::from_fn(|| ctl.poll_transmit()).collect();
        let view = if changed {
            ctl.view().map(|(_, v)| v.clone())
        } else {
            None
        };
        if let Some(v) = view {
            let _ = self.nodes[i].set_view(v);
        }
        for (d, f) in out {
            self.transmit(ctx, i, d, SimFrame::whole(f));
        }
    }
}

//! A member's and a relay's side of a transfer: joining it, taking chunks, adopting children,
//! delivering in order to the sink, reporting progress and the end.

use std::collections::VecDeque;

use torusnet_proto::service::Engine;
use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::trees::Trees;

use super::wire::{Msg, Transfer};
use super::xfer::{Held, Role, Xfer};
use super::{fold, Multicast};

impl Multicast {
    /// `Start`: this server learns whether it is a member (opening its sink) or a relay; a
    /// repeated one says the root missed our `Done` or `Refused`.
    pub(super) fn on_start(&mut self, now: Time, t: &Transfer, member: bool, node: &dyn Engine) {
        if !self.join(now, t, node) {
            return;
        }
        let Some(x) = self.xfers.get_mut(&t.id) else {
            return;
        };
        x.touched = now;
        if matches!(x.role, Role::Unknown) {
            x.role = if !member {
                Role::Relay
            } else if t.service == 0 {
                Role::Member(None)
            } else {
                match self.sinks.as_mut().map(|s| s.open(t)) {
                    Some(Ok(sink)) => Role::Member(Some(sink)),
                    Some(Err(e)) => Role::Refused(e),
                    None => Role::Refused(format!(
                        "this server delivers multicasts to no service (asked for {})",
                        t.service
                    )),
                }
            };
            if let Role::Refused(reason) = &x.role {
                self.stats.refused += 1;
                let m = Msg::Refused { id: t.id, reason }.encode();
                self.ctl.push_back((t.root, m));
            }
        } else if let Role::Refused(reason) = &x.role {
            // The root asks again: it did not hear why.
            let m = Msg::Refused { id: t.id, reason }.encode();
            self.ctl.push_back((t.root, m));
        } else if x.is_member() && x.done_sent {
            // The root has not heard our `Done`: it was lost.
            x.done_sent = false;
            self.stats.redone += 1;
            self.stats.completed = self.stats.completed.saturating_sub(1);
        }
        self.deliver(now, t.id);
    }

    /// `Data`: a chunk from a parent (or the root's repair), kept until forwarded to this
    /// server's children and delivered.
    pub(super) fn on_data(
        &mut self,
        now: Time,
        t: &Transfer,
        index: u32,
        data: &[u8],
        node: &dyn Engine,
    ) {
        let me = node.local();
        if !self.join(now, t, node) {
            return;
        }
        let Some(x) = self.xfers.get_mut(&t.id) else {
            return;
        };
        x.touched = now;
        if index >= x.chunks() || data.len() != x.chunk_range(index).len() {
            self.stats.malformed += 1;
            return;
        }
        if x.have[index as usize] || x.root().is_some() {
            self.stats.duplicates += 1;
            return;
        }
        x.have[index as usize] = true;
        x.missing -= 1;
        x.stalled_at = now;
        x.held.insert(
            index,
            Held {
                data: data.to_vec(),
                sends: 0,
            },
        );
        self.stats.held_bytes += data.len() as u64;
        self.stats.held_max = self.stats.held_max.max(self.stats.held_bytes);
        let tree = x.tree_of(index);
        for c in x.children(tree, me) {
            x.queue(c, index);
        }
        self.stats.chunks_in += 1;
        // A relay's chunk with no children to go to goes at once.
        x.settle(index, &mut self.stats.held_bytes);
        self.deliver(now, t.id);
    }

    /// `Have`: a (new) child in tree `tree` says what it holds; this server adopts it and
    /// sends what it still holds of the rest.
    pub(super) fn on_have(
        &mut self,
        now: Time,
        src: Coord,
        t: &Transfer,
        tree: u8,
        bits: &[u8],
        node: &dyn Engine,
    ) {
        let me = node.local();
        if !self.join(now, t, node) {
            return;
        }
        let Some(x) = self.xfers.get_mut(&t.id) else {
            return;
        };
        let tree = usize::from(tree);
        let k = x.trees.as_ref().map_or(1, Trees::count).max(1);
        if tree >= k {
            self.stats.malformed += 1;
            return;
        }
        x.touched = now;
        if x.root().is_none() && x.missing == x.chunks() && x.adopted.is_empty() {
            // Joined just now, from a child's request: this server's own parents have never
            // sent it anything, so it asks them at once.
            x.stalled_at = now;
            Self::ask_parents(&mut self.ctl, x, me);
        }
        x.adopted.insert((tree, src));
        let mut i = tree as u32;
        let mut j = 0usize;
        while i < x.chunks() {
            let held = bits.get(j / 8).is_some_and(|b| b & (1 << (j % 8)) != 0);
            if !held && x.queue(src, i) {
                self.stats.resent += 1;
            }
            i += k as u32;
            j += 1;
        }
    }

    /// A member delivers what it holds in order, reports its progress, and tells the root
    /// once it delivered everything; a relay lets go of what it has forwarded.
    pub(super) fn deliver(&mut self, now: Time, id: u64) {
        let window = match self.xfers.get(&id) {
            Some(x) => self.window_chunks(x.t.chunk),
            None => return,
        };
        let Some(x) = self.xfers.get_mut(&id) else {
            return;
        };
        let chunks = x.chunks();
        match &mut x.role {
            Role::Member(sink) => {
                let start = x.delivered;
                let mut gone = None;
                while let Some(h) = x.held.get(&x.delivered) {
                    let offset = u64::from(x.delivered) * u64::from(x.t.chunk);
                    if let Some(s) = sink.as_mut() {
                        match s.deliver(&x.t, offset, &h.data) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(why) => {
                                gone = Some(why);
                                break;
                            }
                        }
                    }
                    x.sum = fold(x.sum, &h.data);
                    if h.sends == 0 {
                        if let Some(h) = x.held.remove(&x.delivered) {
                            self.stats.held_bytes =
                                self.stats.held_bytes.saturating_sub(h.data.len() as u64);
                        }
                    }
                    x.delivered += 1;
                }
                if x.delivered > start {
                    x.stalled_at = now;
                }
                let step = (window / 4).max(1);
                if gone.is_none()
                    && (x.delivered >= x.reported + step
                        || (x.delivered == chunks && x.reported < x.delivered))
                {
                    x.reported = x.delivered;
                    let m = Msg::Progress {
                        id,
                        delivered: x.delivered,
                    };
                    self.ctl.push_back((x.t.root, m.encode()));
                }
                if gone.is_none() && x.delivered == chunks && !x.done_sent {
                    if let Some(s) = sink.as_mut() {
                        if !x.ended {
                            x.ended = true;
                            s.end(&x.t, true);
                        }
                        match s.flushed(&x.t) {
                            Ok(true) => {}
                            // Asked again at the next poll.
                            Ok(false) => return,
                            Err(why) => gone = Some(why),
                        }
                    }
                }
                if let Some(why) = gone {
                    // Its receiver left: this server forwards only, and the root hears why.
                    self.stats.refused += 1;
                    let m = Msg::Refused { id, reason: &why }.encode();
                    self.ctl.push_back((x.t.root, m));
                    x.ended = true;
                    x.role = Role::Refused(why);
                    return self.deliver(now, id);
                }
                if x.delivered == chunks && !x.done_sent {
                    x.done_sent = true;
                    x.ended = true;
                    self.stats.completed += 1;
                    let m = Msg::Done {
                        id,
                        checksum: x.sum,
                    }
                    .encode();
                    self.ctl.push_back((x.t.root, m));
                }
            }
            Role::Relay | Role::Refused(_) => {
                let gone: Vec<u32> = x
                    .held
                    .iter()
                    .filter(|(_, h)| h.sends == 0)
                    .map(|(i, _)| *i)
                    .collect();
                for i in gone {
                    if let Some(h) = x.held.remove(&i) {
                        self.stats.held_bytes =
                            self.stats.held_bytes.saturating_sub(h.data.len() as u64);
                    }
                }
            }
            Role::Unknown | Role::Root(_) => {}
        }
    }

    /// Drops a transfer here (it ended, or was forgotten): its sink hears it ended.
    pub(super) fn forget(&mut self, id: u64) {
        if let Some(mut x) = self.xfers.remove(&id) {
            let held: u64 = x.held.values().map(|h| h.data.len() as u64).sum();
            self.stats.held_bytes = self.stats.held_bytes.saturating_sub(held);
            if let Role::Member(Some(s)) = &mut x.role {
                if !x.ended {
                    s.end(&x.t, false);
                }
            }
        }
        self.order.retain(|i| *i != id);
    }

    /// Tells this server's parent in every tree what it holds of that tree's chunks, for
    /// the trees it lacks chunks of.
    pub(super) fn ask_parents(ctl: &mut VecDeque<(Coord, Vec<u8>)>, x: &Xfer, me: Coord) {
        let Some(trees) = x.trees.as_ref() else {
            return;
        };
        let k = trees.count().max(1);
        for t in 0..k {
            let Some(p) = trees.parent(t, me) else {
                continue;
            };
            let mut bits = Vec::new();
            let mut lacking = false;
            let mut i = t as u32;
            let mut j = 0usize;
            while i < x.chunks() {
                if j / 8 >= bits.len() {
                    bits.push(0u8);
                }
                if x.have[i as usize] {
                    bits[j / 8] |= 1 << (j % 8);
                } else {
                    lacking = true;
                }
                i += k as u32;
                j += 1;
            }
            if lacking {
                ctl.push_back((
                    p,
                    Msg::Have {
                        t: x.t,
                        tree: t as u8,
                        bits: &bits,
                    }
                    .encode(),
                ));
            }
        }
    }
}

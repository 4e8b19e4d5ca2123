//! One transfer as one server sees it: its role, the chunks it holds and what it has queued
//! for its children, and the bookkeeping that lets a chunk go once nothing needs it.

use std::collections::{HashMap, HashSet, VecDeque};

use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::trees::Trees;

use super::root::RootState;
use super::wire::{Msg, Transfer};
use super::{Sink, FOLD_START};

/// What this server is in a transfer.
#[derive(Debug)]
pub(super) enum Role {
    /// Not told yet (its `Start` is on its way, or lost): it keeps what it receives.
    Unknown,
    /// It forwards only.
    Relay,
    /// It delivers (to its sink, if the transfer names a service) and reports.
    Member(Option<Box<dyn Sink>>),
    /// A member that cannot deliver: it forwards only.
    Refused(String),
    /// The source.
    Root(Box<RootState>),
}

/// A chunk this server holds, and how many of its sends are still queued.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) data: Vec<u8>,
    pub(super) sends: u32,
}

#[derive(Debug)]
pub(super) struct Xfer {
    pub(super) t: Transfer,
    pub(super) role: Role,
    /// Chunks received at some time (the root: all).
    pub(super) have: Vec<bool>,
    pub(super) missing: u32,
    /// Chunks held now.
    pub(super) held: HashMap<u32, Held>,
    /// Chunks delivered in order (a member), or released into the trees (the root).
    pub(super) delivered: u32,
    /// The checksum of the chunks delivered.
    pub(super) sum: u64,
    /// `delivered` as last reported to the root.
    pub(super) reported: u32,
    pub(super) done_sent: bool,
    pub(super) ended: bool,
    pub(super) trees: Option<Trees>,
    pub(super) adopted: HashSet<(usize, Coord)>,
    pub(super) out: VecDeque<(Coord, u32)>,
    pub(super) touched: Time,
    /// When a chunk last arrived or was delivered (or the root was last asked): a member
    /// that stops progressing asks the root.
    pub(super) stalled_at: Time,
}

impl Xfer {
    pub(super) fn new(t: Transfer, role: Role, now: Time, trees: Option<Trees>) -> Xfer {
        let chunks = t.size.div_ceil(u64::from(t.chunk.max(1))) as u32;
        let root = matches!(role, Role::Root(_));
        Xfer {
            t,
            role,
            have: vec![root; chunks as usize],
            missing: if root { 0 } else { chunks },
            held: HashMap::new(),
            delivered: 0,
            sum: FOLD_START,
            reported: 0,
            done_sent: root,
            ended: false,
            trees,
            adopted: HashSet::new(),
            out: VecDeque::new(),
            touched: now,
            stalled_at: now,
        }
    }
    pub(super) fn chunks(&self) -> u32 {
        self.have.len() as u32
    }
    pub(super) fn chunk_range(&self, i: u32) -> std::ops::Range<usize> {
        let start = i as u64 * u64::from(self.t.chunk);
        let end = (start + u64::from(self.t.chunk)).min(self.t.size);
        start as usize..end as usize
    }
    pub(super) fn tree_of(&self, i: u32) -> usize {
        let k = self.trees.as_ref().map_or(1, Trees::count).max(1);
        i as usize % k
    }
    pub(super) fn children(&self, tree: usize, me: Coord) -> Vec<Coord> {
        let mut c = self
            .trees
            .as_ref()
            .map(|t| t.children(tree, me))
            .unwrap_or_default();
        for (t, a) in &self.adopted {
            if *t == tree && !c.contains(a) {
                c.push(*a);
            }
        }
        c
    }
    pub(super) fn root(&self) -> Option<&RootState> {
        match &self.role {
            Role::Root(r) => Some(r),
            _ => None,
        }
    }
    pub(super) fn root_mut(&mut self) -> Option<&mut RootState> {
        match &mut self.role {
            Role::Root(r) => Some(r),
            _ => None,
        }
    }
    pub(super) fn is_member(&self) -> bool {
        matches!(self.role, Role::Member(_))
    }
    /// Whether this server can send chunk `i`: the root once released, another server while
    /// it holds it.
    pub(super) fn can_send(&self, i: u32) -> bool {
        match &self.role {
            Role::Root(_) => i < self.delivered,
            _ => self.held.contains_key(&i),
        }
    }
    /// The `Data` message carrying chunk `i` (`None`: not held, or the source failed).
    pub(super) fn data_msg(&self, i: u32) -> Option<Vec<u8>> {
        let r = self.chunk_range(i);
        match &self.role {
            Role::Root(root) if i < self.delivered => Msg::data_with(&self.t, i, r.len(), |out| {
                root.source.read(r.start as u64, out)
            }),
            Role::Root(_) => None,
            _ => self.held.get(&i).map(|h| {
                Msg::Data {
                    t: self.t,
                    index: i,
                    data: &h.data,
                }
                .encode()
            }),
        }
    }
    /// Queues chunk `i` for `to` (counted against the chunk, which is kept until sent).
    pub(super) fn queue(&mut self, to: Coord, i: u32) -> bool {
        if !self.can_send(i) {
            return false;
        }
        if let Some(h) = self.held.get_mut(&i) {
            h.sends += 1;
        }
        self.out.push_back((to, i));
        true
    }
    /// One queued send of chunk `i` is over (sent or dropped): the chunk goes once nothing
    /// else needs it.
    pub(super) fn sent(&mut self, i: u32, bytes: &mut u64) {
        if let Some(h) = self.held.get_mut(&i) {
            h.sends = h.sends.saturating_sub(1);
        }
        self.settle(i, bytes);
    }
    /// Lets go of chunk `i` if no send of it is queued and this server has no other use
    /// for it (a member: delivered; a relay: none; not yet told: keep it).
    pub(super) fn settle(&mut self, i: u32, bytes: &mut u64) {
        let done = match self.role {
            Role::Member(_) => i < self.delivered,
            Role::Unknown => false,
            _ => true,
        };
        if done && self.held.get(&i).is_some_and(|h| h.sends == 0) {
            if let Some(h) = self.held.remove(&i) {
                *bytes = bytes.saturating_sub(h.data.len() as u64);
            }
        }
    }
    /// The window a member asks the root for: from its first undelivered chunk on.
    pub(super) fn want(&self, window: u32) -> Vec<u8> {
        let from = self.delivered;
        let n = window.min(self.chunks() - from);
        let mut bits = vec![0u8; n.div_ceil(8) as usize];
        for j in 0..n {
            if self.held.contains_key(&(from + j)) || self.have[(from + j) as usize] {
                bits[j as usize / 8] |= 1 << (j % 8);
            }
        }
        bits
    }
}

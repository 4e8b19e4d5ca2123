//! Per-service outbound queues, polled in turn (weighted round robin, a frame per turn) when
//! a link has room, as CamCube's runtime does: a service that floods the node gets its share
//! and no more, and each queue is bounded, so a full one answers "would block".
//!
//! A queued message's bytes wait already in wire form, its aggregated-message header in
//! front: an aggregated frame is then one copy of a run of messages, not a header and a copy
//! per message (and a message framed alone skips its header).
//!
//! With aggregation on, a message that could share the frame of the entry behind it (same
//! peer and service, same kind, no fence, room left, tags equal or counting up) joins that
//! entry instead of taking one of its own: an entry is then a *group* whose bytes lie in
//! the ring as one run of wire-form messages, the payload of the frame it will be, and the
//! frame is built from it with per-entry, not per-message, work. A frame takes whole entries
//! from the head while they fit, then the first messages of the next group that fit, so it
//! carries the same messages as when every message had an entry.
//!
//! Compacting queues (the simulator's: [`super::Config::compact_runs`]) hold a long message
//! whose bytes are all one value as its header and that value: the bytes are written out,
//! exactly, only into the frame. A simulated torus of thousands of servers otherwise copied
//! every 8 KB benchmark payload into a queue of its own, out of the cache (a fifth of the
//! run) and held gigabytes of them. What the queue counts against its limit, and every
//! byte it hands out, is the same either way.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::byte_ring::ByteRing;
use super::delivery::Fences;
use super::tags::TagRun;
use crate::byte_run::run_value;
use crate::time::Time;
use crate::topology::Coord;
use crate::wire::{self, msg_flags, MSG_HEADER_LEN};

/// What a take does with bytes the queue holds as a run (one value repeated, kept as its
/// value alone by a compacting queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// Written out into the frame like any other bytes.
    Write,
    /// A run that ends the frame is not written: declared to the caller, who writes it or
    /// carries it as a run ([`Config::declare_tails`](super::Config::declare_tails)).
    Declare,
}

/// A message waiting in a service queue (its bytes sit in the queue's byte ring).
#[derive(Debug, Clone, Copy)]
pub struct Queued {
    /// The senders' names for its messages (returned in their acknowledgements or failure
    /// reports): one tag, or a group's run of them.
    pub tags: TagRun,
    /// The service it is for, at the destination (the queue is the sending service's).
    pub service: u16,
    /// The server it goes to.
    pub dest: Coord,
    /// Its length in bytes; for a group (more than one tag), its bytes in wire form less one
    /// message header, so `MSG_HEADER_LEN + len` is what it takes in a frame either way.
    pub len: u32,
    /// Reliable (windowed, acknowledged) or short (best effort, one frame).
    pub reliable: bool,
    /// Its fences (reliable messages only).
    pub fences: Fences,
    /// When it was queued (for the aggregation deadline).
    pub enqueued: Time,
    /// Set by a compacting queue: every byte of the message is this value, and the queue
    /// holds its header only.
    pub run: Option<u8>,
    /// Whether messages may join it: it has no fence and no run, and fits a frame with
    /// its header (a message larger than that goes alone or in fragments, so an entry being
    /// sent in fragments never takes others).
    pub groupable: bool,
}

impl Queued {
    /// Messages in the entry (more than one for a group).
    pub fn count(&self) -> u32 {
        self.tags.len()
    }

    /// Message bytes in the entry, headers not counted.
    fn body_bytes(&self) -> usize {
        (self.len as usize).saturating_sub((self.count() as usize - 1) * MSG_HEADER_LEN)
    }

    /// The tags of this entry with message `m` (with `need` bytes in wire form, itself
    /// groupable) joined to it, if it may join, in a frame of at most `room` payload bytes.
    #[inline]
    fn takes(&self, m: &Queued, need: usize, room: usize) -> Option<TagRun> {
        if self.may_join(m.dest, m.service, m.reliable, need, room) {
            self.tags.then(m.tags)
        } else {
            None
        }
    }

    /// Whether a groupable message to `dest`'s `service`, of this kind, with `need` bytes in
    /// wire form, may join this entry in a frame of at most `room` payload bytes (its tags
    /// aside): the one rule both ways into a queue ([`FairQueue::push_admitting`],
    /// [`FairQueue::try_join`]) group by.
    #[inline(always)]
    fn may_join(
        &self,
        dest: Coord,
        service: u16,
        reliable: bool,
        need: usize,
        room: usize,
    ) -> bool {
        self.groupable
            && self.dest == dest
            && self.service == service
            && self.reliable == reliable
            && MSG_HEADER_LEN + self.len as usize + need <= room
    }
}

/// Messages shorter than this are held as bytes even by a compacting queue.
pub(crate) const MIN_RUN: usize = 512;

/// How far the message at the head of a queue has been framed (only the head can be partly
/// sent: a message larger than a frame goes out in fragments, one per turn).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadProgress {
    /// Bytes already sent as fragments.
    pub sent: u32,
    /// Message number, once its first fragment is framed.
    pub msn: Option<u64>,
    /// The forward-fenced message it must wait for, fixed with its message number.
    pub wait_for: Option<u64>,
}

/// One service's queue.
#[derive(Debug)]
pub struct ServiceQueue {
    /// The service id.
    pub service: u16,
    weight: u32,
    limit: usize,
    meta: VecDeque<Queued>,
    bytes: ByteRing,
    /// Bytes of messages held as runs, not in the ring: the limit counts them as if they
    /// were (and a plain queue's accounting is the ring's alone).
    compacted: usize,
    /// Messages held as runs.
    runs: usize,
    /// Message bytes waiting (the ring holds their headers too).
    data: usize,
    /// Messages waiting (a group's count them all).
    messages: usize,
    /// The head message's fragmentation.
    progress: HeadProgress,
}

impl ServiceQueue {
    /// The message at the head, if any.
    pub fn head(&self) -> Option<&Queued> {
        self.meta.front()
    }

    /// How far the head message has been framed.
    pub fn head_progress(&self) -> HeadProgress {
        self.progress
    }

    /// Fixes the head message's number and the fence it waits for, as its first fragment
    /// is framed.
    pub fn set_head_msn(&mut self, msn: u64, wait_for: Option<u64>) {
        self.progress.msn = Some(msn);
        self.progress.wait_for = wait_for;
    }

    /// The waiting entries (messages and groups), head first.
    pub fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.meta.iter()
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.messages
    }

    /// Frames this queue may send per turn (its service's weight).
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Whether the head message may share an aggregated frame of `room` payload bytes with
    /// what follows it: it is a group, or the next entry goes to the same peer, of the same
    /// kind, and its first message (a group's: at least its header) fits beside it. When
    /// not, the frame would carry the head alone, and goes plain.
    pub fn head_shares_frame(&self, room: usize) -> bool {
        let Some(h) = self.meta.front() else {
            return false;
        };
        if h.count() > 1 {
            return true;
        }
        let Some(n) = self.meta.get(1) else {
            return false;
        };
        if n.dest != h.dest || n.reliable != h.reliable {
            return false;
        }
        let first = if n.count() == 1 { n.len as usize } else { 0 };
        2 * MSG_HEADER_LEN + h.len as usize + first <= room
    }

    /// Copies the next `out.len()` unsent bytes of the head message into `out` and drops them
    /// from the queue; pops the head when all of it has been taken. With [`Runs::Declare`],
    /// bytes the head holds as a run are not written: the answer says so (`Some((0,
    /// value))`: all of `out` is `value`), and the caller owns writing them or carrying them
    /// as a run.
    pub fn take_head(&mut self, out: &mut [u8], runs: Runs) -> Option<(usize, u8)> {
        let n = out.len();
        let h = self.meta.front()?;
        debug_assert_eq!(h.count(), 1, "a group is taken whole, aggregated");
        let run = h.run;
        let len = h.len;
        if self.progress.sent == 0 {
            // Framed alone (whole or in fragments): its aggregated-message header goes.
            self.bytes.skip(MSG_HEADER_LEN);
        }
        let mut declared = None;
        match run {
            Some(v) => {
                if runs == Runs::Declare && n > 0 {
                    declared = Some((0, v));
                } else {
                    out.fill(v);
                }
                self.compacted -= n.min(self.compacted);
            }
            None => self.bytes.take(out),
        }
        self.data -= n.min(self.data);
        self.progress.sent += n as u32;
        if self.progress.sent >= len {
            self.meta.pop_front();
            self.messages -= 1;
            self.runs -= usize::from(run.is_some());
            self.progress = HeadProgress::default();
        }
        declared
    }

    /// Plans the aggregated frame the head starts (it must not be partly sent, and must fit
    /// `room` payload bytes whole): the entries behind it to the same peer and of the same
    /// kind, whole while they fit, then as many of the next group's first messages as fit,
    /// exactly the messages a frame took when each had an entry. `visit` sees each entry
    /// taken and how many of its messages.
    pub fn plan_aggregate(&self, room: usize, mut visit: impl FnMut(&Queued, u32)) -> Plan {
        let mut p = Plan::default();
        let Some(head) = self.meta.front() else {
            return p;
        };
        // Where the entry starts in the ring (a run holds its header only).
        let mut ring_at = 0usize;
        for m in &self.meta {
            if m.dest != head.dest || m.reliable != head.reliable {
                break;
            }
            let need = MSG_HEADER_LEN + m.len as usize;
            if p.bytes + need <= room {
                p.bytes += need;
                p.entries += 1;
                p.messages += m.count();
                visit(m, m.count());
                ring_at += if m.run.is_some() {
                    MSG_HEADER_LEN
                } else {
                    need
                };
                continue;
            }
            if m.count() > 1 {
                // The group's first messages, read header by header from the ring.
                let (mut at, mut k) = (ring_at, 0);
                while k < m.count() {
                    let mut h = [0u8; 2];
                    self.bytes.peek(at, &mut h);
                    let w = MSG_HEADER_LEN + usize::from(u16::from_be_bytes(h));
                    if p.bytes + w > room {
                        break;
                    }
                    p.bytes += w;
                    at += w;
                    k += 1;
                }
                if k > 0 {
                    p.prefix = k;
                    p.messages += k;
                    visit(m, k);
                }
            }
            break;
        }
        p
    }

    /// Takes what `plan` (from [`ServiceQueue::plan_aggregate`], nothing changed since)
    /// names into `out`, which its bytes fill exactly; `runs` as in
    /// [`ServiceQueue::take_entries`].
    pub fn take_planned(&mut self, plan: &Plan, out: &mut [u8], runs: Runs) -> Option<(usize, u8)> {
        let prefix_at = if plan.prefix == 0 {
            out.len()
        } else {
            self.meta
                .iter()
                .take(plan.entries)
                .map(|m| MSG_HEADER_LEN + m.len as usize)
                .sum()
        };
        let declared = self.take_entries(plan.entries, &mut out[..prefix_at], runs);
        if plan.prefix > 0 {
            let taken = out.len() - prefix_at;
            self.bytes.take(&mut out[prefix_at..]);
            if let Some(g) = self.meta.front_mut() {
                g.tags = g.tags.tail(plan.prefix);
                g.len -= taken as u32;
            }
            self.data -= (taken - plan.prefix as usize * MSG_HEADER_LEN).min(self.data);
            self.messages -= plan.prefix as usize;
        }
        declared
    }

    /// Copies the next `count` entries (messages and groups), none of them partly sent, in
    /// wire form (each message with its aggregated-message header) into `out`, which their
    /// bytes fill exactly, and pops them. With [`Runs::Declare`], a run that ends `out` (the
    /// last message's, when it is held as one) is not written: the answer is where it starts
    /// in `out` and its value, and the caller owns writing it or carrying it as a run.
    pub fn take_entries(
        &mut self,
        count: usize,
        out: &mut [u8],
        runs: Runs,
    ) -> Option<(usize, u8)> {
        let count = count.min(self.meta.len());
        let mut declared = None;
        if self.runs == 0 {
            self.bytes.take(out);
        } else {
            // Header by header, each message's bytes from the ring or written as its run.
            let mut at = 0;
            for (k, m) in self.meta.iter().take(count).enumerate() {
                let end = (at + MSG_HEADER_LEN + m.len as usize).min(out.len());
                let body = (at + MSG_HEADER_LEN).min(end);
                self.bytes.take(&mut out[at..body]);
                match m.run {
                    Some(v) => {
                        if runs == Runs::Declare && k + 1 == count && end == out.len() && end > body
                        {
                            declared = Some((body, v));
                        } else {
                            out[body..end].fill(v);
                        }
                        self.runs -= 1;
                        self.compacted -= (end - body).min(self.compacted);
                    }
                    None => self.bytes.take(&mut out[body..end]),
                }
                at = end;
            }
        }
        let messages: usize = self
            .meta
            .iter()
            .take(count)
            .map(|m| m.count() as usize)
            .sum();
        self.data -= (out.len() - messages * MSG_HEADER_LEN).min(self.data);
        self.messages -= messages;
        self.meta.drain(..count);
        declared
    }
}

/// What of a queue's head goes into one aggregated frame ([`ServiceQueue::plan_aggregate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Plan {
    /// Entries taken whole.
    pub entries: usize,
    /// Messages taken from the front of the entry after them (a group), if any.
    pub prefix: u32,
    /// Messages in all.
    pub messages: u32,
    /// Payload bytes.
    pub bytes: usize,
}

/// An unfenced message offered to [`FairQueue::try_join`].
#[derive(Debug, Clone, Copy)]
pub struct Joining<'a> {
    /// The server it goes to.
    pub dest: Coord,
    /// The service it is for there.
    pub service: u16,
    /// Reliable or short.
    pub reliable: bool,
    /// The sender's name for it.
    pub tag: u64,
    /// Its bytes.
    pub data: &'a [u8],
}

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// Why [`FairQueue::push_admitting`] did not queue a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused<E> {
    /// The service's queue is full.
    Full,
    /// The caller's admission refused it.
    Admit(E),
}

/// The set of service queues with a weighted round-robin cursor.
#[derive(Debug)]
pub struct FairQueue {
    queues: Vec<ServiceQueue>,
    index: FxHashMap<u16, usize>,
    /// The queue used last: most sends come from the same service in a row.
    last: usize,
    cursor: usize,
    turns_left: u32,
    default_limit: usize,
    /// Hold long runs of one byte value compactly ([`super::Config::compact_runs`]).
    compact: bool,
    /// Group messages that will share a frame of this many payload bytes (0: never, when
    /// aggregation is off).
    group_room: usize,
}

impl FairQueue {
    /// No services yet; a service first seen gets weight 1 and `default_limit` bytes.
    pub fn new(default_limit: usize) -> FairQueue {
        FairQueue {
            queues: Vec::new(),
            index: FxHashMap::default(),
            last: 0,
            cursor: 0,
            turns_left: 1,
            default_limit,
            compact: false,
            group_room: 0,
        }
    }

    /// Groups messages that will share a frame of `room` payload bytes (aggregation).
    #[must_use]
    pub fn grouping(self, room: usize) -> FairQueue {
        FairQueue {
            group_room: room,
            ..self
        }
    }

    /// As [`FairQueue::new`], holding messages whose bytes are all one value compactly.
    pub fn compacting(default_limit: usize) -> FairQueue {
        FairQueue {
            compact: true,
            ..FairQueue::new(default_limit)
        }
    }

    /// Sets a service's weight (frames per turn, at least 1) and queue limit in bytes.
    pub fn configure(&mut self, service: u16, weight: u32, limit: usize) {
        let i = self.slot(service);
        self.queues[i].weight = weight.max(1);
        self.queues[i].limit = limit;
    }

    /// Sets a service's weight alone (frames per turn, at least 1), its limit as it was.
    pub fn set_weight(&mut self, service: u16, weight: u32) {
        let i = self.slot(service);
        self.queues[i].weight = weight.max(1);
    }

    /// Takes every service's weight and limit from `other` (a queue being replaced).
    pub fn take_settings(&mut self, other: &FairQueue) {
        for q in &other.queues {
            self.configure(q.service, q.weight, q.limit);
        }
    }

    /// Where the queue used last lives (a hint for prefetching; never read through).
    pub(crate) fn first_queue(&self) -> *const u8 {
        self.queues.as_ptr().wrapping_add(self.last).cast()
    }

    #[inline]
    fn slot(&mut self, service: u16) -> usize {
        if self
            .queues
            .get(self.last)
            .is_some_and(|q| q.service == service)
        {
            return self.last;
        }
        self.slot_of_another(service)
    }

    /// [`FairQueue::slot`] for a service other than the one used last.
    #[inline(never)]
    fn slot_of_another(&mut self, service: u16) -> usize {
        if let Some(&i) = self.index.get(&service) {
            self.last = i;
            return i;
        }
        self.queues.push(ServiceQueue {
            service,
            weight: 1,
            limit: self.default_limit,
            meta: VecDeque::new(),
            bytes: ByteRing::default(),
            compacted: 0,
            runs: 0,
            data: 0,
            messages: 0,
            progress: HeadProgress::default(),
        });
        let i = self.queues.len() - 1;
        self.index.insert(service, i);
        i
    }

    /// Joins an unfenced message from `from` to the group at the tail of that service's
    /// queue, when it is the queue used last and the group takes the message: the case of
    /// nearly every message in a stream of small ones. `false` (nothing changed) when it does
    /// not apply, and the caller goes the general way ([`FairQueue::push_admitting`]), which
    /// would have done the same. Everything a new entry needs (its record, the admission, a
    /// look for a run of one byte value) is skipped; what is checked is what the general
    /// way checks before joining a message to a group. Always inline, as
    /// `Transport::send_hinted` is: it is the whole of a joining send.
    #[inline(always)]
    pub fn try_join(&mut self, from: u16, m: &Joining<'_>) -> bool {
        let Some(sq) = self.queues.get_mut(self.last) else {
            return false;
        };
        let need = MSG_HEADER_LEN + m.data.len();
        let room = self.group_room;
        // A compacting queue holds messages from MIN_RUN bytes on as runs, never in groups.
        let small = need <= room && !(self.compact && m.data.len() >= MIN_RUN);
        if sq.service != from || !small || sq.bytes.len() + sq.compacted + need > sq.limit {
            return false;
        }
        let Some(t) = sq.meta.back_mut() else {
            return false;
        };
        if !t.may_join(m.dest, m.service, m.reliable, need, room) {
            return false;
        }
        let Some(tags) = t.tags.then_one(m.tag) else {
            return false;
        };
        t.tags = tags;
        t.len += need as u32;
        let mut hdr = [0u8; MSG_HEADER_LEN];
        wire::write_msg_header(&mut hdr, m.data.len() as u16, m.service, 0);
        sq.bytes.push_message(&hdr, m.data);
        sq.data += m.data.len();
        sq.messages += 1;
        true
    }

    /// Queues a message, or refuses it when the service's queue would exceed its limit (an
    /// empty queue always takes one message, so large messages are never refused forever).
    pub fn push(&mut self, service: u16, q: Queued, data: &[u8]) -> Result<(), Full> {
        self.push_admitting(service, q, data, || Ok::<(), Full>(()))
            .map_err(|_| Full)
    }

    /// [`FairQueue::push`], asking `admit` first when the message opens an entry of its own
    /// rather than joining the group behind it: its refusal leaves the queue as it was. (The
    /// transport admits a message to a new peer there, which costs a lookup that a message
    /// joining a group does not need.)
    #[inline]
    pub fn push_admitting<E>(
        &mut self,
        service: u16,
        mut q: Queued,
        data: &[u8],
        admit: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), Refused<E>> {
        let compact = self.compact;
        let i = self.slot(service);
        let sq = &mut self.queues[i];
        // The limit counts bytes as they wait, headers included: a ring of a power-of-two
        // size that holds the limit's worth of data and its headers doubled past it (the
        // simulator's engines took half as much memory again).
        let held = sq.bytes.len() + sq.compacted;
        if !sq.meta.is_empty() && held + MSG_HEADER_LEN + data.len() > sq.limit {
            return Err(Refused::Full);
        }
        let need = MSG_HEADER_LEN + data.len();
        // Fenced messages and (in a compacting queue) long ones go alone.
        let alone = q.fences.backward || q.fences.forward || (compact && data.len() >= MIN_RUN);
        q.groupable = need <= self.group_room && !alone;
        let room = self.group_room;
        let mut tail = if q.groupable {
            sq.meta
                .back_mut()
                .and_then(|t| t.takes(&q, need, room).map(|tags| (t, tags)))
        } else {
            None
        };
        if tail.is_none() {
            admit().map_err(Refused::Admit)?;
        }
        let mut fl = 0u8;
        if q.fences.backward {
            fl |= msg_flags::BWD_FENCE;
        }
        if q.fences.forward {
            fl |= msg_flags::FWD_FENCE;
        }
        let mut hdr = [0u8; MSG_HEADER_LEN];
        // A message too long for the header's length is never aggregated: the header is
        // skipped when it is framed alone.
        wire::write_msg_header(&mut hdr, data.len() as u16, q.service, fl);
        // A run the sender vouched for (it looked once for many sends of the same bytes)
        // is not looked for again.
        q.run = if compact && data.len() >= MIN_RUN {
            debug_assert!(q.run.is_none() || q.run == run_value(data));
            q.run.or_else(|| run_value(data))
        } else {
            None
        };
        if q.run.is_some() {
            sq.bytes.push(&hdr);
            sq.runs += 1;
            sq.compacted += data.len();
        } else {
            sq.bytes.push_message(&hdr, data);
        }
        sq.data += data.len();
        sq.messages += 1;
        if let Some((t, tags)) = tail.take() {
            t.tags = tags;
            t.len += need as u32;
            return Ok(());
        }
        sq.meta.push_back(q);
        Ok(())
    }

    /// Whether no service has a message waiting.
    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(ServiceQueue::is_empty)
    }

    /// Whether the queue used last holds messages: one check that answers for a sender
    /// streaming small messages (they join its queue), before [`FairQueue::is_empty`] walks
    /// them all.
    #[inline]
    pub fn last_holding(&self) -> bool {
        self.queues.get(self.last).is_some_and(|q| !q.is_empty())
    }

    /// Whether `service`'s own queue holds messages, and whether any other queue does.
    pub fn holding(&self, service: u16) -> (bool, bool) {
        let (mut own, mut others) = (false, false);
        for q in self.queues.iter().filter(|q| !q.is_empty()) {
            if q.service == service {
                own = true;
            } else {
                others = true;
            }
        }
        (own, others)
    }

    /// Number of services known.
    pub fn services(&self) -> usize {
        self.queues.len()
    }

    /// Queue `i` (in round-robin order from the cursor: see [`FairQueue::order`]).
    pub fn queue(&self, i: usize) -> &ServiceQueue {
        &self.queues[i]
    }

    /// Queue `i`, mutably.
    pub fn queue_mut(&mut self, i: usize) -> &mut ServiceQueue {
        &mut self.queues[i]
    }

    /// Queue indices in the order they are to be polled now: the cursor's first.
    pub fn order(&self) -> impl Iterator<Item = usize> {
        let n = self.queues.len();
        let c = self.cursor;
        (0..n).map(move |k| (c + k) % n)
    }

    /// Queue `i` used a turn (sent a frame); the cursor moves on when its weight is spent.
    pub fn used_turn(&mut self, i: usize) {
        if i != self.cursor {
            self.cursor = i;
            self.turns_left = self.queues[i].weight;
        }
        self.turns_left = self.turns_left.saturating_sub(1);
        if self.turns_left == 0 {
            self.cursor = (i + 1) % self.queues.len().max(1);
            self.turns_left = self.queues[self.cursor].weight;
        }
    }

    /// Messages waiting in all queues.
    pub fn total(&self) -> usize {
        self.queues.iter().map(|q| q.messages).sum()
    }

    /// Bytes waiting in all queues.
    pub fn total_bytes(&self) -> usize {
        self.queues.iter().map(|q| q.data).sum()
    }

    /// Takes every message to `dest` out of every queue (a partly sent one too), returning
    /// (service, tag) of each, in queue order. Rare (a connection ends), so it rebuilds the
    /// queues that held any.
    pub fn remove_dest(&mut self, dest: Coord) -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        for q in &mut self.queues {
            if !q.meta.iter().any(|m| m.dest == dest) {
                continue;
            }
            let mut meta = VecDeque::with_capacity(q.meta.len());
            let mut bytes = ByteRing::default();
            let mut kept = Vec::new();
            let head_sent = q.progress.sent;
            for (i, m) in q.meta.drain(..).enumerate() {
                let sent = if i == 0 { head_sent } else { 0 };
                let header = if sent == 0 { MSG_HEADER_LEN } else { 0 };
                let rest = (m.len - sent) as usize;
                // What the ring holds of it: a run's header only.
                let n = header + if m.run.is_some() { 0 } else { rest };
                if m.dest == dest {
                    if i == 0 {
                        q.progress = HeadProgress::default();
                    }
                    out.extend(m.tags.iter().map(|t| (q.service, t)));
                    q.bytes.skip(n);
                    q.messages -= m.count() as usize;
                    let rest = m.body_bytes() - sent as usize;
                    q.data -= rest.min(q.data);
                    if m.run.is_some() {
                        q.runs -= 1;
                        q.compacted -= rest.min(q.compacted);
                    }
                } else {
                    kept.resize(n, 0);
                    q.bytes.take(&mut kept);
                    bytes.push(&kept);
                    meta.push_back(m);
                }
            }
            q.meta = meta;
            q.bytes = bytes;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(len: u32) -> Queued {
        Queued {
            tags: TagRun::one(0),
            service: 1,
            dest: Coord::new(1, 0, 0),
            len,
            reliable: true,
            fences: Fences::default(),
            enqueued: Time::ZERO,
            run: None,
            groupable: false,
        }
    }

    #[test]
    fn bounded_and_round_robin() {
        let mut fq = FairQueue::new(10);
        assert!(fq.push(1, msg(8), &[1; 8]).is_ok());
        assert_eq!(fq.push(1, msg(8), &[1; 8]), Err(Full));
        assert!(
            fq.push(2, msg(100), &[2; 100]).is_ok(),
            "an empty queue takes one"
        );
        fq.configure(3, 2, 100);
        fq.push(3, msg(1), &[3]).unwrap();
        let order: Vec<u16> = fq.order().map(|i| fq.queue(i).service).collect();
        assert_eq!(order, [1, 2, 3]);
        fq.used_turn(0);
        assert_eq!(fq.order().next(), Some(1));
        fq.used_turn(2);
        assert_eq!(fq.order().next(), Some(2), "weight 2: a second turn");
        fq.used_turn(2);
        assert_eq!(fq.order().next(), Some(0));
    }

    #[test]
    fn take_fragments_and_pops() {
        let mut fq = FairQueue::new(1000);
        fq.push(1, msg(5), b"hello").unwrap();
        fq.push(1, msg(2), b"yo").unwrap();
        let q = fq.queue_mut(0);
        let mut a = [0u8; 3];
        q.take_head(&mut a, Runs::Write);
        assert_eq!(&a, b"hel");
        assert_eq!(q.head_progress().sent, 3);
        let mut b = [0u8; 2];
        q.take_head(&mut b, Runs::Write);
        assert_eq!(&b, b"lo");
        assert_eq!(q.len(), 1);
        q.take_head(&mut b, Runs::Write);
        assert_eq!(&b, b"yo");
        assert!(q.is_empty());
    }

    #[test]
    fn remove_dest_keeps_the_others_bytes() {
        let mut fq = FairQueue::new(1000);
        let to = |x: u16, tag: u64, len: u32| Queued {
            dest: Coord::new(x, 0, 0),
            tags: TagRun::one(tag),
            ..msg(len)
        };
        fq.push(1, to(1, 10, 5), b"hello").unwrap();
        fq.push(1, to(2, 11, 3), b"abc").unwrap();
        fq.push(1, to(1, 12, 2), b"yo").unwrap();
        fq.push(2, to(2, 20, 1), b"z").unwrap();
        let mut part = [0u8; 2];
        fq.queue_mut(0).take_head(&mut part, Runs::Write);
        assert_eq!(fq.remove_dest(Coord::new(1, 0, 0)), [(1, 10), (1, 12)]);
        let q = fq.queue_mut(0);
        assert_eq!(q.len(), 1);
        let mut b = [0u8; 3];
        q.take_head(&mut b, Runs::Write);
        assert_eq!(&b, b"abc");
        assert_eq!(fq.total(), 1);
        assert!(fq.remove_dest(Coord::new(9, 0, 0)).is_empty());
    }

    /// A compacting queue takes and refuses the same messages as a plain one and hands out
    /// the same bytes, whole, in fragments, aggregated, and after a peer's are removed.
    #[test]
    fn compacting_queues_hand_out_the_same_bytes() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let mut plain = FairQueue::new(40_000);
        let mut compact = FairQueue::compacting(40_000);
        // Tails the compacting queue left unwritten and declared (written here, as the
        // simulator's driver does), and pushes with the run given by the sender.
        let (mut declared, mut hinted) = (0, 0);
        for step in 0..20_000u64 {
            let len = [3usize, 100, 600, 2000, 9000][rng.below(5) as usize];
            match rng.below(7) {
                0..=2 => {
                    let v = rng.below(256) as u8;
                    let mut data = vec![v; len];
                    match rng.below(3) {
                        0 => data.iter_mut().for_each(|b| *b = rng.below(256) as u8),
                        1 => {
                            let at = rng.below(len as u64) as usize;
                            data[at] = v.wrapping_add(1);
                        }
                        _ => {}
                    }
                    let q = Queued {
                        dest: Coord::new(rng.below(3) as u16, 0, 0),
                        tags: TagRun::one(step),
                        len: len as u32,
                        ..msg(0)
                    };
                    let mut qc = q;
                    if rng.below(2) == 0 {
                        qc.run = crate::byte_run::run_value(&data);
                        hinted += usize::from(qc.run.is_some());
                    }
                    assert_eq!(plain.push(1, q, &data), compact.push(1, qc, &data));
                }
                3 | 4 if plain.services() > 0 => {
                    let (a, b) = (plain.queue_mut(0), compact.queue_mut(0));
                    let Some(h) = a.head().copied() else { continue };
                    let left = u64::from(h.len - a.head_progress().sent);
                    let n = (1 + rng.below(left.max(1))).min(left) as usize;
                    let (mut x, mut y) = (vec![0u8; n], vec![1u8; n]);
                    a.take_head(&mut x, Runs::Write);
                    if let Some((at, v)) = b.take_head(
                        &mut y,
                        if rng.below(2) == 0 {
                            Runs::Declare
                        } else {
                            Runs::Write
                        },
                    ) {
                        assert!(y[at..].iter().all(|b| *b == 1), "left unwritten");
                        y[at..].fill(v);
                        declared += 1;
                    }
                    assert_eq!(x, y, "step {step}");
                }
                5 if plain.services() > 0 => {
                    let (a, b) = (plain.queue_mut(0), compact.queue_mut(0));
                    if a.head_progress().sent != 0 {
                        continue;
                    }
                    let count = 1 + rng.below(3) as usize;
                    let wire: usize = a
                        .iter()
                        .take(count)
                        .map(|m| MSG_HEADER_LEN + m.len as usize)
                        .sum();
                    let (mut x, mut y) = (vec![0u8; wire], vec![1u8; wire]);
                    a.take_entries(count, &mut x, Runs::Write);
                    let runs = if rng.below(2) == 0 {
                        Runs::Declare
                    } else {
                        Runs::Write
                    };
                    if let Some((at, v)) = b.take_entries(count, &mut y, runs) {
                        assert!(y[at..].iter().all(|b| *b == 1), "left unwritten");
                        y[at..].fill(v);
                        declared += 1;
                    }
                    assert_eq!(x, y, "step {step}");
                }
                6 => {
                    let dest = Coord::new(rng.below(3) as u16, 0, 0);
                    assert_eq!(plain.remove_dest(dest), compact.remove_dest(dest));
                }
                _ => {}
            }
            assert_eq!(plain.total(), compact.total());
            assert_eq!(plain.total_bytes(), compact.total_bytes());
        }
        assert!(declared > 100 && hinted > 100, "{declared} {hinted}");
    }

    /// A grouping queue hands out the same frames as one that keeps an entry per message:
    /// the same bytes, the same messages with the same tags, in the same order, whatever
    /// the mix of peers, kinds, fences, sizes and tags; and both remove a peer's messages
    /// alike.
    #[test]
    fn groups_frame_what_single_entries_would() {
        const ROOM: usize = 1486;
        let mut rng = crate::rng::SplitMix64::new(11);
        let (mut groups_seen, mut prefixes, mut joins) = (0, 0, 0);
        for compact in [false, true] {
            let make = |grouping: bool| {
                let q = if compact {
                    FairQueue::compacting(60_000)
                } else {
                    FairQueue::new(60_000)
                };
                if grouping {
                    q.grouping(ROOM)
                } else {
                    q
                }
            };
            let (mut single, mut grouped) = (make(false), make(true));
            // Sent as the transport sends: the fast way first for an unfenced message.
            let mut joined = make(true);
            let mut tag = 0u64;
            let mut like = (Coord::new(0, 0, 0), 1u16, true);
            for step in 0..30_000u64 {
                match rng.below(8) {
                    0..=4 => {
                        let len = [0usize, 1, 60, 64, 200, 700, 1480, 3000][rng.below(8) as usize];
                        let v = rng.below(3) as u8;
                        let data = vec![v; len];
                        tag = match rng.below(5) {
                            0 => tag,
                            1 | 2 => tag.wrapping_add(1),
                            3 => tag.wrapping_sub(1),
                            _ => rng.next_u64(),
                        };
                        let fences = Fences {
                            backward: rng.below(10) == 0,
                            forward: rng.below(10) == 0,
                        };
                        // Runs of messages alike, which group, and changes of peer, service
                        // or kind, which cut groups.
                        if rng.below(3) == 0 {
                            like = (
                                Coord::new(rng.below(2) as u16, 0, 0),
                                1 + rng.below(2) as u16,
                                rng.below(6) != 0,
                            );
                        }
                        let q = Queued {
                            dest: like.0,
                            service: like.1,
                            reliable: like.2,
                            fences,
                            tags: TagRun::one(tag),
                            len: len as u32,
                            ..msg(0)
                        };
                        let fast = !(fences.backward || fences.forward)
                            && joined.try_join(
                                1,
                                &Joining {
                                    dest: q.dest,
                                    service: q.service,
                                    reliable: q.reliable,
                                    tag,
                                    data: &data,
                                },
                            );
                        let r = grouped.push(1, q, &data);
                        assert_eq!(single.push(1, q, &data), r, "step {step}");
                        joins += usize::from(fast);
                        if !fast {
                            assert_eq!(joined.push(1, q, &data), r, "step {step}");
                        } else {
                            assert_eq!(r, Ok(()), "joined what the general way refused");
                        }
                    }
                    5 | 6 if single.services() > 0 => {
                        let (a, b) = (single.queue_mut(0), grouped.queue_mut(0));
                        let j = joined.queue_mut(0);
                        let Some(h) = a.head().copied() else { continue };
                        let bh = b.head().copied().unwrap();
                        assert_eq!(
                            (h.dest, h.reliable, h.tags.first()),
                            (bh.dest, bh.reliable, bh.tags.first())
                        );
                        groups_seen += usize::from(bh.count() > 1);
                        if a.head_progress().sent == 0 && MSG_HEADER_LEN + h.len as usize <= ROOM {
                            // An aggregated frame.
                            let mut ta: Vec<(u64, bool)> = Vec::new();
                            let mut tb: Vec<(u64, bool)> = Vec::new();
                            let pa = a.plan_aggregate(ROOM, |m, k| {
                                ta.extend(m.tags.head(k).iter().map(|t| (t, m.fences.forward)))
                            });
                            let pb = b.plan_aggregate(ROOM, |m, k| {
                                tb.extend(m.tags.head(k).iter().map(|t| (t, m.fences.forward)))
                            });
                            let mut tj: Vec<(u64, bool)> = Vec::new();
                            let pj = j.plan_aggregate(ROOM, |m, k| {
                                tj.extend(m.tags.head(k).iter().map(|t| (t, m.fences.forward)))
                            });
                            assert_eq!((pj, &tj), (pb, &tb), "step {step}");
                            let mut z = vec![5u8; pj.bytes];
                            j.take_planned(&pj, &mut z, Runs::Write);
                            assert_eq!(
                                (pa.messages, pa.bytes),
                                (pb.messages, pb.bytes),
                                "step {step}"
                            );
                            assert_eq!(ta, tb, "step {step}");
                            prefixes += usize::from(pb.prefix > 0);
                            let (mut x, mut y) = (vec![9u8; pa.bytes], vec![7u8; pb.bytes]);
                            a.take_planned(&pa, &mut x, Runs::Write);
                            b.take_planned(&pb, &mut y, Runs::Write);
                            assert_eq!(x, y, "step {step}");
                            assert_eq!(z, y, "step {step}");
                        } else {
                            // Alone, whole or a fragment.
                            let left = u64::from(h.len - a.head_progress().sent);
                            let n = left.min(1 + rng.below(2000)) as usize;
                            let (mut x, mut y) = (vec![0u8; n], vec![1u8; n]);
                            let mut z = vec![2u8; n];
                            a.take_head(&mut x, Runs::Write);
                            b.take_head(&mut y, Runs::Write);
                            j.take_head(&mut z, Runs::Write);
                            assert_eq!(x, y, "step {step}");
                            assert_eq!(z, y, "step {step}");
                        }
                    }
                    7 => {
                        let dest = Coord::new(rng.below(2) as u16, 0, 0);
                        let removed = grouped.remove_dest(dest);
                        assert_eq!(single.remove_dest(dest), removed);
                        assert_eq!(joined.remove_dest(dest), removed);
                    }
                    _ => {}
                }
                assert_eq!(single.total(), grouped.total());
                assert_eq!(single.total_bytes(), grouped.total_bytes());
                assert_eq!(joined.total(), grouped.total());
                assert_eq!(joined.total_bytes(), grouped.total_bytes());
            }
        }
        assert!(
            groups_seen > 400 && prefixes > 10 && joins > 1000,
            "{groups_seen} {prefixes} {joins}"
        );
    }
}

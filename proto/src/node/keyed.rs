//! Reliable messages to a routing key that follow the key's root (CamCube: a key message is
//! delivered to the key's current root).
//!
//! The contract. A reliable message sent to a key is delivered to a server that was the
//! key's root in its own view when the message arrived: the transport there checks it
//! ([`RootGate`]) before any service sees it and refuses it otherwise
//! ([`FailReason::NotRoot`]). When the server it went to refuses it, fails, restarts, resets
//! the connection or is cut off before it is delivered, this engine sends it again to the
//! key's root in its current view, without its sender's help, and reports it failed only
//! when no root has taken it by its deadline ([`KEYED_DEADLINE`]), or when the root says
//! its service is not there. The root's engine confirms each delivery with a receipt; the
//! sender's acknowledgement report follows the receipt, not the transport's acknowledgement
//! (which a refusal can follow). A message its root delivered and then failed before the
//! receipt left may be delivered again at the next root: the failed server's copy went with
//! it (its state did too), and the sender cannot tell the two apart. Fences hold on the first
//! server only.
//!
//! On the wire a key message is a reliable message to the reserved service
//! [`transport::KEYED`], its data behind [`wire::KEYED_HEADER`] (the key, the service it is
//! for, the service that sent it, this room's id for it, which is also its transport tag).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashSet;

use super::Event;
use crate::routing::RouteTable;
use crate::time::Time;
use crate::topology::Coord;
use crate::transport::{
    FailReason, Fences, HostedServices, KeyGate, Outgoing, SendError, Transport, KEYED,
};
use crate::wire::{self, KeyedHeader, KEYED_RECEIPT};

/// How long a key message may take to reach a root that takes it.
pub const KEYED_DEADLINE: Duration = Duration::from_secs(5);
/// The first pause before sending again to the same server (views disagree for a moment
/// after a change); it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(64);
/// Receipts owed while the transport has no room, at most (beyond, the senders' deadlines
/// settle their messages).
const MAX_OWED_RECEIPTS: usize = 65536;

/// The check this server's transport makes of a key message as it arrives: this server is
/// the key's root in its view, and the service it is for is here. Receipts pass.
#[derive(Debug)]
pub(super) struct RootGate {
    pub(super) local: Coord,
    pub(super) routes: Arc<RouteTable>,
    pub(super) hosted: Option<Arc<HostedServices>>,
}

impl KeyGate for RootGate {
    fn admit(&mut self, _src: Coord, data: &[u8]) -> Result<(), FailReason> {
        let Some((h, _)) = wire::keyed_header(data) else {
            return Err(FailReason::Refused);
        };
        if h.service == KEYED_RECEIPT {
            return Ok(());
        }
        if self.routes.key_root(h.key) != Some(self.local) {
            return Err(FailReason::NotRoot);
        }
        match self.hosted.as_deref().and_then(|x| x.refusal(h.service)) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

/// One key message until it ends.
#[derive(Debug)]
struct Record {
    key: u64,
    /// The service it is for, and the one that sent it.
    service: u16,
    from: u16,
    /// The sender's tag.
    tag: u64,
    /// Its bytes (behind the header each send writes).
    data: Vec<u8>,
    /// Fences, for the first server only.
    fences: Fences,
    deadline: Time,
    /// The server it is with now (sent, no answer yet), if any.
    dest: Option<Coord>,
    /// The server that last refused or failed it, and why.
    last: Option<(Coord, FailReason)>,
    /// The pause before sending again to the same server.
    backoff: Duration,
}

/// Counters of key messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyedStats {
    /// Key messages taken for sending.
    pub sent: u64,
    /// Sent again to a root after their server refused or failed them.
    pub resent: u64,
    /// Delivered here (this server their root).
    pub delivered: u64,
    /// Reported failed to their senders.
    pub failed: u64,
    /// Arrived malformed (not from an engine), dropped.
    pub malformed: u64,
    /// Receipts that could not be sent (no room for long, or the sender unreachable): their
    /// senders settle those messages at their deadlines.
    pub receipts_lost: u64,
}

/// The key messages of one engine, and what it reports of them.
#[derive(Debug, Default)]
pub(super) struct KeyedSends {
    next: u64,
    /// By id: the id of a message's latest send (ids grow, so a server's are in send order).
    records: BTreeMap<u64, Record>,
    /// Every record's deadline, and when a waiting one goes again: (when, id).
    deadlines: BTreeSet<(Time, u64)>,
    waiting: BTreeSet<(Time, u64)>,
    /// Receipts this server owes senders, waiting for room in the transport.
    owed: VecDeque<(Coord, u64)>,
    /// Services that asked for acknowledgement reports.
    notify: FxHashSet<u16>,
    /// The peers this engine may send to itself (none given: all).
    pub(super) owner: Option<Owner>,
    /// Messages for other engines of this server ([`KeyedHandoff`]).
    pub(super) handoffs: Vec<KeyedHandoff>,
    pub(super) stats: KeyedStats,
}

/// A key message this engine does not send itself: its root's connection belongs to another
/// engine of the same server (a dataplane with several pollers, each owning the connections
/// of some peers). The driver hands it to that engine as a send to the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedHandoff {
    /// The key.
    pub key: u64,
    /// The service it is for, and the one that sent it.
    pub service: u16,
    /// The service that sent it.
    pub from: u16,
    /// The sender's tag.
    pub tag: u64,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// Which peers' connections this engine owns, when it is one of several.
pub(super) struct Owner(pub(super) Box<dyn Fn(Coord) -> bool + Send>);

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Owner")
    }
}

/// What of the engine a key message needs.
pub(super) struct Parts<'a> {
    pub(super) local: Coord,
    pub(super) routes: &'a RouteTable,
    pub(super) transport: &'a mut Transport,
    pub(super) events: &'a mut VecDeque<Event>,
}

impl KeyedSends {
    /// Whether `service` gets acknowledgement reports of its key messages.
    pub(super) fn notify_acks(&mut self, service: u16, on: bool) {
        if on {
            self.notify.insert(service);
        } else {
            self.notify.remove(&service);
        }
    }

    /// Takes a reliable message to `key` for `service` from `from`. An error means it was
    /// not taken (nothing will be reported of it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send(
        &mut self,
        p: &mut Parts<'_>,
        now: Time,
        key: u64,
        service: u16,
        from: u16,
        data: &[u8],
        fences: Fences,
        tag: u64,
    ) -> Result<(), SendError> {
        if service == KEYED_RECEIPT {
            return Err(SendError::NotTaken(FailReason::Refused));
        }
        let r = Record {
            key,
            service,
            from,
            tag,
            data: data.to_vec(),
            fences,
            deadline: now + KEYED_DEADLINE,
            dest: None,
            last: None,
            backoff: RETRY_FIRST,
        };
        match p.routes.key_root(key) {
            Some(root) if root == p.local => {
                if let Some(why) = p.transport.refusal(service) {
                    return Err(SendError::NotTaken(why));
                }
                self.stats.sent += 1;
                self.stats.delivered += 1;
                deliver_here(p, &r);
                self.acked_here(p, &r);
                Ok(())
            }
            Some(root) if !self.owns(root) => {
                self.stats.sent += 1;
                self.hand_off(r);
                Ok(())
            }
            Some(root) => {
                let id = self.id();
                send_to(p, now, &r, root, id)?;
                self.stats.sent += 1;
                self.keep(
                    id,
                    Record {
                        dest: Some(root),
                        ..r
                    },
                );
                Ok(())
            }
            None => {
                // No root in this view yet (a server that just started, or one cut off):
                // it waits for one, until its deadline.
                self.stats.sent += 1;
                self.wait(now, r);
                Ok(())
            }
        }
    }

    fn owns(&self, peer: Coord) -> bool {
        self.owner.as_ref().is_none_or(|o| (o.0)(peer))
    }

    /// Passes `r` to the engine that owns its root's connection (through the driver): that
    /// engine sends it on, with a deadline of its own.
    fn hand_off(&mut self, r: Record) {
        self.handoffs.push(KeyedHandoff {
            key: r.key,
            service: r.service,
            from: r.from,
            tag: r.tag,
            data: r.data,
        });
    }

    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Files `r` under `id`, with its deadline.
    fn keep(&mut self, id: u64, r: Record) {
        self.deadlines.insert((r.deadline, id));
        self.records.insert(id, r);
    }

    /// Takes record `id` out of every index.
    fn take(&mut self, id: u64) -> Option<Record> {
        let r = self.records.remove(&id)?;
        self.deadlines.remove(&(r.deadline, id));
        Some(r)
    }

    /// A key message arrived here from `src` (its transport admitted it: this server is its
    /// root, or it is a receipt): the event it becomes, if any.
    pub(super) fn arrived(
        &mut self,
        p: &mut Parts<'_>,
        now: Time,
        src: Coord,
        data: &[u8],
        reliable: bool,
    ) -> Option<Event> {
        let Some((h, body)) = wire::keyed_header(data).filter(|_| reliable) else {
            self.stats.malformed += 1;
            return None;
        };
        if h.service == KEYED_RECEIPT {
            self.on_receipt(p, src, h.id);
            return None;
        }
        self.stats.delivered += 1;
        self.owed.push_back((src, h.id));
        self.flush_receipts(p, now);
        Some(Event::Message {
            src,
            service: h.service,
            data: body.to_vec(),
            reliable: true,
            key: Some(h.key),
        })
    }

    /// Sends the receipts owed, as far as the transport takes them.
    pub(super) fn flush_receipts(&mut self, p: &mut Parts<'_>, now: Time) {
        let mut buf = Vec::with_capacity(wire::KEYED_HEADER);
        while let Some(&(to, id)) = self.owed.front() {
            buf.clear();
            wire::put_keyed_header(
                &mut buf,
                KeyedHeader {
                    key: 0,
                    service: KEYED_RECEIPT,
                    from: KEYED,
                    id,
                },
            );
            let m = Outgoing {
                dest: to,
                service: KEYED,
                from: KEYED,
                data: &buf,
                reliable: true,
                fences: Fences::default(),
                tag: 0,
            };
            match p.transport.send(now, m) {
                Ok(()) => {}
                Err(SendError::WouldBlock) if self.owed.len() <= MAX_OWED_RECEIPTS => break,
                Err(_) => self.stats.receipts_lost += 1,
            }
            self.owed.pop_front();
        }
    }

    /// The root `src` delivered key message `id`.
    fn on_receipt(&mut self, p: &mut Parts<'_>, src: Coord, id: u64) {
        if self.records.get(&id).is_none_or(|r| r.dest != Some(src)) {
            return;
        }
        let Some(r) = self.take(id) else { return };
        if self.notify.contains(&r.from) {
            p.events.push_back(Event::Acked {
                peer: src,
                service: r.from,
                count: 1,
                last_tag: r.tag,
            });
        }
    }

    /// Key messages `ids` sent to `peer` failed there for `reason` (the transport says so).
    pub(super) fn on_failed(
        &mut self,
        p: &mut Parts<'_>,
        now: Time,
        peer: Coord,
        ids: &[u64],
        reason: FailReason,
    ) {
        for id in ids {
            if self.records.get(id).is_none_or(|r| r.dest != Some(peer)) {
                continue;
            }
            let Some(r) = self.take(*id) else { continue };
            self.failed_at(p, now, peer, r, reason);
        }
    }

    /// `r` failed at `peer`: sent on (the key may have another root by now) or reported.
    fn failed_at(
        &mut self,
        p: &mut Parts<'_>,
        now: Time,
        peer: Coord,
        mut r: Record,
        why: FailReason,
    ) {
        r.dest = None;
        let follows = matches!(
            why,
            FailReason::NotRoot
                | FailReason::Unreachable
                | FailReason::PeerRestarted
                | FailReason::PeerReset
                | FailReason::Silent
        );
        if !follows {
            self.fail(p, peer, &r, why);
            return;
        }
        r.last = Some((peer, why));
        self.attempt(p, now, r, false);
    }

    /// Sends `r` to the key's root now, or schedules it, or ends it at its deadline. Right
    /// after a refusal or failure (`paused` false) it goes at once only to another server;
    /// to the same one (its view or ours has not moved yet) after a pause.
    fn attempt(&mut self, p: &mut Parts<'_>, now: Time, mut r: Record, paused: bool) {
        if now >= r.deadline {
            self.expire(p, r);
            return;
        }
        let root = p.routes.key_root(r.key);
        let same = root.is_some() && root == r.last.map(|(c, _)| c);
        match root {
            Some(root) if root == p.local => {
                if let Some(why) = p.transport.refusal(r.service) {
                    self.fail(p, root, &r, why);
                    return;
                }
                self.stats.resent += 1;
                self.stats.delivered += 1;
                deliver_here(p, &r);
                self.acked_here(p, &r);
            }
            Some(root) if !self.owns(root) => self.hand_off(r),
            Some(root) if paused || !same => {
                let id = self.id();
                r.fences = Fences::default();
                match send_to(p, now, &r, root, id) {
                    Ok(()) => {
                        self.stats.resent += 1;
                        r.dest = Some(root);
                        self.keep(id, r);
                    }
                    Err(SendError::WouldBlock) => self.wait(now, r),
                    Err(e) => self.fail(p, root, &r, FailReason::of_send(e)),
                }
            }
            _ => self.wait(now, r),
        }
    }

    /// Reports `r`, delivered on this server, acknowledged to its sender if it asked.
    fn acked_here(&self, p: &mut Parts<'_>, r: &Record) {
        if self.notify.contains(&r.from) {
            p.events.push_back(Event::Acked {
                peer: p.local,
                service: r.from,
                count: 1,
                last_tag: r.tag,
            });
        }
    }

    /// Files `r` to go again after its pause (or at its deadline).
    fn wait(&mut self, now: Time, mut r: Record) {
        let at = (now + r.backoff).min(r.deadline);
        r.backoff = (r.backoff * 2).min(RETRY_MAX);
        let id = self.id();
        self.waiting.insert((at, id));
        self.keep(id, r);
    }

    /// `r` reached its deadline without a root taking it: reported failed, with the last
    /// server's answer (none took it: unreachable; one held it and said nothing: silent).
    fn expire(&mut self, p: &mut Parts<'_>, r: Record) {
        let (peer, why) = match (r.dest, r.last) {
            (Some(d), _) => (d, FailReason::Silent),
            (None, Some((c, FailReason::NotRoot))) => (c, FailReason::Unreachable),
            (None, Some((c, w))) => (c, w),
            (None, None) => (p.local, FailReason::Unreachable),
        };
        self.fail(p, peer, &r, why);
    }

    fn fail(&mut self, p: &mut Parts<'_>, peer: Coord, r: &Record, reason: FailReason) {
        self.stats.failed += 1;
        p.events.push_back(Event::Failed {
            peer,
            service: r.from,
            tags: vec![r.tag],
            reason,
        });
    }

    /// Runs what is due: messages waiting to go again, deadlines, receipts owed.
    pub(super) fn on_timeout(&mut self, p: &mut Parts<'_>, now: Time) {
        while let Some(&(at, id)) = self.waiting.first() {
            if at > now {
                break;
            }
            self.waiting.pop_first();
            if let Some(r) = self.take(id) {
                self.attempt(p, now, r, true);
            }
        }
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now {
                break;
            }
            if let Some(r) = self.take(id) {
                self.waiting.remove(&(at, id));
                self.expire(p, r);
            }
        }
        if !self.owed.is_empty() {
            self.flush_receipts(p, now);
        }
    }

    /// When something is due.
    pub(super) fn poll_timeout(&self) -> Option<Time> {
        let first = |s: &BTreeSet<(Time, u64)>| s.first().map(|(at, _)| *at);
        [first(&self.waiting), first(&self.deadlines)]
            .into_iter()
            .flatten()
            .min()
    }

    /// The view changed: what waits for a root tries again now, and what a server now
    /// unreachable held is sent on (its receipt will not come).
    pub(super) fn on_view(&mut self, p: &mut Parts<'_>, now: Time) {
        let lost: Vec<(u64, Coord)> = self
            .records
            .iter()
            .filter_map(|(id, r)| r.dest.map(|d| (*id, d)))
            .filter(|(_, d)| !p.routes.is_reachable(*d))
            .collect();
        for (id, d) in lost {
            if let Some(r) = self.take(id) {
                self.failed_at(p, now, d, r, FailReason::Unreachable);
            }
        }
        let due: Vec<(Time, u64)> = std::mem::take(&mut self.waiting).into_iter().collect();
        for (_, id) in due {
            if let Some(mut r) = self.take(id) {
                r.backoff = RETRY_FIRST;
                self.attempt(p, now, r, true);
            }
        }
    }

    /// Key messages not yet ended (sent, waiting or to hand off), and receipts owed.
    pub(super) fn pending(&self) -> usize {
        self.records.len() + self.owed.len() + self.handoffs.len()
    }
}

/// Sends `r` to `root` as this room's message `id`.
fn send_to(
    p: &mut Parts<'_>,
    now: Time,
    r: &Record,
    root: Coord,
    id: u64,
) -> Result<(), SendError> {
    let mut data = Vec::with_capacity(wire::KEYED_HEADER + r.data.len());
    wire::put_keyed_header(
        &mut data,
        KeyedHeader {
            key: r.key,
            service: r.service,
            from: r.from,
            id,
        },
    );
    data.extend_from_slice(&r.data);
    p.transport.send(
        now,
        Outgoing {
            dest: root,
            service: KEYED,
            from: KEYED,
            data: &data,
            reliable: true,
            fences: r.fences,
            tag: id,
        },
    )
}

/// Delivers `r` on this server, its root.
fn deliver_here(p: &mut Parts<'_>, r: &Record) {
    p.events.push_back(Event::Message {
        src: p.local,
        service: r.service,
        data: r.data.clone(),
        reliable: true,
        key: Some(r.key),
    });
}

//! `names` (service 5): where services run, found by name across the torus (libRIPC's
//! resolver, as a directory on the key space).
//!
//! A name's directory entry lives on the root of the name's key (SHA-1 of `"service:" +
//! name`). Every server registers the names of its attached applications there, and
//! re-registers them every `refresh`; an entry not refreshed for `3 x refresh` is dropped,
//! as is every entry of a server that becomes unreachable. So the directory is soft state:
//! when a name's root changes (a root fails, a server finishes joining and takes the key),
//! every server registering the name sends it to the new root at once, and the new root,
//! until one refresh has passed since its view changed, holds a lookup it has no entry for
//! rather than answer "nowhere" (a registration may still be on its way: views change on
//! different servers at different moments). An application that exits is unregistered at
//! once, and one that moves to another server is found there as soon as it registers. A
//! lookup goes to the root and comes back with every server hosting the name; it ends with
//! an answer or its deadline.
//!
//! Messages (reliable, service 5): `G id name` register, `U id name` unregister,
//! `L query name` look up, `A query n (x y z id)*n` answer. Names are at most 255 bytes;
//! a directory keeps at most 65536 names of at most 256 servers each.

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde_json::{json, Value};
use torusnet_proto::keyspace::Key;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims};

/// Service id of the name directory.
pub const NAMES: u16 = 5;

/// Longest name.
pub const MAX_NAME: usize = 255;

/// Whether `name` may name a service: 1..=[`MAX_NAME`] bytes, no spaces or control
/// characters (what an application attaches with, and what a node file weighs).
pub fn is_service_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.chars().any(|c| c.is_control() || c.is_whitespace())
}
const MAX_NAMES: usize = 1 << 16;
const MAX_HOSTS: usize = 256;
/// Lookups a settling root holds at most (more are answered with what it knows).
const MAX_HELD: usize = 4096;

/// What the name service is asked by its own server.
#[derive(Debug)]
pub enum NamesRequest {
    /// Keep `name` registered for service `id` on this server.
    Register {
        /// The name.
        name: String,
        /// Its service id here.
        id: u16,
    },
    /// Stop registering it (and remove it from the directory now).
    Unregister {
        /// The name.
        name: String,
        /// Its service id.
        id: u16,
    },
    /// Where `name` runs: `{"locations": [{"server": [x,y,z], "service": id}, ...]}`.
    Lookup {
        /// The name.
        name: String,
        /// Answer by then, with an error if the directory did not answer.
        timeout: Duration,
        /// Where the answer goes.
        reply: Sender<Value>,
    },
}

/// The routing key of a name's directory entry.
pub fn name_key(name: &str) -> u64 {
    Key::from_string(&format!("service:{name}")).routing_key()
}

#[derive(Debug)]
struct Pending {
    reply: Sender<Value>,
    deadline: Time,
}

/// A name this server registers, and the root it last sent the registration to.
#[derive(Debug)]
struct Mine {
    name: String,
    id: u16,
    root: Option<Coord>,
}

/// A lookup this root holds: it has no entry yet, and its view changed less than one
/// refresh ago.
#[derive(Debug)]
struct Held {
    from: Coord,
    query: u64,
    name: String,
}

/// The name service of one server: its own registrations, the directory entries it roots,
/// and lookups in flight.
#[derive(Debug)]
pub struct Names {
    refresh: Duration,
    mine: Vec<Mine>,
    next_refresh: Option<Time>,
    /// Until then, lookups of names without an entry are held (the view changed).
    settling_until: Option<Time>,
    held: Vec<Held>,
    /// name -> (server, service id, expires).
    directory: HashMap<String, Vec<(Coord, u16, Time)>>,
    pending: HashMap<u64, Pending>,
    next_query: u64,
    buf: Vec<u8>,
}

impl Default for Names {
    fn default() -> Names {
        Names::new(Duration::from_secs(1))
    }
}

fn rel() -> MsgOptions {
    MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    }
}

impl Names {
    /// A name service re-registering every `refresh`.
    pub fn new(refresh: Duration) -> Names {
        Names {
            refresh,
            mine: Vec::new(),
            next_refresh: None,
            settling_until: None,
            held: Vec::new(),
            directory: HashMap::new(),
            pending: HashMap::new(),
            next_query: 1,
            buf: Vec::new(),
        }
    }

    /// How many names this server roots entries for.
    pub fn rooted(&self) -> usize {
        self.directory.len()
    }

    /// Sends a registration (or its removal) to the name's root; false when it could not be
    /// queued (it goes again at the next refresh).
    fn send_named(
        &mut self,
        now: Time,
        node: &mut dyn Engine,
        op: u8,
        id: u16,
        name: &str,
    ) -> bool {
        self.buf.clear();
        self.buf.push(op);
        self.buf.extend_from_slice(&id.to_le_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        node.send(now, Target::Key(name_key(name)), NAMES, &self.buf, rel())
            .is_ok()
    }

    /// Registers every name of ours whose root is not the one last registered at (`all`:
    /// every name, the refresh). Returns how many were sent.
    fn register_mine(&mut self, now: Time, node: &mut dyn Engine, all: bool) -> usize {
        let mut mine = std::mem::take(&mut self.mine);
        let mut n = 0;
        for m in &mut mine {
            let root = node.key_root(name_key(&m.name));
            // A registration that could not be queued leaves the root unrecorded, so the next
            // view change or refresh sends it again.
            if (all || root != m.root) && self.send_named(now, node, b'G', m.id, &m.name) {
                m.root = root;
                n += 1;
            }
        }
        self.mine = mine;
        n
    }

    /// The view changed: names whose root moved are registered there now, and this server
    /// holds "nowhere" answers for one refresh (the registrations of names it now roots
    /// may still be on their way).
    fn view_changed(&mut self, now: Time, node: &mut dyn Engine) {
        self.register_mine(now, node, false);
        self.settling_until = Some(now + self.refresh);
    }

    fn register_at(&mut self, now: Time, node: &mut dyn Engine, from: Coord, id: u16, name: &str) {
        if name.len() > MAX_NAME
            || (self.directory.len() >= MAX_NAMES && !self.directory.contains_key(name))
        {
            return;
        }
        let expires = now + self.refresh * 3;
        // The refresh tick also expires entries: keep it running while this server roots any.
        self.next_refresh.get_or_insert(now + self.refresh);
        let e = self.directory.entry(name.to_string()).or_default();
        if let Some(x) = e.iter_mut().find(|(c, i, _)| *c == from && *i == id) {
            x.2 = expires;
        } else if e.len() < MAX_HOSTS {
            e.push((from, id, expires));
        }
        // Lookups held for this name have their answer now.
        let (ready, rest): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.name == name);
        self.held = rest;
        for h in ready {
            self.answer(now, node, h.from, h.query, &h.name);
        }
    }

    fn unregister_at(&mut self, from: Coord, id: u16, name: &str) {
        if let Some(e) = self.directory.get_mut(name) {
            e.retain(|(c, i, _)| !(*c == from && *i == id));
            if e.is_empty() {
                self.directory.remove(name);
            }
        }
    }

    /// Answers a lookup, or holds it while the view settles and no entry is known.
    fn lookup(&mut self, now: Time, node: &mut dyn Engine, from: Coord, query: u64, name: &str) {
        let known = self
            .directory
            .get(name)
            .is_some_and(|e| e.iter().any(|x| x.2 > now));
        if !known && self.settling_until.is_some_and(|t| now < t) && self.held.len() < MAX_HELD {
            self.held.push(Held {
                from,
                query,
                name: name.to_string(),
            });
            return;
        }
        self.answer(now, node, from, query, name);
    }

    fn answer(&mut self, now: Time, node: &mut dyn Engine, to: Coord, query: u64, name: &str) {
        let hosts: Vec<(Coord, u16)> = self
            .directory
            .get(name)
            .map(|e| e.iter().filter(|x| x.2 > now).map(|x| (x.0, x.1)).collect())
            .unwrap_or_default();
        self.buf.clear();
        self.buf.push(b'A');
        self.buf.extend_from_slice(&query.to_le_bytes());
        self.buf
            .extend_from_slice(&(hosts.len() as u16).to_le_bytes());
        for (c, id) in hosts {
            for v in [c.x, c.y, c.z, id] {
                self.buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        if to == node.local() {
            let body = self.buf[1..].to_vec();
            self.finish(query, &body);
        } else {
            let _ = node.send(now, Target::Server(to), NAMES, &self.buf, rel());
        }
    }

    /// An answer (the bytes after `A`) for one of our lookups.
    fn finish(&mut self, query: u64, body: &[u8]) {
        let Some(p) = self.pending.remove(&query) else {
            return;
        };
        let mut locations = Vec::new();
        let n = body
            .get(8..10)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
            .unwrap_or(0);
        for i in 0..n {
            let Some(e) = body.get(10 + i * 8..18 + i * 8) else {
                break;
            };
            let g = |k: usize| u16::from_le_bytes([e[k], e[k + 1]]);
            locations.push(json!({"server": [g(0), g(2), g(4)], "service": g(6)}));
        }
        let _ = p.reply.send(json!({ "locations": locations }));
    }

    fn on_message(&mut self, now: Time, src: Coord, data: &[u8], node: &mut dyn Engine) {
        let Some((&op, rest)) = data.split_first() else {
            return;
        };
        match op {
            b'G' | b'U' if rest.len() >= 2 => {
                let id = u16::from_le_bytes([rest[0], rest[1]]);
                let Ok(name) = std::str::from_utf8(&rest[2..]) else {
                    return;
                };
                if op == b'G' {
                    self.register_at(now, node, src, id, name);
                } else {
                    self.unregister_at(src, id, name);
                }
            }
            b'L' if rest.len() >= 8 => {
                let mut q = [0u8; 8];
                q.copy_from_slice(&rest[..8]);
                if let Ok(name) = std::str::from_utf8(&rest[8..]) {
                    let name = name.to_string();
                    self.lookup(now, node, src, u64::from_le_bytes(q), &name);
                }
            }
            b'A' if rest.len() >= 10 => {
                let mut q = [0u8; 8];
                q.copy_from_slice(&rest[..8]);
                self.finish(u64::from_le_bytes(q), rest);
            }
            _ => {}
        }
    }
}

impl Service for Names {
    fn name(&self) -> &'static str {
        "names"
    }

    fn ids(&self) -> &[u16] {
        &[NAMES]
    }

    fn on_event(&mut self, now: Time, e: &Event, node: &mut dyn Engine) {
        match e {
            Event::Message {
                src,
                service: NAMES,
                data,
                ..
            } => self.on_message(now, *src, data, node),
            Event::Unreachable(c) => {
                for e in self.directory.values_mut() {
                    e.retain(|x| x.0 != *c);
                }
                self.directory.retain(|_, e| !e.is_empty());
                self.view_changed(now, node);
            }
            Event::Reachable(_) | Event::RootsMoved => self.view_changed(now, node),
            // A restarted root lost the directory: register everything again now.
            Event::PeerReset { .. } => self.next_refresh = Some(now),
            _ => {}
        }
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        node: &mut dyn Engine,
    ) -> Result<(), Request> {
        match *request.downcast::<NamesRequest>()? {
            NamesRequest::Register { name, id } => {
                let sent = self.send_named(now, node, b'G', id, &name);
                let root = node.key_root(name_key(&name)).filter(|_| sent);
                match self.mine.iter_mut().find(|m| m.name == name && m.id == id) {
                    Some(m) => m.root = root,
                    None => self.mine.push(Mine {
                        name: name.clone(),
                        id,
                        root,
                    }),
                }
                self.next_refresh.get_or_insert(now + self.refresh);
            }
            NamesRequest::Unregister { name, id } => {
                self.mine.retain(|m| !(m.name == name && m.id == id));
                // A removal that cannot be queued leaves the entry to expire (3 refreshes).
                let _ = self.send_named(now, node, b'U', id, &name);
            }
            NamesRequest::Lookup {
                name,
                timeout,
                reply,
            } => {
                let q = self.next_query;
                self.next_query += 1;
                self.pending.insert(
                    q,
                    Pending {
                        reply,
                        deadline: now + timeout,
                    },
                );
                self.buf.clear();
                self.buf.push(b'L');
                self.buf.extend_from_slice(&q.to_le_bytes());
                self.buf.extend_from_slice(name.as_bytes());
                let key = name_key(&name);
                if node.key_root(key) == Some(node.local()) {
                    let me = node.local();
                    self.lookup(now, node, me, q, &name);
                } else if let Err(e) = node.send(now, Target::Key(key), NAMES, &self.buf, rel()) {
                    if let Some(p) = self.pending.remove(&q) {
                        let _ = p
                            .reply
                            .send(json!({"error": format!("lookup of {name:?}: {e}")}));
                    }
                }
            }
        }
        Ok(())
    }

    fn poll(&mut self, now: Time, node: &mut dyn Engine) -> usize {
        let mut n = 0;
        if self.settling_until.is_some_and(|t| now >= t) {
            self.settling_until = None;
            // Settled: what is still held has no entry anywhere.
            for h in std::mem::take(&mut self.held) {
                self.answer(now, node, h.from, h.query, &h.name);
                n += 1;
            }
        }
        if self.next_refresh.is_some_and(|t| now >= t) {
            n += self.register_mine(now, node, true);
            self.next_refresh =
                (!self.mine.is_empty() || !self.directory.is_empty()).then_some(now + self.refresh);
            // Expired entries go with the refresh tick.
            for e in self.directory.values_mut() {
                e.retain(|x| x.2 > now);
            }
            self.directory.retain(|_, e| !e.is_empty());
        }
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(q, _)| *q)
            .collect();
        for q in expired {
            if let Some(p) = self.pending.remove(&q) {
                let _ = p
                    .reply
                    .send(json!({"error": "the name directory did not answer in time"}));
                n += 1;
            }
        }
        n
    }

    fn poll_timeout(&self) -> Option<Time> {
        let lookups = self.pending.values().map(|p| p.deadline).min();
        [self.next_refresh, lookups, self.settling_until]
            .into_iter()
            .flatten()
            .min()
    }
}

/// The fuzz body of the directory's decoder (`fuzz/`'s `names`, and a short run in the
/// tests): a message of any bytes from another server, arriving while a lookup of this
/// server's waits for its answer, is taken or dropped without a panic, and the directory
/// runs on.
pub fn check_untrusted(data: &[u8]) {
    let dims = Dims::new(2, 2, 1).expect("2x2x1");
    let mut net = crate::testnet::Net::new(dims, |_| Names::new(Duration::from_secs(1)));
    let (reply, _answers) = std::sync::mpsc::channel();
    let here = Coord::new(0, 0, 0);
    net.request(
        here,
        Box::new(NamesRequest::Lookup {
            name: "svc".into(),
            timeout: Duration::from_millis(5),
            reply,
        }),
    );
    net.inject(Coord::new(1, 0, 0), here, NAMES, data.to_vec());
    net.run(Time::from_nanos(10_000_000));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testnet::Net;
    use std::sync::mpsc::{channel, Receiver};

    fn look(net: &mut Net<Names>, at: Coord, name: &str) -> Receiver<Value> {
        let (reply, rx) = channel();
        let r = NamesRequest::Lookup {
            name: name.into(),
            timeout: Duration::from_secs(5),
            reply,
        };
        net.request(at, Box::new(r));
        rx
    }

    fn servers(v: &Value) -> Vec<Value> {
        v["locations"]
            .as_array()
            .map(|a| a.iter().map(|l| l["server"].clone()).collect())
            .unwrap_or_default()
    }

    /// A torus where `name`'s key is rooted at `joiner` once it finishes joining, and at
    /// another server while it joins; with the name registered at the server farthest from
    /// `joiner`, and a server next to `joiner` to look it up from.
    fn joining_root(name: &str) -> (Net<Names>, Coord, Coord, Coord) {
        let dims = Dims::new(6, 6, 1).expect("6x6x1");
        let mut net = Net::new(dims, |_| Names::new(Duration::from_secs(1)));
        let joiner =
            torusnet_proto::keyspace::root(dims, name_key(name), |_| true).expect("a root");
        net.joining[dims.index(joiner)] = true;
        let far = Coord::new((joiner.x + 3) % 6, (joiner.y + 3) % 6, 0);
        let near = Coord::new((joiner.x + 1) % 6, joiner.y, 0);
        net.request(
            far,
            Box::new(NamesRequest::Register {
                name: name.into(),
                id: 1025,
            }),
        );
        net.run(Time::from_nanos(100_000_000));
        (net, joiner, far, near)
    }

    #[test]
    fn a_name_is_found_at_once_after_its_root_moves_to_a_server_that_finished_joining() {
        let (mut net, joiner, far, near) = joining_root("echo-c");
        let before = look(&mut net, near, "echo-c");
        net.run(Time::from_nanos(200_000_000));
        let v = before.try_recv().expect("answered");
        assert_eq!(servers(&v), vec![json!([far.x, far.y, far.z])], "{v}");

        // The joiner takes the key: the registrant sends there at once, but the lookup from
        // next door arrives first (one hop against six). Held, not answered "nowhere".
        net.set_joining(joiner, false);
        let after = look(&mut net, near, "echo-c");
        let t0 = net.now;
        net.run(t0 + Duration::from_millis(5));
        let v = after
            .try_recv()
            .expect("answered within a few hops, not a refresh");
        assert_eq!(servers(&v), vec![json!([far.x, far.y, far.z])], "{v}");
        assert_eq!(net.svc[net.dims.index(joiner)].rooted(), 1);
    }

    #[test]
    fn a_name_nobody_registers_is_answered_nowhere_once_the_view_settles() {
        let (mut net, joiner, _, near) = joining_root("echo-c");
        net.set_joining(joiner, false);
        let t0 = net.now;
        let rx = look(&mut net, near, "nobody-here");
        net.run(t0 + Duration::from_millis(500));
        assert!(rx.try_recv().is_err(), "held while the view settles");
        net.run(t0 + Duration::from_millis(1100));
        let v = rx.try_recv().expect("answered after one refresh");
        assert_eq!(servers(&v), Vec::<Value>::new(), "{v}");
        // A settled root answers at once.
        let rx = look(&mut net, near, "nobody-here");
        let t0 = net.now;
        net.run(t0 + Duration::from_millis(1));
        assert!(rx.try_recv().is_ok(), "a settled root answers at once");
    }

    #[test]
    fn a_name_whose_root_fails_is_registered_at_the_next_root_at_once() {
        let (mut net, joiner, far, near) = joining_root("echo-c");
        net.set_joining(joiner, false);
        net.run(net.now + Duration::from_millis(50));
        net.kill(joiner);
        let rx = look(&mut net, near, "echo-c");
        let t0 = net.now;
        net.run(t0 + Duration::from_millis(5));
        let v = rx.try_recv().expect("answered within a few hops");
        assert_eq!(servers(&v), vec![json!([far.x, far.y, far.z])], "{v}");
    }

    #[test]
    fn a_short_fuzz_run() {
        let mut seeds = Vec::new();
        for (op, id, name) in [(b'G', 1025u16, "echo"), (b'U', 7, "svc")] {
            let mut b = vec![op];
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            seeds.push(b);
        }
        let mut look = vec![b'L'];
        look.extend_from_slice(&1u64.to_le_bytes());
        look.extend_from_slice(b"svc");
        seeds.push(look);
        let mut answer = vec![b'A'];
        answer.extend_from_slice(&1u64.to_le_bytes());
        answer.extend_from_slice(&2u16.to_le_bytes());
        for v in [1u16, 0, 0, 1025, 0, 1, 0, 2000] {
            answer.extend_from_slice(&v.to_le_bytes());
        }
        seeds.push(answer);
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "names", &seeds);
        torusnet_proto::fuzz::run(&seeds, 100_000, 25, check_untrusted);
    }
}

//! The key-value service's messages between servers (service 6, reliable), and their
//! encoding. Every decoder checks lengths and refuses what does not parse; nothing panics on
//! bytes from the network.

use std::time::Duration;

use torusnet_proto::time::Time;

use super::ops::{Mode, Op, Outcome, Ttl};
use super::store::{Copy, Earlier, Item, MAX_EARLIER};

/// One message of the key-value protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// An operation for the key's primary (or, with `cache_fill`, a read a cache server
    /// forwards on a miss; the primary records the cache server as holding a copy).
    Req {
        /// The requester's operation id (echoed in the answer).
        id: u64,
        /// The read fills a cache.
        cache_fill: bool,
        /// Go through the cache at the receiver (a read sent to a cache server).
        via_cache: bool,
        /// The key.
        key: Vec<u8>,
        /// What to do.
        op: Op,
    },
    /// The answer to `Req` `id`.
    Resp {
        /// The operation id.
        id: u64,
        /// The answer.
        outcome: Outcome,
    },
    /// The receiver is not the key's primary in its own view: ask the primary again.
    Redirect {
        /// The operation id.
        id: u64,
    },
    /// A primary's copy of a key for a replica (or for a server catching up).
    Repl {
        /// Answered with `Rack`.
        id: u64,
        /// The key.
        key: Vec<u8>,
        /// Its state.
        copy: Copy,
        /// The key's earlier writes a retry may repeat (not to be applied again).
        earlier: Earlier,
    },
    /// A replica has the copy (`applied`: it was news to it).
    Rack {
        /// The `Repl` id.
        id: u64,
        /// Whether the copy changed the replica.
        applied: bool,
    },
    /// The receiver's view shows another primary for the key of this `Repl` or `Fetch`: the
    /// sender must not acknowledge the write, nor answer from its own copy.
    Refused {
        /// The `Repl` or `Fetch` id.
        id: u64,
    },
    /// What do you have for this key? (A primary that has not caught up yet asks the other
    /// holders before answering.)
    Fetch {
        /// Answered with `Fetched`.
        id: u64,
        /// The key.
        key: Vec<u8>,
    },
    /// The answer to `Fetch`.
    Fetched {
        /// The `Fetch` id.
        id: u64,
        /// What the holder has.
        copy: Option<Copy>,
        /// The holder's flush floor (versions below it were flushed).
        floor: u64,
        /// The key's earlier writes the holder remembers.
        earlier: Earlier,
    },
    /// Drop cached copies of the key older than `version`; answered with `Rack`.
    Invalidate {
        /// Answered with `Rack`.
        id: u64,
        /// The version written.
        version: u64,
        /// The key.
        key: Vec<u8>,
    },
    /// Send me what I should hold (I restarted or came back).
    CatchUp {
        /// The sender's flush floor.
        floor: u64,
    },
    /// Everything you should hold from me has been sent.
    CatchUpDone {
        /// The sender's flush floor.
        floor: u64,
    },
    /// Invalidate every item, after `delay`; answered with `Flushed`.
    Flush {
        /// Answered with `Flushed`.
        id: u64,
        /// Seconds.
        delay: u32,
    },
    /// Done.
    Flushed {
        /// The `Flush` id.
        id: u64,
    },
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    fn bytes32(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn key(&mut self) -> Option<Vec<u8>> {
        let n = usize::from(self.u8()?);
        self.take(n).map(<[u8]>::to_vec)
    }
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    // Keys are at most 250 bytes (checked at the gateway); a longer one is cut, never a panic.
    let n = key.len().min(255);
    out.push(n as u8);
    out.extend_from_slice(&key[..n]);
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Remaining lifetime on the wire: milliseconds, u64::MAX for never (local times mean nothing
/// to another server).
fn put_expiry(out: &mut Vec<u8>, expires: Option<Time>, now: Time) {
    let ms = match expires {
        None => u64::MAX,
        Some(t) if t <= now => 0,
        Some(t) => (t.since(now).as_millis() as u64).min(MAX_EXPIRY_MS),
    };
    out.extend_from_slice(&ms.to_le_bytes());
}

/// The longest time to expiry a message may carry (200 years): memcached's absolute
/// expiry times lie within it, and a time beyond would not survive re-encoding (the clock
/// would saturate).
const MAX_EXPIRY_MS: u64 = 200 * 365 * 24 * 3600 * 1000;

/// An expiry as carried (`None` inside: never); `None`: beyond [`MAX_EXPIRY_MS`], malformed.
fn expiry(ms: u64, now: Time) -> Option<Option<Time>> {
    match ms {
        u64::MAX => Some(None),
        ms if ms > MAX_EXPIRY_MS => None,
        ms => Some(Some(now + Duration::from_millis(ms))),
    }
}

fn put_item(out: &mut Vec<u8>, i: &Item, now: Time) {
    out.extend_from_slice(&i.version.to_le_bytes());
    out.extend_from_slice(&i.origin.to_le_bytes());
    out.extend_from_slice(&i.flags.to_le_bytes());
    put_expiry(out, i.expires, now);
    put_bytes32(out, &i.value);
}

fn item(r: &mut Reader<'_>, now: Time) -> Option<Item> {
    Some(Item {
        version: r.u64()?,
        origin: r.u64()?,
        flags: r.u32()?,
        expires: expiry(r.u64()?, now)?,
        value: r.bytes32()?.to_vec(),
    })
}

fn put_copy(out: &mut Vec<u8>, c: &Copy, now: Time) {
    match c {
        Copy::Deleted { version, origin } => {
            out.push(0);
            out.extend_from_slice(&version.to_le_bytes());
            out.extend_from_slice(&origin.to_le_bytes());
        }
        Copy::Item(i) => {
            out.push(1);
            put_item(out, i, now);
        }
    }
}

fn put_earlier(out: &mut Vec<u8>, e: &[(u64, u64)]) {
    // The store keeps at most MAX_EARLIER; a longer list is cut to its newest.
    let e = &e[e.len().saturating_sub(MAX_EARLIER)..];
    out.push(e.len() as u8);
    for (origin, version) in e {
        out.extend_from_slice(&origin.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
    }
}

fn earlier(r: &mut Reader<'_>) -> Option<Earlier> {
    let n = usize::from(r.u8()?);
    if n > MAX_EARLIER {
        return None;
    }
    (0..n).map(|_| Some((r.u64()?, r.u64()?))).collect()
}

fn copy(r: &mut Reader<'_>, now: Time) -> Option<Copy> {
    match r.u8()? {
        0 => Some(Copy::Deleted {
            version: r.u64()?,
            origin: r.u64()?,
        }),
        1 => Some(Copy::Item(item(r, now)?)),
        _ => None,
    }
}

fn put_op(out: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Get => out.push(0),
        Op::GetAndTouch(t) => {
            out.push(1);
            out.extend_from_slice(&t.code().to_le_bytes());
        }
        Op::Touch(t) => {
            out.push(2);
            out.extend_from_slice(&t.code().to_le_bytes());
        }
        Op::Store {
            mode,
            value,
            flags,
            ttl,
            cas,
        } => {
            out.push(3);
            out.push(match mode {
                Mode::Set => 0,
                Mode::Add => 1,
                Mode::Replace => 2,
                Mode::Append => 3,
                Mode::Prepend => 4,
            });
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&ttl.code().to_le_bytes());
            out.push(u8::from(cas.is_some()));
            out.extend_from_slice(&cas.unwrap_or(0).to_le_bytes());
            put_bytes32(out, value);
        }
        Op::Delete { cas } => {
            out.push(4);
            out.push(u8::from(cas.is_some()));
            out.extend_from_slice(&cas.unwrap_or(0).to_le_bytes());
        }
        Op::Arith { incr, delta, init } => {
            out.push(5);
            out.push(u8::from(*incr));
            out.extend_from_slice(&delta.to_le_bytes());
            out.push(u8::from(init.is_some()));
            let (v, t) = init.unwrap_or((0, Ttl::Never));
            out.extend_from_slice(&v.to_le_bytes());
            out.extend_from_slice(&t.code().to_le_bytes());
        }
    }
}

fn op(r: &mut Reader<'_>) -> Option<Op> {
    Some(match r.u8()? {
        0 => Op::Get,
        1 => Op::GetAndTouch(Ttl::from_code(r.u32()?)),
        2 => Op::Touch(Ttl::from_code(r.u32()?)),
        3 => {
            let mode = match r.u8()? {
                0 => Mode::Set,
                1 => Mode::Add,
                2 => Mode::Replace,
                3 => Mode::Append,
                4 => Mode::Prepend,
                _ => return None,
            };
            let flags = r.u32()?;
            let ttl = Ttl::from_code(r.u32()?);
            let has = r.u8()? != 0;
            let c = r.u64()?;
            let value = r.bytes32()?.to_vec();
            Op::Store {
                mode,
                value,
                flags,
                ttl,
                cas: has.then_some(c),
            }
        }
        4 => {
            let has = r.u8()? != 0;
            let c = r.u64()?;
            Op::Delete {
                cas: has.then_some(c),
            }
        }
        5 => {
            let incr = r.u8()? != 0;
            let delta = r.u64()?;
            let has = r.u8()? != 0;
            let v = r.u64()?;
            let t = Ttl::from_code(r.u32()?);
            Op::Arith {
                incr,
                delta,
                init: has.then_some((v, t)),
            }
        }
        _ => return None,
    })
}

fn put_outcome(out: &mut Vec<u8>, o: &Outcome, now: Time) {
    match o {
        Outcome::Value(i) => {
            out.push(0);
            put_item(out, i, now);
        }
        Outcome::NotFound => out.push(1),
        Outcome::Stored(v) => {
            out.push(2);
            out.extend_from_slice(&v.to_le_bytes());
        }
        Outcome::NotStored => out.push(3),
        Outcome::Exists => out.push(4),
        Outcome::Deleted => out.push(5),
        Outcome::Touched => out.push(6),
        Outcome::Number(n, v) => {
            out.push(7);
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
        Outcome::NonNumeric => out.push(8),
        Outcome::Error(e) => {
            out.push(9);
            put_bytes32(out, e.as_bytes());
        }
    }
}

fn outcome(r: &mut Reader<'_>, now: Time) -> Option<Outcome> {
    Some(match r.u8()? {
        0 => Outcome::Value(item(r, now)?),
        1 => Outcome::NotFound,
        2 => Outcome::Stored(r.u64()?),
        3 => Outcome::NotStored,
        4 => Outcome::Exists,
        5 => Outcome::Deleted,
        6 => Outcome::Touched,
        7 => Outcome::Number(r.u64()?, r.u64()?),
        8 => Outcome::NonNumeric,
        9 => Outcome::Error(String::from_utf8_lossy(r.bytes32()?).into_owned()),
        _ => return None,
    })
}

impl Msg {
    /// Encodes the message (lifetimes relative to `now`).
    pub fn encode(&self, now: Time) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Msg::Req {
                id,
                cache_fill,
                via_cache,
                key,
                op,
            } => {
                o.push(1);
                o.extend_from_slice(&id.to_le_bytes());
                o.push(u8::from(*cache_fill) | u8::from(*via_cache) << 1);
                put_key(&mut o, key);
                put_op(&mut o, op);
            }
            Msg::Resp { id, outcome } => {
                o.push(2);
                o.extend_from_slice(&id.to_le_bytes());
                put_outcome(&mut o, outcome, now);
            }
            Msg::Redirect { id } => {
                o.push(3);
                o.extend_from_slice(&id.to_le_bytes());
            }
            Msg::Repl {
                id,
                key,
                copy,
                earlier,
            } => {
                o.push(4);
                o.extend_from_slice(&id.to_le_bytes());
                put_key(&mut o, key);
                put_copy(&mut o, copy, now);
                put_earlier(&mut o, earlier);
            }
            Msg::Rack { id, applied } => {
                o.push(5);
                o.extend_from_slice(&id.to_le_bytes());
                o.push(u8::from(*applied));
            }
            Msg::Refused { id } => {
                o.push(13);
                o.extend_from_slice(&id.to_le_bytes());
            }
            Msg::Fetch { id, key } => {
                o.push(6);
                o.extend_from_slice(&id.to_le_bytes());
                put_key(&mut o, key);
            }
            Msg::Fetched {
                id,
                copy,
                floor,
                earlier,
            } => {
                o.push(7);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&floor.to_le_bytes());
                match copy {
                    None => o.push(0),
                    Some(c) => {
                        o.push(1);
                        put_copy(&mut o, c, now);
                    }
                }
                put_earlier(&mut o, earlier);
            }
            Msg::Invalidate { id, version, key } => {
                o.push(8);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&version.to_le_bytes());
                put_key(&mut o, key);
            }
            Msg::CatchUp { floor } => {
                o.push(9);
                o.extend_from_slice(&floor.to_le_bytes());
            }
            Msg::CatchUpDone { floor } => {
                o.push(10);
                o.extend_from_slice(&floor.to_le_bytes());
            }
            Msg::Flush { id, delay } => {
                o.push(11);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&delay.to_le_bytes());
            }
            Msg::Flushed { id } => {
                o.push(12);
                o.extend_from_slice(&id.to_le_bytes());
            }
        }
        o
    }

    /// Decodes a message (`None`: malformed).
    pub fn decode(b: &[u8], now: Time) -> Option<Msg> {
        let mut r = Reader { b };
        let m = match r.u8()? {
            1 => {
                let id = r.u64()?;
                let f = r.u8()?;
                Msg::Req {
                    id,
                    cache_fill: f & 1 != 0,
                    via_cache: f & 2 != 0,
                    key: r.key()?,
                    op: op(&mut r)?,
                }
            }
            2 => Msg::Resp {
                id: r.u64()?,
                outcome: outcome(&mut r, now)?,
            },
            3 => Msg::Redirect { id: r.u64()? },
            4 => Msg::Repl {
                id: r.u64()?,
                key: r.key()?,
                copy: copy(&mut r, now)?,
                earlier: earlier(&mut r)?,
            },
            5 => Msg::Rack {
                id: r.u64()?,
                applied: r.u8()? != 0,
            },
            6 => Msg::Fetch {
                id: r.u64()?,
                key: r.key()?,
            },
            7 => {
                let id = r.u64()?;
                let floor = r.u64()?;
                let c = match r.u8()? {
                    0 => None,
                    1 => Some(copy(&mut r, now)?),
                    _ => return None,
                };
                Msg::Fetched {
                    id,
                    copy: c,
                    floor,
                    earlier: earlier(&mut r)?,
                }
            }
            8 => Msg::Invalidate {
                id: r.u64()?,
                version: r.u64()?,
                key: r.key()?,
            },
            9 => Msg::CatchUp { floor: r.u64()? },
            10 => Msg::CatchUpDone { floor: r.u64()? },
            11 => Msg::Flush {
                id: r.u64()?,
                delay: r.u32()?,
            },
            12 => Msg::Flushed { id: r.u64()? },
            13 => Msg::Refused { id: r.u64()? },
            _ => return None,
        };
        r.b.is_empty().then_some(m)
    }
}

/// The fuzz body of this decoder (`fuzz/`'s `kv_wire`, and a short run in the tests): any
/// bytes decode without a panic, and a message that decodes encodes back to itself.
pub fn check_untrusted(data: &[u8]) {
    let now = FUZZ_NOW;
    if let Some(m) = Msg::decode(data, now) {
        assert_eq!(
            Msg::decode(&m.encode(now), now).as_ref(),
            Some(&m),
            "re-encoded message differs"
        );
    }
}

/// The time [`check_untrusted`] decodes at (expiry times are carried relative to it).
pub const FUZZ_NOW: Time = Time::from_nanos(1_000_000_000);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let now = FUZZ_NOW;
        for m in samples(now) {
            let b = m.encode(now);
            assert_eq!(Msg::decode(&b, now), Some(m.clone()));
            for cut in 0..b.len() {
                assert_eq!(Msg::decode(&b[..cut], now), None);
            }
        }
        let mut rng = torusnet_proto::rng::SplitMix64::new(5);
        for _ in 0..20_000 {
            let mut b = vec![0u8; rng.below(64) as usize];
            rng.fill(&mut b);
            let _ = Msg::decode(&b, now);
        }
    }

    #[test]
    fn a_short_fuzz_run() {
        let seeds: Vec<Vec<u8>> = samples(FUZZ_NOW)
            .iter()
            .map(|m| m.encode(FUZZ_NOW))
            .collect();
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "kv_wire", &seeds);
        torusnet_proto::fuzz::run(&seeds, 200_000, 21, check_untrusted);
    }

    /// One message of every kind.
    fn samples(now: Time) -> Vec<Msg> {
        let it = Item {
            value: b"v".to_vec(),
            flags: 3,
            expires: Some(now + Duration::from_secs(5)),
            version: 9,
            origin: 77,
        };
        vec![
            Msg::Req {
                id: 1,
                cache_fill: true,
                via_cache: false,
                key: b"k".to_vec(),
                op: Op::Store {
                    mode: Mode::Append,
                    value: b"x".to_vec(),
                    flags: 2,
                    ttl: Ttl::Secs(10),
                    cas: Some(4),
                },
            },
            Msg::Req {
                id: 2,
                cache_fill: false,
                via_cache: true,
                key: b"k".to_vec(),
                op: Op::Arith {
                    incr: false,
                    delta: 3,
                    init: Some((1, Ttl::Never)),
                },
            },
            Msg::Resp {
                id: 1,
                outcome: Outcome::Value(it.clone()),
            },
            Msg::Resp {
                id: 1,
                outcome: Outcome::Error("no".into()),
            },
            Msg::Repl {
                id: 5,
                key: b"k".to_vec(),
                copy: Copy::Item(it.clone()),
                earlier: vec![(9, 1), (11, 2)],
            },
            Msg::Repl {
                id: 5,
                key: b"k".to_vec(),
                copy: Copy::Deleted {
                    version: 8,
                    origin: 3,
                },
                earlier: Vec::new(),
            },
            Msg::Fetched {
                id: 6,
                copy: None,
                floor: 4,
                earlier: Vec::new(),
            },
            Msg::Fetched {
                id: 6,
                copy: Some(Copy::Item(it.clone())),
                floor: 0,
                earlier: vec![(5, 7)],
            },
            Msg::Invalidate {
                id: 2,
                version: 3,
                key: b"k".to_vec(),
            },
            Msg::Refused { id: 7 },
            Msg::CatchUp { floor: 5 },
            Msg::CatchUpDone { floor: 6 },
            Msg::Flush { id: 1, delay: 0 },
        ]
    }
}

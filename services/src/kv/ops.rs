//! What a key-value operation does to one key, as a pure function: the primary of a key runs
//! every operation through [`apply`] and replicates what it returns, so the semantics
//! (memcached's: add, replace, append, prepend, cas, incr/decr, touch) live here once.

use std::time::Duration;

use crate::kv::store::Item;
use torusnet_proto::time::Time;

/// How long an item lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// For ever.
    Never,
    /// This many seconds from when the operation runs.
    Secs(u32),
    /// Already expired (memcached's negative exptime).
    Expired,
}

impl Ttl {
    /// The expiry of an item written at `now`.
    pub fn at(self, now: Time) -> Option<Time> {
        match self {
            Ttl::Never => None,
            Ttl::Secs(s) => Some(now + Duration::from_secs(u64::from(s))),
            Ttl::Expired => Some(now),
        }
    }

    /// Encoded for the wire: 0 never, u32::MAX expired, else seconds + 1.
    pub fn code(self) -> u32 {
        match self {
            Ttl::Never => 0,
            Ttl::Expired => u32::MAX,
            Ttl::Secs(s) => s.saturating_add(1).min(u32::MAX - 1),
        }
    }

    /// Decoded from [`Ttl::code`].
    pub fn from_code(c: u32) -> Ttl {
        match c {
            0 => Ttl::Never,
            u32::MAX => Ttl::Expired,
            s => Ttl::Secs(s - 1),
        }
    }
}

/// How a store operation treats an existing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Store unconditionally.
    Set,
    /// Only if absent.
    Add,
    /// Only if present.
    Replace,
    /// Add the bytes after the present value.
    Append,
    /// Add the bytes before the present value.
    Prepend,
}

/// A key-value operation (the key travels beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read.
    Get,
    /// Read and set a new lifetime.
    GetAndTouch(Ttl),
    /// Set a new lifetime.
    Touch(Ttl),
    /// Write.
    Store {
        /// Which store it is (set, add, replace, append, prepend, compare-and-swap).
        mode: Mode,
        /// The bytes.
        value: Vec<u8>,
        /// The client's flags (opaque to the store).
        flags: u32,
        /// Lifetime (append and prepend keep the item's).
        ttl: Ttl,
        /// Compare-and-swap: only if the item's version is this.
        cas: Option<u64>,
    },
    /// Remove.
    Delete {
        /// Only if the item's version is this.
        cas: Option<u64>,
    },
    /// Add to (or subtract from) a decimal number; creates it with `init` when missing and
    /// `init` is given.
    Arith {
        /// Increment (else decrement, floored at zero).
        incr: bool,
        /// By how much.
        delta: u64,
        /// Create missing items with this value and lifetime.
        init: Option<(u64, Ttl)>,
    },
}

impl Op {
    /// Whether it changes the store (and so is replicated and ordered by the primary).
    pub fn writes(&self) -> bool {
        !matches!(self, Op::Get)
    }
}

/// The answer to an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The item (reads).
    Value(Item),
    /// No such item.
    NotFound,
    /// Written; its new version.
    Stored(u64),
    /// A condition did not hold (add on present, replace/append/prepend on absent).
    NotStored,
    /// The version did not match (cas).
    Exists,
    /// Removed.
    Deleted,
    /// Lifetime set.
    Touched,
    /// The number after incr/decr, and the item's new version.
    Number(u64, u64),
    /// incr/decr on a value that is not a number.
    NonNumeric,
    /// The store refused (out of memory, too large).
    Error(String),
}

/// What an operation does to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing.
    None,
    /// The item becomes this.
    Put(Item),
    /// The item goes (a tombstone at this version).
    Delete(u64),
}

/// Applies `op` to the present item `cur` (already filtered for expiry) at `now`; `version`
/// is what a write gets (greater than the present item's).
pub fn apply(cur: Option<&Item>, op: &Op, now: Time, version: u64) -> (Outcome, Change) {
    match op {
        Op::Get => match cur {
            Some(i) => (Outcome::Value(i.clone()), Change::None),
            None => (Outcome::NotFound, Change::None),
        },
        Op::GetAndTouch(ttl) | Op::Touch(ttl) => match cur {
            Some(i) => {
                let mut n = i.clone();
                n.expires = ttl.at(now);
                n.version = version;
                let out = if matches!(op, Op::Touch(_)) {
                    Outcome::Touched
                } else {
                    Outcome::Value(n.clone())
                };
                (out, Change::Put(n))
            }
            None => (Outcome::NotFound, Change::None),
        },
        Op::Store {
            mode,
            value,
            flags,
            ttl,
            cas,
        } => {
            if let Some(c) = cas {
                return match cur {
                    None => (Outcome::NotFound, Change::None),
                    Some(i) if i.version != *c => (Outcome::Exists, Change::None),
                    Some(_) => put(value.clone(), *flags, ttl.at(now), version),
                };
            }
            match (mode, cur) {
                (Mode::Add, Some(_)) => (Outcome::NotStored, Change::None),
                (Mode::Replace | Mode::Append | Mode::Prepend, None) => {
                    (Outcome::NotStored, Change::None)
                }
                (Mode::Append, Some(i)) => {
                    let mut v = i.value.clone();
                    v.extend_from_slice(value);
                    put(v, i.flags, i.expires, version)
                }
                (Mode::Prepend, Some(i)) => {
                    let mut v = value.clone();
                    v.extend_from_slice(&i.value);
                    put(v, i.flags, i.expires, version)
                }
                _ => put(value.clone(), *flags, ttl.at(now), version),
            }
        }
        Op::Delete { cas } => match cur {
            None => (Outcome::NotFound, Change::None),
            Some(i) if cas.is_some_and(|c| c != i.version) => (Outcome::Exists, Change::None),
            Some(_) => (Outcome::Deleted, Change::Delete(version)),
        },
        Op::Arith { incr, delta, init } => match cur {
            None => match init {
                Some((v, ttl)) => {
                    let item = Item {
                        value: v.to_string().into_bytes(),
                        flags: 0,
                        expires: ttl.at(now),
                        version,
                        origin: 0,
                    };
                    (Outcome::Number(*v, version), Change::Put(item))
                }
                None => (Outcome::NotFound, Change::None),
            },
            Some(i) => {
                let Some(n) = std::str::from_utf8(&i.value)
                    .ok()
                    .filter(|s| {
                        !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|s| s.parse::<u64>().ok())
                else {
                    return (Outcome::NonNumeric, Change::None);
                };
                let m = if *incr {
                    n.wrapping_add(*delta)
                } else {
                    n.saturating_sub(*delta)
                };
                let mut item = i.clone();
                item.value = m.to_string().into_bytes();
                item.version = version;
                (Outcome::Number(m, version), Change::Put(item))
            }
        },
    }
}

fn put(value: Vec<u8>, flags: u32, expires: Option<Time>, version: u64) -> (Outcome, Change) {
    (
        Outcome::Stored(version),
        Change::Put(Item {
            value,
            flags,
            expires,
            version,
            origin: 0,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(v: &[u8], version: u64) -> Item {
        Item {
            value: v.to_vec(),
            flags: 7,
            expires: None,
            version,
            origin: 0,
        }
    }

    fn store(mode: Mode, v: &[u8], cas: Option<u64>) -> Op {
        Op::Store {
            mode,
            value: v.to_vec(),
            flags: 1,
            ttl: Ttl::Never,
            cas,
        }
    }

    #[test]
    fn store_modes() {
        let t = Time::ZERO;
        let cur = item(b"abc", 5);
        assert_eq!(
            apply(Some(&cur), &store(Mode::Add, b"x", None), t, 6).0,
            Outcome::NotStored
        );
        assert_eq!(
            apply(None, &store(Mode::Replace, b"x", None), t, 6).0,
            Outcome::NotStored
        );
        let (o, c) = apply(Some(&cur), &store(Mode::Append, b"de", None), t, 6);
        assert_eq!(o, Outcome::Stored(6));
        assert_eq!(
            c,
            Change::Put(Item {
                value: b"abcde".to_vec(),
                flags: 7,
                expires: None,
                version: 6,
                origin: 0
            })
        );
        let (_, c) = apply(Some(&cur), &store(Mode::Prepend, b"z", None), t, 6);
        assert!(matches!(c, Change::Put(i) if i.value == b"zabc"));
        assert_eq!(
            apply(Some(&cur), &store(Mode::Set, b"x", Some(4)), t, 6).0,
            Outcome::Exists
        );
        assert_eq!(
            apply(None, &store(Mode::Set, b"x", Some(4)), t, 6).0,
            Outcome::NotFound
        );
        assert_eq!(
            apply(Some(&cur), &store(Mode::Set, b"x", Some(5)), t, 6).0,
            Outcome::Stored(6)
        );
    }

    #[test]
    fn arithmetic_and_delete() {
        let t = Time::ZERO;
        let arith = |incr, delta| Op::Arith {
            incr,
            delta,
            init: None,
        };
        assert_eq!(
            apply(Some(&item(b"10", 1)), &arith(true, 5), t, 2).0,
            Outcome::Number(15, 2)
        );
        assert_eq!(
            apply(Some(&item(b"3", 1)), &arith(false, 5), t, 2).0,
            Outcome::Number(0, 2)
        );
        assert_eq!(
            apply(
                Some(&item(b"18446744073709551615", 1)),
                &arith(true, 2),
                t,
                2
            )
            .0,
            Outcome::Number(1, 2),
            "incr wraps at 64 bits"
        );
        assert_eq!(
            apply(Some(&item(b"ab", 1)), &arith(true, 1), t, 2).0,
            Outcome::NonNumeric
        );
        assert_eq!(apply(None, &arith(true, 1), t, 2).0, Outcome::NotFound);
        let viv = Op::Arith {
            incr: true,
            delta: 1,
            init: Some((9, Ttl::Never)),
        };
        assert_eq!(apply(None, &viv, t, 2).0, Outcome::Number(9, 2));
        assert_eq!(
            apply(Some(&item(b"x", 3)), &Op::Delete { cas: Some(2) }, t, 4).0,
            Outcome::Exists
        );
        assert_eq!(
            apply(Some(&item(b"x", 3)), &Op::Delete { cas: None }, t, 4).1,
            Change::Delete(4)
        );
    }

    #[test]
    fn ttl_codes_round_trip() {
        for t in [Ttl::Never, Ttl::Expired, Ttl::Secs(0), Ttl::Secs(3600)] {
            assert_eq!(Ttl::from_code(t.code()), t);
        }
    }
}

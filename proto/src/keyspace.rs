//! The key -> server mapping of docs/keyspace.md: 160-bit keys, the routing key, the
//! home server, the facet/order table, the candidate sequence and `GetServersForKey`.
//!
//! Everything here is a pure function of the dimensions and the key, except the final
//! filtering by the caller's reachability view, so every node computes the same mapping.

use std::collections::{HashSet, VecDeque};
use std::fmt;

use sha1::{Digest, Sha1};

use crate::topology::{Axis, Coord, Dims, Dir};

/// Why a key given as text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A hex key must be exactly 40 hex digits (160 bits).
    #[error("a hex key must be 40 hex digits (160 bits), got {0} characters")]
    BadHexLength(usize),
    /// A hex key held a character that is not a hex digit.
    #[error("a hex key must be hex digits only, got {0:?}")]
    BadHexDigit(char),
}

/// A 160-bit key of the keyspace.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub [u8; 20]);

impl Key {
    /// The key of a string: the SHA-1 of its UTF-8 bytes.
    pub fn from_string(s: &str) -> Key {
        Key::from_bytes(s.as_bytes())
    }

    /// The key of arbitrary bytes: their SHA-1.
    pub fn from_bytes(b: &[u8]) -> Key {
        Key(Sha1::digest(b).into())
    }

    /// A key written as exactly 40 hex digits.
    pub fn from_hex(s: &str) -> Result<Key, KeyError> {
        let s = s.trim();
        if s.len() != 40 {
            return Err(KeyError::BadHexLength(s.chars().count()));
        }
        let mut out = [0u8; 20];
        let digits: Vec<u8> = s
            .chars()
            .map(|c| {
                c.to_digit(16)
                    .map(|d| d as u8)
                    .ok_or(KeyError::BadHexDigit(c))
            })
            .collect::<Result<_, _>>()?;
        for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            *o = pair[0] << 4 | pair[1];
        }
        Ok(Key(out))
    }

    /// The routing key: the last 8 bytes read big-endian.
    pub fn routing_key(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[12..20]);
        u64::from_be_bytes(b)
    }

    /// The key as 40 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.to_hex())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The axis permutations, indexed by order `o` (lexicographic: xyz xzy yxz yzx zxy zyx).
const ORDERS: [[Axis; 3]; 6] = [
    [Axis::X, Axis::Y, Axis::Z],
    [Axis::X, Axis::Z, Axis::Y],
    [Axis::Y, Axis::X, Axis::Z],
    [Axis::Y, Axis::Z, Axis::X],
    [Axis::Z, Axis::X, Axis::Y],
    [Axis::Z, Axis::Y, Axis::X],
];

/// Where a routing key lives: its home server and the facet and order that shape its
/// candidate sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPlacement {
    /// The routing key this placement was computed from.
    pub routing_key: u64,
    /// The home server.
    pub home: Coord,
    /// `w mod 48`, the index into the facet/order table.
    pub index: u8,
    /// The facet `index mod 8`: bit n clear means + along axis n.
    pub facet: u8,
    /// The order `index div 8`: which permutation of the axes.
    pub order: u8,
}

impl KeyPlacement {
    /// Places routing key `k` in a torus of dimensions `dims`.
    pub fn new(dims: Dims, k: u64) -> KeyPlacement {
        let scale = |bits: u64, n: u16| (((bits & 0xFFFF) * u64::from(n)) >> 16) as u16;
        let home = Coord::new(
            scale(k >> 48, dims.x()),
            scale(k >> 32, dims.y()),
            scale(k >> 16, dims.z()),
        );
        let index = ((k & 0xFFFF) % 48) as u8;
        KeyPlacement {
            routing_key: k,
            home,
            index,
            facet: index % 8,
            order: index / 8,
        }
    }

    /// The facet's direction along `axis`.
    pub fn facet_dir(&self, axis: Axis) -> Dir {
        Dir::new(axis, self.facet & (1 << axis as u8) == 0)
    }

    /// The axes in this placement's order, each with the facet's direction along it.
    pub fn steps(&self) -> [Dir; 3] {
        ORDERS[usize::from(self.order)].map(|a| self.facet_dir(a))
    }
}

/// The candidate sequence `C(k)`: every server of the torus exactly once, in the spec's
/// breadth-first order. Lazy, so finding a key's root costs little when early candidates
/// are reachable.
pub struct Candidates {
    dims: Dims,
    steps: [Dir; 3],
    queue: VecDeque<Coord>,
    seen: Seen,
}

/// The set of servers already appended to a candidate sequence.
enum Seen {
    /// One bit per server, for tori small enough to hold it.
    Bits(Vec<u64>),
    /// A hash set, for tori too large for a bitmap.
    Set(HashSet<Coord>),
}

/// Largest torus (in servers) whose candidate walk uses a bitmap.
const BITMAP_LIMIT: u64 = 1 << 24;

impl Candidates {
    /// The candidate sequence of `placement` in a torus of dimensions `dims`.
    pub fn new(dims: Dims, placement: &KeyPlacement) -> Candidates {
        let seen = if dims.count() <= BITMAP_LIMIT {
            Seen::Bits(vec![0; (dims.count() as usize).div_ceil(64)])
        } else {
            Seen::Set(HashSet::new())
        };
        let mut c = Candidates {
            dims,
            steps: placement.steps(),
            queue: VecDeque::new(),
            seen,
        };
        c.append(placement.home);
        c
    }

    fn append(&mut self, s: Coord) {
        let fresh = match &mut self.seen {
            Seen::Bits(bits) => {
                let i = self.dims.index(s);
                let (w, b) = (i / 64, 1u64 << (i % 64));
                let fresh = bits[w] & b == 0;
                bits[w] |= b;
                fresh
            }
            Seen::Set(set) => set.insert(s),
        };
        if fresh {
            self.queue.push_back(s);
        }
    }
}

impl Iterator for Candidates {
    type Item = Coord;
    fn next(&mut self) -> Option<Coord> {
        let s = self.queue.pop_front()?;
        for dir in self.steps {
            let n = self.dims.neighbor(s, dir);
            self.append(n);
        }
        Some(s)
    }
}

/// `GetServersForKey(k, r)`: the first `r` candidates of routing key `k` that are reachable
/// in the caller's view (all reachable ones if fewer). The first entry is the key's root.
pub fn get_servers_for_key(
    dims: Dims,
    routing_key: u64,
    r: usize,
    reachable: impl Fn(Coord) -> bool,
) -> Vec<Coord> {
    if r == 0 {
        return Vec::new();
    }
    let placement = KeyPlacement::new(dims, routing_key);
    Candidates::new(dims, &placement)
        .filter(|c| reachable(*c))
        .take(r)
        .collect()
}

/// The key's root in the caller's view: its home when reachable (the common case, with no
/// allocation), else the first reachable candidate; `None` when no server is reachable.
pub fn root(dims: Dims, routing_key: u64, reachable: impl Fn(Coord) -> bool) -> Option<Coord> {
    let placement = KeyPlacement::new(dims, routing_key);
    if reachable(placement.home) {
        return Some(placement.home);
    }
    Candidates::new(dims, &placement).find(|c| reachable(*c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a routing key whose home and index are the given values.
    fn rk_for(dims: Dims, home: Coord, index: u16) -> u64 {
        // Smallest 16-bit value that scales to each coordinate.
        let inv = |c: u16, n: u16| ((u32::from(c) << 16).div_ceil(u32::from(n))) as u64;
        let k =
            inv(home.x, dims.x()) << 48 | inv(home.y, dims.y()) << 32 | inv(home.z, dims.z()) << 16;
        k | u64::from(index)
    }

    #[test]
    fn paper_example_5x5() {
        let dims = Dims::new(5, 5, 1).unwrap();
        let k = rk_for(dims, Coord::new(2, 2, 0), 0);
        let p = KeyPlacement::new(dims, k);
        assert_eq!((p.home, p.facet, p.order), (Coord::new(2, 2, 0), 0, 0));
        let c: Vec<Coord> = Candidates::new(dims, &p).take(5).collect();
        let want = [(2, 2), (3, 2), (2, 3), (4, 2), (3, 3)].map(|(x, y)| Coord::new(x, y, 0));
        assert_eq!(c, want);
    }

    #[test]
    fn routing_key_is_last_eight_bytes_big_endian() {
        let k = Key::from_hex("00000000000000000000000001020304050607f8").unwrap();
        assert_eq!(k.routing_key(), 0x01020304050607f8);
        assert_eq!(k.to_hex(), "00000000000000000000000001020304050607f8");
        assert!(Key::from_hex("abc").is_err());
        assert!(Key::from_hex("zz000000000000000000000001020304050607f8").is_err());
        // SHA-1("abc") is the FIPS 180 test vector.
        assert_eq!(
            Key::from_string("abc").to_hex(),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn facets_and_orders() {
        let dims = Dims::new(4, 4, 4).unwrap();
        let p = KeyPlacement::new(dims, 5 + 8 * 3); // facet 5 = -x +y -z, order 3 = yzx
        assert_eq!((p.facet, p.order), (5, 3));
        assert_eq!(p.steps(), [Dir::PlusY, Dir::MinusZ, Dir::MinusX]);
    }

    #[test]
    fn candidates_cover_every_server_once() {
        for (x, y, z) in [(1, 1, 1), (2, 1, 1), (3, 3, 3), (2, 5, 3), (7, 1, 4)] {
            let dims = Dims::new(x, y, z).unwrap();
            for k in [0u64, 47, 0xdead_beef_1234_5678, u64::MAX] {
                let p = KeyPlacement::new(dims, k);
                let all: Vec<Coord> = Candidates::new(dims, &p).collect();
                let set: HashSet<Coord> = all.iter().copied().collect();
                assert_eq!(all.len() as u64, dims.count());
                assert_eq!(set.len(), all.len());
                assert_eq!(all[0], p.home);
            }
        }
    }

    #[test]
    fn root_skips_failed_servers() {
        let dims = Dims::new(5, 5, 1).unwrap();
        let k = rk_for(dims, Coord::new(2, 2, 0), 0);
        let down = [Coord::new(2, 2, 0), Coord::new(3, 2, 0)];
        let up = |c: Coord| !down.contains(&c);
        assert_eq!(root(dims, k, up), Some(Coord::new(2, 3, 0)));
        assert_eq!(
            get_servers_for_key(dims, k, 2, up),
            vec![Coord::new(2, 3, 0), Coord::new(4, 2, 0)]
        );
        assert_eq!(root(dims, k, |_| false), None);
        assert!(get_servers_for_key(dims, k, 0, up).is_empty());
    }
}

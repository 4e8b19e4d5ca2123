//! Torus dimensions, server coordinates and the six link directions (docs/keyspace.md,
//! "Torus and coordinates").

use std::fmt;
use std::str::FromStr;

/// Why a dimension, coordinate or direction given as text or numbers was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// Dimensions must be written `XxYxZ` (or `XxY` for a 2D torus).
    #[error("malformed dimensions {0:?}: expected XxYxZ (or XxY), each 1..=65535")]
    BadDims(String),
    /// A coordinate must be written `x,y,z` (or `x,y` in a 2D torus).
    #[error("malformed coordinate {0:?}: expected x,y,z")]
    BadCoord(String),
    /// The coordinate does not lie inside the torus.
    #[error("coordinate {coord} is outside dimensions {dims}")]
    OutOfRange {
        /// The refused coordinate.
        coord: Coord,
        /// The torus it was checked against.
        dims: Dims,
    },
    /// Directions are `+x`, `-x`, `+y`, `-y`, `+z`, `-z` (or their numbers 0..=5).
    #[error("malformed direction {0:?}: expected one of +x -x +y -y +z -z")]
    BadDir(String),
}

/// One of the three axes of the torus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Axis {
    /// The first axis.
    X = 0,
    /// The second axis.
    Y = 1,
    /// The third axis (of size 1 in a 2D torus).
    Z = 2,
}

impl Axis {
    /// All axes in their natural order.
    pub const ALL: [Axis; 3] = [Axis::X, Axis::Y, Axis::Z];

    /// The axis's lower-case name.
    pub fn name(self) -> char {
        match self {
            Axis::X => 'x',
            Axis::Y => 'y',
            Axis::Z => 'z',
        }
    }
}

/// The size of a torus along each axis, each 1..=65535. A 2D torus has `z == 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    x: u16,
    y: u16,
    z: u16,
}

impl Dims {
    /// Dimensions `x` by `y` by `z`; every one must be at least 1.
    pub fn new(x: u16, y: u16, z: u16) -> Result<Dims, TopologyError> {
        if x == 0 || y == 0 || z == 0 {
            return Err(TopologyError::BadDims(format!("{x}x{y}x{z}")));
        }
        Ok(Dims { x, y, z })
    }

    /// Size along the x axis.
    pub fn x(self) -> u16 {
        self.x
    }
    /// Size along the y axis.
    pub fn y(self) -> u16 {
        self.y
    }
    /// Size along the z axis.
    pub fn z(self) -> u16 {
        self.z
    }

    /// Size along `axis`.
    pub fn along(self, axis: Axis) -> u16 {
        match axis {
            Axis::X => self.x,
            Axis::Y => self.y,
            Axis::Z => self.z,
        }
    }

    /// Number of servers in the torus.
    pub fn count(self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }

    /// Whether `c` lies inside the torus.
    pub fn contains(self, c: Coord) -> bool {
        c.x < self.x && c.y < self.y && c.z < self.z
    }

    /// `c` if it lies inside the torus, else an error naming both.
    pub fn check(self, c: Coord) -> Result<Coord, TopologyError> {
        if self.contains(c) {
            Ok(c)
        } else {
            Err(TopologyError::OutOfRange {
                coord: c,
                dims: self,
            })
        }
    }

    /// Dense index of `c` (x fastest), for tables indexed by server. `c` must be inside.
    pub fn index(self, c: Coord) -> usize {
        debug_assert!(self.contains(c));
        (usize::from(c.z) * usize::from(self.y) + usize::from(c.y)) * usize::from(self.x)
            + usize::from(c.x)
    }

    /// The coordinate whose dense index is `i` (inverse of [`Dims::index`]).
    pub fn coord(self, i: usize) -> Coord {
        let x = usize::from(self.x);
        let y = usize::from(self.y);
        Coord {
            x: (i % x) as u16,
            y: ((i / x) % y) as u16,
            z: (i / (x * y)) as u16,
        }
    }

    /// The neighbour of `c` one step along `dir`, wrapping around.
    pub fn neighbor(self, c: Coord, dir: Dir) -> Coord {
        let step = |v: u16, n: u16, plus: bool| -> u16 {
            if plus {
                if v + 1 >= n {
                    0
                } else {
                    v + 1
                }
            } else if v == 0 {
                n - 1
            } else {
                v - 1
            }
        };
        let plus = dir.is_plus();
        match dir.axis() {
            Axis::X => Coord {
                x: step(c.x, self.x, plus),
                ..c
            },
            Axis::Y => Coord {
                y: step(c.y, self.y, plus),
                ..c
            },
            Axis::Z => Coord {
                z: step(c.z, self.z, plus),
                ..c
            },
        }
    }

    /// The dense index of the neighbour of server `i` (at `c`) along `dir`: the same as
    /// `index(neighbor(c, dir))` without the divisions, for loops that visit every server
    /// (a route table build walks all of them per view change).
    #[inline]
    pub fn neighbor_index(self, i: usize, c: Coord, dir: Dir) -> usize {
        let (v, n, stride) = match dir.axis() {
            Axis::X => (c.x, self.x, 1),
            Axis::Y => (c.y, self.y, usize::from(self.x)),
            Axis::Z => (c.z, self.z, usize::from(self.x) * usize::from(self.y)),
        };
        let (v, n) = (usize::from(v), usize::from(n));
        if dir.is_plus() {
            if v + 1 >= n {
                i - v * stride
            } else {
                i + stride
            }
        } else if v == 0 {
            i + (n - 1) * stride
        } else {
            i - stride
        }
    }

    /// Whether servers have links along `dir`: an axis of size 1 has none.
    pub fn has_links(self, dir: Dir) -> bool {
        self.along(dir.axis()) > 1
    }

    /// The directions along which servers of this torus have links.
    pub fn link_dirs(self) -> DirSet {
        Dir::ALL
            .iter()
            .filter(|d| self.has_links(**d))
            .fold(DirSet::EMPTY, |s, d| s.with(*d))
    }

    /// Every coordinate, in dense index order.
    pub fn coords(self) -> impl Iterator<Item = Coord> {
        (0..self.count() as usize).map(move |i| self.coord(i))
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.x, self.y, self.z)
    }
}

impl FromStr for Dims {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Dims, TopologyError> {
        let bad = || TopologyError::BadDims(s.to_string());
        let parts: Vec<&str> = s.trim().split(['x', 'X']).collect();
        if parts.len() != 2 && parts.len() != 3 {
            return Err(bad());
        }
        let mut v = [1u16; 3];
        for (slot, p) in v.iter_mut().zip(&parts) {
            *slot = parse_u16_digits(p).ok_or_else(bad)?;
        }
        Dims::new(v[0], v[1], v[2]).map_err(|_| bad())
    }
}

/// Parses decimal digits only (no sign, no spaces) into a u16.
fn parse_u16_digits(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A server's address: its position in the torus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Coord {
    /// Position along x.
    pub x: u16,
    /// Position along y.
    pub y: u16,
    /// Position along z (0 in a 2D torus).
    pub z: u16,
}

impl Coord {
    /// The coordinate (x, y, z).
    pub const fn new(x: u16, y: u16, z: u16) -> Coord {
        Coord { x, y, z }
    }

    /// The component along `axis`.
    pub fn along(self, axis: Axis) -> u16 {
        match axis {
            Axis::X => self.x,
            Axis::Y => self.y,
            Axis::Z => self.z,
        }
    }

    /// The components as an array, for JSON and tables.
    pub fn to_array(self) -> [u16; 3] {
        [self.x, self.y, self.z]
    }
}

impl fmt::Display for Coord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{}", self.x, self.y, self.z)
    }
}

impl FromStr for Coord {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Coord, TopologyError> {
        let bad = || TopologyError::BadCoord(s.to_string());
        let parts: Vec<&str> = s.trim().split(',').collect();
        if parts.len() != 2 && parts.len() != 3 {
            return Err(bad());
        }
        let mut v = [0u16; 3];
        for (slot, p) in v.iter_mut().zip(&parts) {
            *slot = parse_u16_digits(p.trim()).ok_or_else(bad)?;
        }
        Ok(Coord::new(v[0], v[1], v[2]))
    }
}

/// A link direction, numbered as the spec numbers them: 0:+x 1:-x 2:+y 3:-y 4:+z 5:-z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Dir {
    /// +x
    PlusX = 0,
    /// -x
    MinusX = 1,
    /// +y
    PlusY = 2,
    /// -y
    MinusY = 3,
    /// +z
    PlusZ = 4,
    /// -z
    MinusZ = 5,
}

impl Dir {
    /// All six directions in spec order.
    pub const ALL: [Dir; 6] = [
        Dir::PlusX,
        Dir::MinusX,
        Dir::PlusY,
        Dir::MinusY,
        Dir::PlusZ,
        Dir::MinusZ,
    ];

    /// The direction numbered `n` (0..=5).
    pub fn from_index(n: u8) -> Option<Dir> {
        Dir::ALL.get(usize::from(n)).copied()
    }

    /// The spec's number of this direction.
    pub fn index(self) -> u8 {
        self as u8
    }

    /// The direction along `axis` with the given sign.
    pub fn new(axis: Axis, plus: bool) -> Dir {
        Dir::ALL[axis as usize * 2 + usize::from(!plus)]
    }

    /// The axis this direction runs along.
    pub fn axis(self) -> Axis {
        Axis::ALL[usize::from(self.index() / 2)]
    }

    /// Whether this is the + direction of its axis.
    pub fn is_plus(self) -> bool {
        self.index().is_multiple_of(2)
    }

    /// The direction the same link has when seen from the other end.
    pub fn opposite(self) -> Dir {
        Dir::ALL[usize::from(self.index() ^ 1)]
    }

    /// The spec's name: `+x`, `-x`, ...
    pub fn name(self) -> &'static str {
        ["+x", "-x", "+y", "-y", "+z", "-z"][usize::from(self.index())]
    }
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dir {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Dir, TopologyError> {
        let t = s.trim();
        Dir::ALL
            .iter()
            .copied()
            .find(|d| d.name().eq_ignore_ascii_case(t) || t == d.index().to_string())
            .ok_or_else(|| TopologyError::BadDir(s.to_string()))
    }
}

/// A set of link directions, one bit per direction (bit n = direction n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DirSet(u8);

impl DirSet {
    /// No direction.
    pub const EMPTY: DirSet = DirSet(0);
    /// All six directions.
    pub const ALL: DirSet = DirSet(0x3f);

    /// The set whose bits are `bits` (bits above 5 are ignored).
    pub const fn from_bits(bits: u8) -> DirSet {
        DirSet(bits & 0x3f)
    }

    /// The set as bits (bit n = direction n).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether `d` is in the set.
    pub const fn contains(self, d: Dir) -> bool {
        self.0 & (1 << d as u8) != 0
    }

    /// The set with `d` added.
    #[must_use]
    pub const fn with(self, d: Dir) -> DirSet {
        DirSet(self.0 | (1 << d as u8))
    }

    /// The set with `d` removed.
    #[must_use]
    pub const fn without(self, d: Dir) -> DirSet {
        DirSet(self.0 & !(1 << d as u8))
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The directions in either set.
    #[must_use]
    pub const fn union(self, o: DirSet) -> DirSet {
        DirSet(self.0 | o.0)
    }

    /// The directions in `self` but not in `o`.
    #[must_use]
    pub const fn minus(self, o: DirSet) -> DirSet {
        DirSet(self.0 & !o.0)
    }

    /// Number of directions in the set.
    pub const fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// The directions in spec order 0..=5.
    pub fn iter(self) -> impl Iterator<Item = Dir> {
        Dir::ALL.into_iter().filter(move |d| self.contains(*d))
    }
}

impl FromIterator<Dir> for DirSet {
    fn from_iter<I: IntoIterator<Item = Dir>>(iter: I) -> DirSet {
        iter.into_iter().fold(DirSet::EMPTY, DirSet::with)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn neighbor_index_agrees_with_neighbor() {
        for (x, y, z) in [(1, 1, 1), (2, 1, 1), (3, 4, 5), (8, 8, 8), (1, 6, 2)] {
            let dims = Dims::new(x, y, z).unwrap();
            for (i, c) in dims.coords().enumerate() {
                for d in Dir::ALL {
                    assert_eq!(
                        dims.neighbor_index(i, c, d),
                        dims.index(dims.neighbor(c, d)),
                        "{dims} {c} {d:?}"
                    );
                }
            }
        }
    }

    use super::*;

    #[test]
    fn parses_and_prints_dims_and_coords() {
        let d: Dims = "3x4x5".parse().unwrap();
        assert_eq!((d.x(), d.y(), d.z()), (3, 4, 5));
        assert_eq!(d.to_string(), "3x4x5");
        assert_eq!("5x5".parse::<Dims>().unwrap(), Dims::new(5, 5, 1).unwrap());
        for bad in [
            "",
            "3x3x0",
            "3x3x3x3",
            "3",
            "ax3x3",
            "3x-1x3",
            "70000x1x1",
            "3x3x",
        ] {
            assert!(bad.parse::<Dims>().is_err(), "{bad}");
        }
        assert_eq!("1,2,3".parse::<Coord>().unwrap(), Coord::new(1, 2, 3));
        assert_eq!("1,2".parse::<Coord>().unwrap(), Coord::new(1, 2, 0));
        assert!("1,2,3,4".parse::<Coord>().is_err());
        assert!("1,,3".parse::<Coord>().is_err());
        assert!(d.check(Coord::new(3, 0, 0)).is_err());
    }

    #[test]
    fn neighbors_wrap_and_directions_pair_up() {
        let d = Dims::new(3, 2, 1).unwrap();
        let c = Coord::new(2, 0, 0);
        assert_eq!(d.neighbor(c, Dir::PlusX), Coord::new(0, 0, 0));
        assert_eq!(d.neighbor(c, Dir::MinusX), Coord::new(1, 0, 0));
        assert_eq!(d.neighbor(c, Dir::PlusY), Coord::new(2, 1, 0));
        assert_eq!(d.neighbor(c, Dir::MinusY), Coord::new(2, 1, 0));
        assert_eq!(d.neighbor(c, Dir::PlusZ), c);
        assert!(!d.has_links(Dir::PlusZ));
        for dir in Dir::ALL {
            assert_eq!(dir.opposite().opposite(), dir);
            assert_eq!(dir.name().parse::<Dir>().unwrap(), dir);
            assert_eq!(Dir::new(dir.axis(), dir.is_plus()), dir);
            for c in d.coords() {
                assert_eq!(d.neighbor(d.neighbor(c, dir), dir.opposite()), c);
            }
        }
        for i in 0..d.count() as usize {
            assert_eq!(d.index(d.coord(i)), i);
        }
    }
}

//! Source routes: a path the sending server writes into a frame, which every server on the
//! way follows without a routing decision of its own (BCube's BSR, docs/routing.md).
//!
//! On the wire the route is one byte per hop (a direction, 0..=5) between the torus header
//! and the payload; the header says how many hops it has and which is next
//! (docs/wire.md, "Source routes"). A forwarder reads the next hop, advances the index and
//! sends the frame on; the server at the route's end takes the route out by moving the
//! headers up over it, so everything past that point sees an ordinary frame.

use crate::routing::LinkView;
use crate::topology::{Coord, Dims, Dir};
use crate::wire::{flags, offset, FrameView, WireError, HEADERS_LEN, MAX_ROUTE_HOPS};

/// A path as the directions taken from its source, at most [`MAX_ROUTE_HOPS`] of them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    hops: [u8; MAX_ROUTE_HOPS],
    len: u8,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.dirs().map(Dir::name).collect();
        write!(f, "Route[{}]", names.join(" "))
    }
}

impl Route {
    /// The route taking `dirs` in turn; `None` when empty or longer than the wire allows.
    pub fn new(dirs: &[Dir]) -> Option<Route> {
        if dirs.is_empty() || dirs.len() > MAX_ROUTE_HOPS {
            return None;
        }
        let mut hops = [0u8; MAX_ROUTE_HOPS];
        for (h, d) in hops.iter_mut().zip(dirs) {
            *h = d.index();
        }
        Some(Route {
            hops,
            len: dirs.len() as u8,
        })
    }

    /// Hops.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Never true: a route has at least one hop.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first hop: the link the source sends on.
    pub fn first(&self) -> Dir {
        self.dir(0).unwrap_or(Dir::PlusX)
    }

    /// Hop `i`.
    pub fn dir(&self, i: usize) -> Option<Dir> {
        self.bytes().get(i).and_then(|b| Dir::from_index(*b))
    }

    /// The hops in order.
    pub fn dirs(&self) -> impl Iterator<Item = Dir> + '_ {
        self.bytes().iter().filter_map(|b| Dir::from_index(*b))
    }

    /// The hops as they go on the wire.
    pub fn bytes(&self) -> &[u8] {
        &self.hops[..self.len()]
    }

    /// The servers the route visits after `from`, in order (its end last).
    pub fn servers(&self, dims: Dims, from: Coord) -> impl Iterator<Item = Coord> + '_ {
        self.dirs().scan(from, move |at, d| {
            *at = dims.neighbor(*at, d);
            Some(*at)
        })
    }

    /// Where the route ends when it starts at `from`.
    pub fn end(&self, dims: Dims, from: Coord) -> Coord {
        self.servers(dims, from).last().unwrap_or(from)
    }

    /// Whether every link and server of the route from `from` is up in `view`.
    pub fn is_live(&self, view: &LinkView, from: Coord) -> bool {
        let mut at = from;
        for d in self.dirs() {
            if !view.live_dirs(at).contains(d) {
                return false;
            }
            at = view.dims().neighbor(at, d);
        }
        true
    }

    /// Whether hop `i` of the route is the link leaving the server it reaches after `i`
    /// hops along `dir`: how a path-failure report names the link that broke.
    pub fn takes(&self, i: usize, dir: Dir) -> bool {
        self.dir(i) == Some(dir)
    }
}

/// Writes `route` into the frame `buf[..len]` (built without one): the payload moves up
/// by the route's length, the header records it, its first hop counted as taken (the
/// source sends the frame on it). The new length, or `None` when `buf` cannot hold it or
/// the frame already has a route.
pub fn insert(buf: &mut [u8], len: usize, route: &Route) -> Option<usize> {
    let n = route.len();
    let new_len = len.checked_add(n)?;
    if len < HEADERS_LEN || new_len > buf.len() || buf[offset::ROUTE_LEN] != 0 {
        return None;
    }
    buf.copy_within(HEADERS_LEN..len, HEADERS_LEN + n);
    buf[HEADERS_LEN..HEADERS_LEN + n].copy_from_slice(route.bytes());
    buf[offset::ROUTE_LEN] = route.len;
    buf[offset::ROUTE_NEXT] = 1;
    let fl = u16::from_be_bytes([buf[offset::FLAGS], buf[offset::FLAGS + 1]]);
    buf[offset::FLAGS..offset::FLAGS + 2]
        .copy_from_slice(&(fl | flags::SOURCE_ROUTED).to_be_bytes());
    Some(new_len)
}

/// Where a source-routed frame goes from the server it has reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The route ends here.
    Arrived,
    /// Hop `index` of the route: send it on `dir` (the index is advanced in the frame).
    Next {
        /// The hop's position in the route.
        index: usize,
        /// The link to take.
        dir: Dir,
    },
}

/// The next step of the source-routed frame of `frame_len` bytes whose first bytes
/// (headers and route at least) are `frame`, advancing its route past the hop it names.
pub fn step(frame: &mut [u8], frame_len: usize) -> Result<Step, WireError> {
    let v = FrameView::check(frame, frame_len)?;
    let (len, next) = (v.route_len(), v.route_next());
    if next == len {
        return Ok(Step::Arrived);
    }
    let dir = v
        .route()
        .get(next)
        .and_then(|b| Dir::from_index(*b))
        .ok_or(WireError::Route("hop is not a direction (0..=5)"))?;
    frame[offset::ROUTE_NEXT] = (next + 1) as u8;
    Ok(Step::Next { index: next, dir })
}

/// Takes the route out of a frame that reached its end: the Ethernet and torus headers
/// move up over it (the payload stays where it is), and the frame now starts at the
/// returned offset of `frame`, as if it had been sent without a route.
pub fn strip(frame: &mut [u8]) -> usize {
    let n = usize::from(frame.get(offset::ROUTE_LEN).copied().unwrap_or(0));
    if n == 0 || frame.len() < HEADERS_LEN + n {
        return 0;
    }
    frame.copy_within(0..HEADERS_LEN, n);
    let h = &mut frame[n..];
    h[offset::ROUTE_LEN] = 0;
    h[offset::ROUTE_NEXT] = 0;
    let fl = u16::from_be_bytes([h[offset::FLAGS], h[offset::FLAGS + 1]]);
    h[offset::FLAGS..offset::FLAGS + 2]
        .copy_from_slice(&(fl & !flags::SOURCE_ROUTED).to_be_bytes());
    n
}

/// The fuzz body of source routes as forwarders read them (`fuzz/`'s `source_route`, and a
/// short run in the tests): a frame of any bytes is followed hop by hop until its route
/// ends or is refused, never more hops than a route holds; one that arrives has its route
/// taken out and is an ordinary frame with the same payload.
pub fn check_untrusted(data: &[u8]) {
    let mut f = data.to_vec();
    let len = f.len();
    let mut hops = 0;
    let mut first = None;
    loop {
        match step(&mut f, len) {
            Ok(Step::Arrived) => break,
            Ok(Step::Next { index, .. }) => {
                let first = *first.get_or_insert(index);
                assert_eq!(index, first + hops, "hops out of order");
                hops += 1;
                assert!(hops <= MAX_ROUTE_HOPS, "a route that never ends");
            }
            Err(_) => return,
        }
    }
    let Ok(payload) = FrameView::new_checked(&f).map(|v| v.payload().to_vec()) else {
        return;
    };
    let n = strip(&mut f);
    if n > 0 {
        let v = FrameView::new_checked(&f[n..]).expect("a stripped frame parses");
        assert_eq!(v.route_len(), 0);
        assert_eq!(v.payload(), &payload[..], "stripping changed the payload");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Dest, Header, Kind};

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut h = Header::new(
            Kind::Data,
            Coord::new(0, 0, 0),
            Dest::Server(Coord::new(2, 1, 0)),
        );
        h.payload_len = payload.len() as u16;
        let mut b = vec![0u8; HEADERS_LEN + payload.len() + MAX_ROUTE_HOPS];
        h.emit(&mut b).unwrap();
        b[HEADERS_LEN..HEADERS_LEN + payload.len()].copy_from_slice(payload);
        b
    }

    #[test]
    fn a_frame_follows_its_route_and_arrives_unchanged() {
        let route = Route::new(&[Dir::PlusX, Dir::PlusY, Dir::PlusX]).unwrap();
        let mut b = frame(b"hello");
        let plain = b[..HEADERS_LEN + 5].to_vec();
        let len = insert(&mut b, HEADERS_LEN + 5, &route).unwrap();
        b.truncate(len);
        let v = FrameView::new_checked(&b).unwrap();
        assert_eq!(v.payload(), b"hello");
        assert_eq!(v.route(), &[0, 2, 0]);
        // The source sends on the first hop; each server after it takes one.
        let mut taken = vec![route.first()];
        loop {
            match step(&mut b, len).unwrap() {
                Step::Arrived => break,
                Step::Next { index, dir } => {
                    assert_eq!(index, taken.len());
                    taken.push(dir);
                    assert!(crate::wire::forward_hop(&mut b));
                }
            }
        }
        assert_eq!(taken, vec![Dir::PlusX, Dir::PlusY, Dir::PlusX]);
        let at = strip(&mut b);
        let mut want = plain.clone();
        want[offset::TTL] -= 2;
        want[offset::HOPS] = 2;
        assert_eq!(&b[at..], &want[..]);
        assert_eq!(
            route.end(Dims::new(4, 4, 1).unwrap(), Coord::new(0, 0, 0)),
            Coord::new(2, 1, 0)
        );
    }

    #[test]
    fn malformed_routes_are_refused() {
        let route = Route::new(&[Dir::PlusX, Dir::PlusY]).unwrap();
        let mut b = frame(b"x");
        let len = insert(&mut b, HEADERS_LEN + 1, &route).unwrap();
        b.truncate(len);
        let cases: [(usize, u8); 4] = [
            (offset::ROUTE_LEN, 0),
            (offset::ROUTE_LEN, 33),
            (offset::ROUTE_NEXT, 3),
            (HEADERS_LEN + 1, 6),
        ];
        for (at, val) in cases {
            let mut bad = b.clone();
            bad[at] = val;
            assert!(FrameView::new_checked(&bad).is_err(), "byte {at} = {val}");
        }
        // Route fields without the flag, and a route longer than the frame.
        let mut bad = frame(b"x");
        bad[offset::ROUTE_LEN] = 1;
        assert!(FrameView::new_checked(&bad).is_err());
        let mut short = b.clone();
        short.truncate(HEADERS_LEN + 1);
        assert!(FrameView::new_checked(&short).is_err());
        assert!(Route::new(&[]).is_none());
        assert!(Route::new(&[Dir::PlusX; MAX_ROUTE_HOPS + 1]).is_none());
        // A second route is not inserted over the first.
        let mut again = b.clone();
        again.resize(len + 8, 0);
        assert!(insert(&mut again, len, &route).is_none());
    }
}

//! Transit in the XDP program: what a server's XDP program knows (its maps) to forward a
//! frame that only passes through without waking the poller, and the decision it makes,
//! written here once in Rust.
//!
//! One routing decision, two executors: the maps are written from the engine's own
//! [`RouteTable`] ([`TransitMaps::set_routes`]), and two tests hold the executors together.
//! The engine's (`proto/tests/xdp_transit.rs`) proves that whenever [`decide`] forwards a
//! frame, the engine would have forwarded it on a link of the same next-hop set, with the
//! same bytes; the dataplane's (`dataplane/tests/xdp_program.rs`, as root) runs the C
//! program (`ebpf/torus_xdp.c`) through the kernel's test runner on the frames and maps it
//! gives this function, and requires the same verdict, link and bytes.
//!
//! Whatever needs judgement goes up to the poller: frames for this server, key-routed
//! frames, intercepted and probe frames, frames whose next link is down or not usable
//! from XDP, and anything the engine would refuse (it refuses and counts it there).

use super::{LinkView, RouteTable};
use crate::rng::SplitMix64;
use crate::topology::{Coord, Dims, Dir, DirSet};
use crate::wire::{flags, offset, ETHERTYPE_DATA, HEADERS_LEN, MAX_ROUTE_HOPS, VERSION};
use crate::wire::{Dest, Header, Kind};

/// Why a data frame goes up to the poller instead of on (the C program's `UP_*`, same
/// numbers: they index its counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Up {
    /// Transit in XDP is switched off.
    Off = 0,
    /// For this server, or at the end of its source route.
    Local = 1,
    /// Key-routed: the key's root is the engine's to find.
    Key = 2,
    /// Services on the path asked to see it.
    Intercept = 3,
    /// A path probe: it collects the figures of the links it crosses.
    Probe = 4,
    /// No next hop towards its destination in the view.
    NoRoute = 5,
    /// Every next link is down, faulty or not usable from XDP (a source route's next link
    /// down: the engine reports the path failure to the source).
    LinkDown = 6,
    /// It fails a check the engine makes (the engine refuses and counts it).
    Check = 7,
    /// Its headers do not lie in the part of the frame the program can read.
    Headers = 8,
}

impl Up {
    /// Every reason, by number.
    pub const ALL: [Up; 9] = [
        Up::Off,
        Up::Local,
        Up::Key,
        Up::Intercept,
        Up::Probe,
        Up::NoRoute,
        Up::LinkDown,
        Up::Check,
        Up::Headers,
    ];

    /// The name counters and status show.
    pub fn name(self) -> &'static str {
        match self {
            Up::Off => "off",
            Up::Local => "local",
            Up::Key => "key",
            Up::Intercept => "intercept",
            Up::Probe => "probe",
            Up::NoRoute => "no_route",
            Up::LinkDown => "link_down",
            Up::Check => "check",
            Up::Headers => "headers",
        }
    }
}

/// What the program does with a data frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Leaves on this link, rewritten.
    Forward(Dir),
    /// Goes up to the poller, for this reason.
    Up(Up),
}

/// The MAC addresses of one link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkMacs {
    /// Ours.
    pub local: [u8; 6],
    /// The neighbour's, when known.
    pub neighbor: Option<[u8; 6]>,
}

/// Everything the XDP program reads to forward a frame: its maps, as one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitMaps {
    /// The torus.
    pub dims: Dims,
    /// This server.
    pub local: Coord,
    /// Forwarding in XDP on at all.
    pub on: bool,
    /// Next-hop links by destination's dense index ([`Dims::index`]), one bit per
    /// direction: the engine's [`RouteTable::next_hops`].
    pub routes: Vec<u8>,
    /// Links a frame may leave by: live in the view, carrier up, neighbour known, no fault
    /// injected on the way out.
    pub usable: DirSet,
    /// Links found loaded: skipped while another next hop is free.
    pub congested: DirSet,
    /// The links' MAC addresses, by direction.
    pub macs: [LinkMacs; 6],
    /// The links' transmit load, by direction, in hundredths of their capacity: raised
    /// into the telemetry of frames leaving by them ([`crate::wire::raise_cong`]).
    pub levels: [u8; 6],
}

impl TransitMaps {
    /// Maps of server `local` with no route and no usable link (transit on).
    pub fn new(dims: Dims, local: Coord) -> TransitMaps {
        TransitMaps {
            dims,
            local,
            on: true,
            routes: vec![0; dims.count() as usize],
            usable: DirSet::EMPTY,
            congested: DirSet::EMPTY,
            macs: [LinkMacs::default(); 6],
            levels: [0; 6],
        }
    }

    /// Writes the next hops of `table` (this server's, under the view the engine adopted)
    /// and returns the destinations whose entry changed, for a writer that updates only
    /// those.
    pub fn set_routes(&mut self, table: &RouteTable) -> Vec<u32> {
        let mut changed = Vec::new();
        for (i, slot) in self.routes.iter_mut().enumerate() {
            let hops = table.next_hops(self.dims.coord(i)).bits();
            if *slot != hops {
                *slot = hops;
                changed.push(i as u32);
            }
        }
        changed
    }
}

/// A link's transmit load (permille of its capacity) at which it counts as loaded for
/// frames passing through, and the load below which it counts as free again: apart, so a
/// link near the mark does not flap between the two at every sample.
pub const LOADED_PERMILLE: (u64, u64) = (850, 650);

/// Whether a link with `load` counts as loaded, having counted as `was`.
pub fn congested(load: &super::load::LinkLoad, was: bool) -> bool {
    let p = load.tx_permille();
    if was {
        p > LOADED_PERMILLE.1
    } else {
        p >= LOADED_PERMILLE.0
    }
}

/// A 32-bit finaliser (murmur3's): the C program's `mix`.
#[inline]
pub fn mix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Which of several equal next hops a frame takes is fixed by its flow: source and
/// destination (dense indices) and connection id. One connection's frames keep one path
/// through a forwarder, so they arrive in the order they left (the receiver asks for a gap
/// at once); the source's striping over its own links still spreads a connection.
#[inline]
pub fn flow_hash(src: u32, dst: u32, conn: u32) -> u32 {
    mix(src.wrapping_mul(0x9e37_79b1) ^ mix(dst ^ mix(conn)))
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn coord_at(b: &[u8], at: usize) -> Coord {
    Coord::new(be16(b, at), be16(b, at + 2), be16(b, at + 4))
}

/// The C program's decision for the data frame of `frame_len` bytes whose first bytes,
/// those the program can read, are `head` (at least the headers), arrived on link `input`.
/// A frame forwarded is rewritten in `head` as it leaves: TTL, hop count and route index as
/// the engine writes them, Ethernet addresses as the poller writes them.
pub fn decide(maps: &TransitMaps, input: Dir, head: &mut [u8], frame_len: usize) -> Verdict {
    match judge(maps, input, head, frame_len) {
        Ok((dir, routed)) => {
            if routed {
                head[offset::ROUTE_NEXT] += 1;
            }
            rewrite(maps, dir, head);
            Verdict::Forward(dir)
        }
        Err(why) => Verdict::Up(why),
    }
}

fn rewrite(maps: &TransitMaps, dir: Dir, head: &mut [u8]) {
    head[offset::TTL] -= 1;
    head[offset::HOPS] = head[offset::HOPS].saturating_add(1);
    crate::wire::raise_cong(head, maps.levels[usize::from(dir.index())]);
    let m = maps.macs[usize::from(dir.index())];
    head[0..6].copy_from_slice(&m.neighbor.unwrap_or([0; 6]));
    head[6..12].copy_from_slice(&m.local);
}

/// The link a frame leaves by (and whether it follows a source route), or why it goes up.
fn judge(maps: &TransitMaps, input: Dir, head: &[u8], frame_len: usize) -> Result<(Dir, bool), Up> {
    if !maps.on {
        return Err(Up::Off);
    }
    if head.len() < HEADERS_LEN {
        return Err(Up::Headers);
    }
    // (The program sends other EtherTypes to the kernel before it decides anything.)
    if be16(head, offset::ETHERTYPE) != ETHERTYPE_DATA {
        return Err(Up::Check);
    }
    if let Some(m) = maps.macs[usize::from(input.index())].neighbor {
        if head[6..12] != m {
            return Err(Up::Check);
        }
    }
    let kind = head[offset::KIND];
    let fl = be16(head, offset::FLAGS);
    if head[offset::VERSION] != VERSION || kind > 5 || fl & !flags::KNOWN != 0 {
        return Err(Up::Check);
    }
    let routed = fl & flags::SOURCE_ROUTED != 0;
    let (len, next) = (
        usize::from(head[offset::ROUTE_LEN]),
        usize::from(head[offset::ROUTE_NEXT]),
    );
    check_route(head, routed, len, next)?;
    if usize::from(be16(head, offset::PAYLOAD_LEN)) + HEADERS_LEN + len > frame_len {
        return Err(Up::Check);
    }
    match kind {
        5 => return Err(Up::Probe),
        3 => return Err(Up::Check),
        _ => {}
    }
    if fl & flags::KEY_ROUTED != 0 {
        return Err(Up::Key);
    }
    let (src, dst) = (coord_at(head, offset::SRC), coord_at(head, offset::DST));
    if !maps.dims.contains(src) || be16(head, offset::DST + 6) != 0 || !maps.dims.contains(dst) {
        return Err(Up::Check);
    }
    if src == maps.local {
        return Err(Up::Check);
    }
    if routed {
        if next == len {
            return Err(Up::Local);
        }
        let dir = Dir::from_index(head[HEADERS_LEN + next]).ok_or(Up::LinkDown)?;
        if !maps.usable.contains(dir) {
            return Err(Up::LinkDown);
        }
        if head[offset::TTL] == 0 {
            return Err(Up::Check);
        }
        return Ok((dir, true));
    }
    if dst == maps.local {
        return Err(Up::Local);
    }
    if fl & flags::INTERCEPT != 0 {
        return Err(Up::Intercept);
    }
    let (si, di) = (maps.dims.index(src) as u32, maps.dims.index(dst) as u32);
    let hops = maps.routes.get(di as usize).copied().unwrap_or(0);
    if hops == 0 {
        return Err(Up::NoRoute);
    }
    let mut cand = hops & maps.usable.bits();
    if cand == 0 {
        return Err(Up::LinkDown);
    }
    let free = cand & !maps.congested.bits();
    if free != 0 {
        cand = free;
    }
    if head[offset::TTL] == 0 {
        return Err(Up::Check);
    }
    let conn = u32::from_be_bytes([
        head[offset::CONN],
        head[offset::CONN + 1],
        head[offset::CONN + 2],
        head[offset::CONN + 3],
    ]);
    let k = flow_hash(si, di, conn) % cand.count_ones();
    let dir = DirSet::from_bits(cand)
        .iter()
        .nth(k as usize)
        .ok_or(Up::LinkDown)?;
    Ok((dir, false))
}

/// The route fields as the engine checks them, on the bytes the program can read.
fn check_route(head: &[u8], routed: bool, len: usize, next: usize) -> Result<(), Up> {
    if !routed {
        return match (len, next) {
            (0, 0) => Ok(()),
            _ => Err(Up::Check),
        };
    }
    if len == 0 || len > MAX_ROUTE_HOPS || next > len {
        return Err(Up::Check);
    }
    let route = head
        .get(HEADERS_LEN..HEADERS_LEN + len)
        .ok_or(Up::Headers)?;
    if route.iter().any(|d| *d >= 6) {
        return Err(Up::Check);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_spreads_flows_over_equal_hops() {
        let mut seen = [0u32; 3];
        for conn in 0..3000u32 {
            seen[(flow_hash(4, 17, conn) % 3) as usize] += 1;
        }
        assert!(seen.iter().all(|n| (800..1200).contains(n)), "{seen:?}");
        // Fixed values: the C program must compute the same (its test runs both).
        assert_eq!(mix(0), 0);
        assert_ne!(flow_hash(1, 2, 3), flow_hash(2, 1, 3));
    }

    #[test]
    fn reasons_are_numbered_as_the_program_counts_them() {
        for (i, u) in Up::ALL.iter().enumerate() {
            assert_eq!(*u as usize, i);
        }
    }
}

/// Random servers and frames for the tests that hold the two executors together (the
/// engine's and the C program's): a server's maps under a view with failed links and
/// servers, some links unusable or congested, and frames of every kind towards every
/// server, most of them valid, some hostile.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The view the engine runs under.
    pub view: LinkView,
    /// The maps written from it.
    pub maps: TransitMaps,
}

/// Our MAC on link `dir` of server `i` in the samples.
pub fn sample_mac(i: usize, dir: Dir) -> [u8; 6] {
    [
        0x02,
        (i >> 16) as u8,
        (i >> 8) as u8,
        i as u8,
        0x10,
        dir.index(),
    ]
}

impl Sample {
    /// A server of `dims` that is up, under a view where about `fail` of the links and
    /// servers are down.
    pub fn new(rng: &mut SplitMix64, dims: Dims, fail: f64) -> Sample {
        let mut view = LinkView::all_up(dims).expect("a torus small enough");
        for c in dims.coords() {
            if rng.chance(fail / 3.0) {
                let _ = view.set_server(c, false);
            }
            for d in dims.link_dirs().iter() {
                if rng.chance(fail) {
                    let _ = view.set_link(c, d, false);
                }
            }
        }
        let up: Vec<Coord> = dims.coords().filter(|c| view.is_up(*c)).collect();
        let local = up[rng.below(up.len() as u64) as usize];
        let table = RouteTable::new(&view, local).expect("local is in the torus");
        let mut maps = TransitMaps::new(dims, local);
        maps.set_routes(&table);
        let li = dims.index(local);
        for d in Dir::ALL {
            let n = dims.index(dims.neighbor(local, d));
            maps.macs[usize::from(d.index())] = LinkMacs {
                local: sample_mac(li, d),
                neighbor: (!rng.chance(0.05)).then(|| sample_mac(n, d.opposite())),
            };
        }
        // Usable: live, neighbour known, and now and then a link lost its carrier or has a
        // fault injected; congested at random.
        maps.usable = view
            .live_dirs(local)
            .iter()
            .filter(|d| maps.macs[usize::from(d.index())].neighbor.is_some() && !rng.chance(0.1))
            .collect();
        maps.congested = DirSet::from_bits(rng.below(64) as u8 & rng.below(64) as u8);
        for l in maps.levels.iter_mut() {
            *l = rng.below(256) as u8;
        }
        maps.on = !rng.chance(0.06);
        Sample { view, maps }
    }

    /// A frame arriving on a random link: mostly one passing through (data, ACK, NACK,
    /// SYNC; by next hops or a source route), else for this server, key-routed,
    /// intercepted, a probe or control frame, or hostile.
    pub fn frame(&self, rng: &mut SplitMix64) -> (Dir, Vec<u8>) {
        let dims = self.maps.dims;
        let input = Dir::ALL[rng.below(6) as usize];
        let kinds = [
            Kind::Data,
            Kind::Ack,
            Kind::Nack,
            Kind::Sync,
            Kind::Data,
            Kind::Probe,
            Kind::Control,
        ];
        let of = if rng.chance(0.9) { 5 } else { 7 };
        let kind = kinds[rng.below(of) as usize];
        let any = |rng: &mut SplitMix64| dims.coord(rng.below(dims.count()) as usize);
        let src = if rng.chance(0.02) {
            self.maps.local
        } else {
            any(rng)
        };
        let to = if rng.chance(0.1) {
            self.maps.local
        } else {
            any(rng)
        };
        let key = rng.chance(0.08);
        let dst = if key {
            Dest::Key(rng.next_u64())
        } else {
            Dest::Server(to)
        };
        let mut h = Header::new(kind, src, dst);
        h.flags = if key { flags::KEY_ROUTED } else { 0 };
        if rng.chance(0.5) {
            h.flags |= flags::RELIABLE | flags::ACK_VALID;
        }
        if rng.chance(0.05) {
            h.flags |= flags::INTERCEPT;
        }
        h.ttl = if rng.chance(0.05) {
            0
        } else {
            1 + rng.below(64) as u8
        };
        h.hops = if rng.chance(0.05) {
            255
        } else {
            rng.below(10) as u8
        };
        h.conn = rng.next_u64() as u32;
        h.seq = rng.next_u64() as u32;
        h.cong = rng.below(256) as u8;
        let len = rng.below(1400) as usize;
        h.payload_len = len as u16;
        let mut buf = vec![0u8; HEADERS_LEN + len];
        let _ = h.emit(&mut buf);
        let n = dims.index(dims.neighbor(self.maps.local, input));
        let _ = crate::wire::emit_eth(&mut buf, [0; 6], sample_mac(n, input.opposite()));
        rng.fill(&mut buf[HEADERS_LEN..]);
        if !key && rng.chance(0.25) {
            let hops = 1 + rng.below(6) as usize;
            let dirs: Vec<Dir> = (0..hops).map(|_| Dir::ALL[rng.below(6) as usize]).collect();
            if let Some(route) = super::source::Route::new(&dirs) {
                buf.resize(buf.len() + hops, 0);
                let len = buf.len() - hops;
                if let Some(len) = super::source::insert(&mut buf, len, &route) {
                    buf.truncate(len);
                    buf[offset::ROUTE_NEXT] = rng.below(hops as u64 + 1) as u8;
                    if rng.chance(0.05) {
                        buf[HEADERS_LEN + rng.below(hops as u64) as usize] =
                            6 + rng.below(250) as u8;
                    }
                }
            }
        }
        if rng.chance(0.1) {
            let i = rng.below(HEADERS_LEN as u64) as usize;
            buf[i] ^= 1 << rng.below(8);
        }
        if rng.chance(0.03) {
            let keep = HEADERS_LEN + rng.below((buf.len() - HEADERS_LEN) as u64 + 1) as usize;
            buf.truncate(keep);
        }
        (input, buf)
    }
}

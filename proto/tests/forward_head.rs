//! A forwarder that holds only a frame's headers (the simulator keeps payloads of frames
//! in flight out of memory) decides exactly as one holding the whole frame: for every
//! frame, hostile ones included, `Node::handle_rx_head` either gives `handle_rx`'s action
//! and header bytes, or asks for the whole frame, which it then needed.

use torusnet_proto::node::{Interceptor, Node, RxAction, Verdict};
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::routing::source::{self, Route};
use torusnet_proto::routing::LinkView;
use torusnet_proto::time::Time;
use torusnet_proto::topology::{Coord, Dims, Dir};
use torusnet_proto::transport::Config;
use torusnet_proto::wire::{self, offset, Dest, Header, Kind, HEADERS_LEN};

struct Drops;
impl Interceptor for Drops {
    fn on_path(&mut self, _: &Header, payload: &mut [u8]) -> Verdict {
        if payload.first() == Some(&0) {
            Verdict::Consume
        } else {
            Verdict::Forward
        }
    }
}

fn node(view: &LinkView) -> Node {
    let mut n = Node::new(Coord::new(1, 2, 1), view.clone(), Config::default()).unwrap();
    n.intercept(7, Box::new(Drops));
    n
}

fn frame(rng: &mut SplitMix64, dims: Dims) -> Vec<u8> {
    let kind = [
        Kind::Data,
        Kind::Ack,
        Kind::Nack,
        Kind::Control,
        Kind::Probe,
    ][rng.below(5) as usize];
    let mut c = || {
        Coord::new(
            rng.below(u64::from(dims.x()) + 1) as u16,
            rng.below(u64::from(dims.y()) + 1) as u16,
            rng.below(u64::from(dims.z()) + 1) as u16,
        )
    };
    let (src, to) = (c(), c());
    let dst = if rng.chance(0.3) {
        Dest::Key(rng.next_u64())
    } else {
        Dest::Server(to)
    };
    let mut h = Header::new(kind, src, dst);
    h.flags = (rng.next_u64() as u16) & wire::flags::KNOWN & !wire::flags::KEY_ROUTED;
    if matches!(dst, Dest::Key(_)) {
        h.flags |= wire::flags::KEY_ROUTED;
    }
    h.ttl = rng.below(4) as u8;
    h.service = [7, 9][rng.below(2) as usize];
    let len = rng.below(3000) as usize;
    h.payload_len = len as u16;
    let mut buf = vec![0u8; HEADERS_LEN + len];
    h.emit(&mut buf).unwrap();
    wire::emit_eth(&mut buf, [2; 6], [4; 6]).unwrap();
    let fill = rng.below(2) as u8;
    buf[HEADERS_LEN..].fill(fill);
    // Source-routed variants: a route of up to five hops, its next hop anywhere along it,
    // now and then a hop that is no direction.
    if rng.chance(0.3) && matches!(dst, Dest::Server(_)) {
        let n = 1 + rng.below(5) as usize;
        let dirs: Vec<Dir> = (0..n).map(|_| Dir::ALL[rng.below(6) as usize]).collect();
        let route = Route::new(&dirs).unwrap();
        buf.resize(buf.len() + n, 0);
        let len = buf.len() - n;
        let len = source::insert(&mut buf, len, &route).unwrap();
        buf.truncate(len);
        buf[offset::ROUTE_NEXT] = rng.below(n as u64 + 1) as u8;
        if rng.chance(0.1) {
            buf[HEADERS_LEN + rng.below(n as u64) as usize] = 6 + rng.below(200) as u8;
        }
    }
    // Hostile variants: a header byte flipped, a claimed length beyond the frame.
    if rng.chance(0.2) {
        let i = rng.below(HEADERS_LEN as u64) as usize;
        buf[i] ^= 1 << rng.below(8);
    }
    if rng.chance(0.05) {
        buf.truncate(HEADERS_LEN + len / 2);
    }
    buf
}

#[test]
fn a_forwarder_of_headers_decides_as_one_of_whole_frames() {
    let dims = Dims::new(4, 3, 2).unwrap();
    let mut view = LinkView::all_up(dims).unwrap();
    view.set_server(Coord::new(2, 2, 1), false).unwrap();
    let mut rng = SplitMix64::new(11);
    let (mut decided, mut asked) = (0, 0);
    for _ in 0..30_000 {
        let f = frame(&mut rng, dims);
        let cut = HEADERS_LEN + rng.below((f.len() - HEADERS_LEN.min(f.len())) as u64 + 1) as usize;
        let (mut a, mut b) = (node(&view), node(&view));
        let mut whole = f.clone();
        let want = b.handle_rx(Time::ZERO, Dir::PlusX, &mut whole);
        let mut head = f[..cut.min(f.len())].to_vec();
        match a.handle_rx_head(&mut head, f.len()) {
            Some(got) => {
                decided += 1;
                assert_eq!(got, want, "{f:?}");
                assert_eq!(head[..], whole[..head.len()]);
                assert_eq!(a.stats(), b.stats());
                assert_eq!(a.source_stats(), b.source_stats());
                assert!(!matches!(got, RxAction::Consumed));
            }
            None => {
                asked += 1;
                let mut again = f.clone();
                assert_eq!(a.handle_rx(Time::ZERO, Dir::PlusX, &mut again), want);
            }
        }
    }
    assert!(decided > 5_000 && asked > 1_000, "{decided} {asked}");
}

//! A short seeded run of the fuzz targets' bodies (fuzz/), so every test run exercises the
//! parser and the aggregation decoder on hundreds of thousands of hostile inputs: random
//! bytes, and valid frames with random bytes flipped, cut or appended.

use proptest::prelude::*;
use torusnet_proto::rng::SplitMix64;
use torusnet_proto::topology::Coord;
use torusnet_proto::wire::{
    self, check_untrusted, check_untrusted_messages, Dest, FrameView, Header, Kind, MessageWriter,
    HEADERS_LEN,
};

/// A valid frame with random header fields and a random (possibly aggregated) payload.
fn valid_frame(rng: &mut SplitMix64) -> Vec<u8> {
    let kind = [Kind::Data, Kind::Ack, Kind::Nack, Kind::Control][rng.below(4) as usize];
    let src = Coord::new(
        rng.next_u64() as u16,
        rng.next_u64() as u16,
        rng.next_u64() as u16,
    );
    let dst = if rng.chance(0.5) {
        Dest::Key(rng.next_u64())
    } else {
        Dest::Server(Coord::new(rng.next_u64() as u16, 3, 4))
    };
    let mut h = Header::new(kind, src, dst);
    h.flags = (rng.next_u64() as u16) & wire::flags::KNOWN;
    h.seq = rng.next_u64() as u32;
    h.ack = rng.next_u64() as u32;
    h.sack = rng.next_u64();
    let mut payload = vec![0u8; rng.below(300) as usize];
    if rng.chance(0.5) {
        let mut w = MessageWriter::new(&mut payload);
        loop {
            let mut m = vec![0u8; rng.below(40) as usize];
            rng.fill(&mut m);
            if !w.push(rng.next_u64() as u16, rng.below(4) as u8, &m) {
                break;
            }
        }
        let n = w.len();
        payload.truncate(n);
        h.flags |= wire::flags::AGGREGATED;
    } else {
        rng.fill(&mut payload);
    }
    h.payload_len = payload.len() as u16;
    let mut buf = vec![0u8; HEADERS_LEN];
    h.emit(&mut buf).unwrap();
    buf.extend_from_slice(&payload);
    buf
}

#[test]
fn seeded_fuzz_run() {
    let mut rng = SplitMix64::new(20261121);
    let mut parsed = 0;
    for i in 0..300_000u32 {
        let mut buf = valid_frame(&mut rng);
        assert!(FrameView::new_checked(&buf).is_ok());
        match i % 4 {
            0 => {
                let flips = 1 + rng.below(4);
                for _ in 0..flips {
                    let at = rng.below(buf.len() as u64) as usize;
                    buf[at] ^= 1 << rng.below(8);
                }
            }
            1 => buf.truncate(rng.below(buf.len() as u64 + 1) as usize),
            2 => {
                let mut extra = vec![0u8; rng.below(16) as usize];
                rng.fill(&mut extra);
                buf.extend_from_slice(&extra);
            }
            _ => {
                buf = vec![0u8; rng.below(200) as usize];
                rng.fill(&mut buf);
            }
        }
        if FrameView::new_checked(&buf).is_ok() {
            parsed += 1;
        }
        check_untrusted(&buf);
        let from = rng.below(buf.len() as u64 + 1) as usize;
        check_untrusted_messages(&buf[from..]);
    }
    // The mutations must leave a good share parseable, or the deep paths go untested.
    assert!(parsed > 50_000, "only {parsed} inputs parsed");
}

proptest! {
    /// Any header the parser can express survives emit -> view -> parse unchanged.
    #[test]
    fn header_round_trip(
        kind in 0u8..5, fl in any::<u16>(), ttl in any::<u8>(), hops in any::<u8>(),
        service in any::<u16>(), src in any::<(u16, u16, u16)>(), key in any::<Option<u64>>(),
        dc in any::<(u16, u16, u16)>(), conn in any::<u32>(), seq in any::<u32>(),
        ack in any::<u32>(), frag in any::<u32>(), sack in any::<u64>(), plen in 0u16..100,
        msn in any::<u32>(), fence in any::<u32>(), peer_conn in any::<u32>(), rwnd in any::<u16>(),
    ) {
        let dst = match key {
            Some(k) => Dest::Key(k),
            None => Dest::Server(Coord::new(dc.0, dc.1, dc.2)),
        };
        let flags = fl & wire::flags::KNOWN & !wire::flags::KEY_ROUTED & !wire::flags::SOURCE_ROUTED
            | if key.is_some() { wire::flags::KEY_ROUTED } else { 0 };
        let h = Header {
            kind: Kind::from_u8(kind).unwrap(), flags, ttl, hops, service,
            src: Coord::new(src.0, src.1, src.2), dst, conn, peer_conn, seq, ack, msn, frag, fence, sack,
            payload_len: plen, route_len: 0, route_next: 0, rwnd, cong: ttl, cong_echo: hops,
        };
        let mut buf = vec![0u8; HEADERS_LEN + usize::from(plen)];
        h.emit(&mut buf).unwrap();
        let v = FrameView::new_checked(&buf).unwrap();
        prop_assert_eq!(Header::parse(&v).unwrap(), h);
        prop_assert_eq!(v.payload().len(), usize::from(plen));
    }
}

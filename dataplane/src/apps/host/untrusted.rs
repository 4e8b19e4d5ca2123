//! The application channel as a hostile application fills it: the fuzz body.

use super::*;

/// The fuzz body of the application channel as torusd reads it (`fuzz/`'s `app_channel`,
/// and a short run in the tests). The input is what a hostile application writes into its
/// channel: a count (the first byte, modulo 17), that many submission entries (64 bytes
/// each), the bytes of its TX data ring, and its tail indices (the last 12 bytes). The host takes or refuses every entry (counted),
/// or closes the channel, without a panic, and runs on.
pub fn check_untrusted(data: &[u8]) {
    let _ = run_channel(data);
}

/// [`check_untrusted`]'s run: the application's counters after it (messages taken,
/// entries refused as malformed), `None` when the machine could not make a channel.
fn run_channel(data: &[u8]) -> Option<(u64, u64)> {
    use torusnet_client::channel::Geometry;
    use torusnet_proto::routing::LinkView;
    const ENTRY: usize = 64;
    let geo = Geometry {
        sq_entries: 16,
        cq_entries: 64,
        txd_size: 1 << 16,
        rxd_size: 1 << 16,
        pool_size: 4096,
    };
    let dims: torusnet_proto::topology::Dims = "3x3x1".parse().expect("dims");
    let here = Coord::new(0, 0, 0);
    // The machine's limits (descriptors) are not the input's doing: nothing to check then.
    let Ok(shared) = Shared::detached(dims, here, 1) else {
        return None;
    };
    let len = geo.total() as usize;
    let (Ok(mem), Ok(efd)) = (sys::memfd("torusnet-fuzz", len), sys::eventfd()) else {
        return None;
    };
    let Ok(map) = Mapping::map(&mem, len) else {
        return None;
    };
    // SAFETY: the mapping lives in the NewApp beside the region, as the listener's does.
    let Ok(region) = (unsafe { Region::init(map.ptr(), map.len(), geo) }) else {
        return None;
    };
    let (body, indices) = data.split_at(data.len().saturating_sub(12));
    let count = body.first().map_or(0, |b| usize::from(*b) % 17);
    let body = body.get(1..).unwrap_or_default();
    let (entries, txd) = body.split_at(body.len().min(count * ENTRY));
    let sq = (geo.sq_off(), u64::from(geo.sq_entries) * ENTRY as u64);
    assert!(region.copy_in(sq, 0, entries));
    assert!(region.copy_in(region.txd(), 0, &txd[..txd.len().min(1 << 16)]));
    let mut tail = [0u8; 12];
    tail[..indices.len()].copy_from_slice(indices);
    let sq_tail = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let txd_tail = u64::from_le_bytes([
        tail[4], tail[5], tail[6], tail[7], tail[8], tail[9], tail[10], tail[11],
    ]);
    region.u32(off::SQ_TAIL).store(sq_tail, Ordering::Release);
    region.u64(off::TXD_TAIL).store(txd_tail, Ordering::Release);
    let info = Arc::new(AppInfo {
        name: "fuzz".into(),
        service: 4242,
        pid: 0,
        uid: 0,
        attached: std::time::Instant::now(),
        adopted: Default::default(),
        dead: Default::default(),
        closed_why: Default::default(),
        counters: Default::default(),
        added: Default::default(),
        indexed: Default::default(),
        intercepting: Default::default(),
        weight: 1.into(),
    });
    let shared = Arc::new(shared);
    let app = NewApp {
        info: info.clone(),
        map,
        region,
        app_efd: efd,
    };
    if shared.apps.pending.push(app).is_err() {
        return None;
    }
    let Ok(view) = LinkView::all_up(dims) else {
        return None;
    };
    let Ok(mut node) =
        torusnet_proto::node::Node::new(here, view, torusnet_proto::transport::Config::default())
    else {
        return None;
    };
    let mut host = AppsHost::new(shared);
    for k in 0..3u64 {
        host.poll(Time::from_nanos(1_000_000 * (k + 1)), &mut node);
    }
    let c = &info.counters;
    Some((
        c.sent.load(Ordering::Relaxed),
        c.bad.load(Ordering::Relaxed),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_fuzz_run() {
        use torusnet_client::channel::{dest, op, pack_coord, sflag, Sqe};
        let entry = |e: &Sqe| {
            // The entry as it lies in the ring: its fields in order, little-endian.
            let mut b = vec![e.op, e.flags, e.dest_kind, e.kind];
            b.extend_from_slice(&e.service.to_le_bytes());
            b.extend_from_slice(&e.src_service.to_le_bytes());
            for v in [e.tag, e.dest, e.data_pos] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            for v in [e.data_len, e.total_len, e.buf_id, e.pad2] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            for v in [e.aux, e.aux2] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            assert_eq!(b.len(), 64);
            b
        };
        let send = Sqe {
            op: op::SEND,
            flags: sflag::RELIABLE,
            dest_kind: dest::SERVER,
            service: 7,
            tag: 1,
            dest: pack_coord(1, 0, 0),
            data_pos: 0,
            data_len: 100,
            total_len: 100,
            ..Sqe::default()
        };
        let post = Sqe {
            op: op::POST_BUFFER,
            buf_id: 3,
            data_len: 512,
            aux: 0,
            aux2: 0xfeed,
            ..Sqe::default()
        };
        let mut seeds = Vec::new();
        for entries in [vec![send], vec![post, send], vec![send, send, post]] {
            let mut b = vec![entries.len() as u8];
            b.extend(entries.iter().flat_map(entry));
            let data = 100 * entries.iter().filter(|e| e.op == op::SEND).count();
            b.extend(std::iter::repeat_n(0x5a, data));
            b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            b.extend_from_slice(&(data as u64).to_le_bytes());
            seeds.push(b);
        }
        // The seeds reach the deep end: their messages are taken, nothing refused.
        for (k, seed) in seeds.iter().enumerate() {
            let (sent, bad) = run_channel(seed).expect("a channel");
            assert_eq!((sent, bad), ([1, 1, 2][k], 0), "seed {k}");
        }
        // Multicasts: of the pool's first KiB to one member (taken); of bytes beyond the
        // pool, and with a member list cut mid-entry (each refused and counted).
        let mcast = |aux: u64, aux2: u64, members: &[u8]| {
            let e = Sqe {
                op: op::MULTICAST,
                service: 2000,
                tag: 9,
                aux,
                aux2,
                data_pos: 0,
                data_len: members.len() as u32,
                ..Sqe::default()
            };
            let mut b = vec![1u8];
            b.extend(entry(&e));
            b.extend_from_slice(members);
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&(members.len() as u64).to_le_bytes());
            b
        };
        let one = pack_coord(1, 0, 0).to_le_bytes();
        for (seed, want_bad) in [
            (mcast(0, 1024, &one), 0),
            (mcast(4000, 1024, &one), 1),
            (mcast(0, 1024, &one[..5]), 1),
        ] {
            let (_, bad) = run_channel(&seed).expect("a channel");
            assert_eq!(bad, want_bad, "{seed:?}");
            seeds.push(seed);
        }
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "app_channel", &seeds);
        torusnet_proto::fuzz::run(&seeds, 20_000, 29, check_untrusted);
    }
}

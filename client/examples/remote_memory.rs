//! Remote memory between two servers: an owner attached to one torusd registers a region and
//! arms a tripwire; an initiator attached to another writes 4 MiB into it in 64 KiB one-sided
//! writes, reads it all back into its own region, is refused with a wrong cookie and with a
//! read-only capability, and sends checked messages through CLAN's message queue; then the
//! owner offers it 32 MiB as a long send (libRIPC), which the initiator pulls with remote
//! reads into its own memory. Prints one JSON line; exits 0 when everything came back
//! byte-exact.
//!
//! `remote_memory OWNER_SOCKET INITIATOR_SOCKET` (the sockets are files: one process can
//! attach to torusds in different network namespaces).

use std::time::{Duration, Instant};

use torusnet_client::queue::{QueueReceiver, QueueSender};
use torusnet_client::rmem::{Status, READ, WRITE};
use torusnet_client::{AttachOptions, Client, Dest, Error, Event, LongEnd, LongOptions};
use torusnet_client::{RemoteOptions, Wait};

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn coord((x, y, z): (u16, u16, u16)) -> String {
    format!("{x},{y},{z}")
}

/// Starts a write, waiting while the channel is full.
fn write(
    c: &Client,
    cap: &torusnet_client::rmem::Capability,
    off: u64,
    d: &[u8],
) -> Result<u64, Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.remote_write(cap, off, d, RemoteOptions::default()) {
            Err(Error::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200))
            }
            r => return r,
        }
    }
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (Some(owner_sock), Some(init_sock)) = (args.next(), args.next()) else {
        eprintln!("usage: remote_memory OWNER_SOCKET INITIATOR_SOCKET");
        std::process::exit(2);
    };
    let pid = std::process::id();
    // Pools with room for the long send's 32 MiB at each end.
    let pool = AttachOptions { pool: 48 << 20 };
    let owner = Client::attach_with(&owner_sock, &format!("rm-demo-owner-{pid}"), pool)?;
    let init = Client::attach_with(&init_sock, &format!("rm-demo-init-{pid}"), pool)?;
    const LEN: usize = 4 << 20;
    let region = owner.register_region(LEN as u64, READ | WRITE)?;
    let trip = owner.arm_tripwire(&region, 0, 64)?;
    let local = init.register_region(LEN as u64, READ | WRITE)?;
    let cap = region.cap;

    // 4 MiB in 64 KiB writes, then read back.
    let data = bytes(1, LEN);
    let t0 = Instant::now();
    let mut ops = Vec::new();
    for (k, chunk) in data.chunks(64 << 10).enumerate() {
        ops.push(write(&init, &cap, (k * (64 << 10)) as u64, chunk)?);
    }
    let mut failed = Vec::new();
    for op in ops {
        let (s, _) = init.wait_remote(op, Duration::from_secs(15))?;
        if s != Status::Ok {
            failed.push(s.name());
        }
    }
    let write_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let op = init.remote_read(&cap, 0, LEN as u64, &local, 0, RemoteOptions::default())?;
    let (read_status, _) = init.wait_remote(op, Duration::from_secs(15))?;
    let read_s = t1.elapsed().as_secs_f64();
    let mut back = vec![0u8; LEN];
    let read_ok =
        read_status == Status::Ok && init.region_read(&local, 0, &mut back) && back == data;
    let mut at_owner = vec![0u8; LEN];
    let owner_ok = owner.region_read(&region, 0, &mut at_owner) && at_owner == data;
    let mut tripped = false;
    while let Some(e) = owner.recv(Wait::Timeout(Duration::from_millis(200)))? {
        if matches!(e, Event::Tripwire { id, .. } if id == trip) {
            tripped = true;
        }
    }

    // Refusals: a guessed cookie, and a read-only capability used to write.
    let mut wrong = cap;
    wrong.cookie ^= 0xdead_beef;
    let op = write(&init, &wrong, 0, b"x")?;
    let bad_cookie = init.wait_remote(op, Duration::from_secs(10))?.0.name();
    let ro = owner.narrow(&cap, 0, 4096, READ, None)?;
    let op = write(&init, &ro, 0, b"x")?;
    let no_right = init.wait_remote(op, Duration::from_secs(10))?.0.name();

    // CLAN's message queue: a client per end.
    let qrx_c = Client::attach(&owner_sock, &format!("rm-demo-qrx-{pid}"))?;
    let qtx_c = Client::attach(&init_sock, &format!("rm-demo-qtx-{pid}"))?;
    let (mut rx, ring) = QueueReceiver::new(&qrx_c, 256, 128)?;
    let (mut tx, back_cap) = QueueSender::new(&qtx_c, ring, 256, 128)?;
    rx.connect(back_cap);
    let n = 10_000u64;
    let t2 = Instant::now();
    let got = std::thread::scope(|s| {
        let r = s.spawn(move || -> Result<u64, Error> {
            let mut k = 0;
            while k < n {
                match rx.recv(Duration::from_secs(10))? {
                    Some(m) if m == bytes(k, 8 + (k % 100) as usize) => k += 1,
                    _ => break,
                }
            }
            Ok(k)
        });
        for k in 0..n {
            tx.send(&bytes(k, 8 + (k % 100) as usize), Duration::from_secs(10))?;
        }
        tx.flush(Duration::from_secs(10))?;
        r.join().unwrap_or(Ok(0))
    })?;
    let q_rate = got as f64 / t2.elapsed().as_secs_f64();

    // A long send: the owner offers 32 MiB of a region; the initiator pulls them.
    const LONG: usize = 32 << 20;
    let long_data = bytes(7, LONG);
    let src = owner.register_region(LONG as u64, READ)?;
    let dst = init.register_region(LONG as u64, READ | WRITE)?;
    let filled = owner.region_write(&src, 0, &long_data);
    let t3 = Instant::now();
    let offer = owner.send_long(
        Dest::Service(init.address()),
        &src,
        0,
        LONG as u64,
        LongOptions::default(),
    )?;
    let mut pulled = false;
    while let Some(e) = init.recv(Wait::Timeout(Duration::from_secs(10)))? {
        if let Event::LongOffer(o) = e {
            init.pull(&o, &dst, 0, Duration::from_secs(30))?;
            pulled = true;
            break;
        }
    }
    let long_s = t3.elapsed().as_secs_f64();
    let mut end = None;
    while let Some(e) = owner.recv(Wait::Timeout(Duration::from_secs(10)))? {
        if let Event::LongDone {
            offer: o, end: e, ..
        } = e
        {
            if o == offer {
                end = Some(e);
                break;
            }
        }
    }
    let mut long_back = vec![0u8; LONG];
    let long_ok = filled
        && pulled
        && end == Some(LongEnd::Pulled)
        && init.region_read(&dst, 0, &mut long_back)
        && long_back == long_data;
    let ok = failed.is_empty() && read_ok && owner_ok && tripped && got == n && long_ok;
    println!(
        "{{\"ok\":{ok},\"from\":\"{}\",\"to\":\"{}\",\"bytes\":{LEN},\"write_gbps\":{:.2},\"read_gbps\":{:.2},\
\"write_failures\":{},\"read_back_exact\":{read_ok},\"owner_exact\":{owner_ok},\"tripwire\":{tripped},\
\"wrong_cookie\":\"{bad_cookie}\",\"read_only_write\":\"{no_right}\",\"queue_messages\":{got},\"queue_per_s\":{q_rate:.0},\
\"long_bytes\":{LONG},\"long_gbps\":{:.2},\"long_exact\":{long_ok},\"long_end\":\"{}\"}}",
        coord(init.address().server),
        coord(owner.address().server),
        LEN as f64 * 8.0 / write_s / 1e9,
        LEN as f64 * 8.0 / read_s / 1e9,
        failed.len(),
        LONG as f64 * 8.0 / long_s / 1e9,
        end.map_or("none".to_string(), |e| format!("{e:?}")),
    );
    std::process::exit(if ok { 0 } else { 1 });
}

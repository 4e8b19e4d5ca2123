//! Remote memory between applications three hops apart on a 3x3x3 torus of namespaces, with
//! 2% of the frames arriving on one of the target's links dropped in the kernel: one-sided
//! writes and reads byte-exact; every refusal (wrong cookie, out of range, no right, revoked,
//! expired) reported to the initiator and counted at the target; a tripwire waking a process
//! blocked on its event queue; CLAN's message queue passing a checked stream; an owner that
//! exits mid-operation leaving the initiator with a failure, never a hang.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torusnet_client::queue::{QueueReceiver, QueueSender};
use torusnet_client::rmem::{Capability, Status, READ, WRITE};
use torusnet_client::{Client, Dest, Event, RemoteOptions, SendOptions, Wait};
use torusnet_dataplane::config::NodeConfig;
use torusnet_dataplane::mgmt::{Daemon as MgmtDaemon, Mgmt};
use torusnet_dataplane::rmem::RmEvent;
use torusnet_e2e::{Daemon, Torus};
use torusnet_ops::process::cpu_time;
use torusnet_proto::transport::Fences;

fn apps_sock(t: &Torus, c: &str) -> PathBuf {
    t.dir().join(format!("{}-apps.sock", c.replace(',', "-")))
}

fn attach(t: &Torus, at: &str, name: &str) -> Client {
    let start = Instant::now();
    loop {
        match Client::attach(apps_sock(t, at), name) {
            Ok(c) => return c,
            Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("attach {name}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Sends `cap` to `to` in a message and returns what `to` received (capabilities travel as
/// plain bytes in messages).
fn hand_over(from: &Client, to: &Client, cap: &Capability) -> Capability {
    from.send(
        Dest::Service(to.address()),
        &cap.encode(),
        SendOptions::reliable(),
    )
    .expect("send the capability");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(Event::Message { data, .. })) =
            to.recv(Wait::Timeout(Duration::from_millis(100)))
        {
            return Capability::decode(&data).expect("a capability");
        }
    }
    let mut told = Vec::new();
    while let Ok(Some(e)) = from.recv(Wait::NoWait) {
        told.push(e);
    }
    panic!(
        "the capability from {:?} to {:?} never arrived; the sender was told {told:?}",
        from.address(),
        to.address()
    );
}

fn data(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn done(c: &Client, op: u64) -> Status {
    c.wait_remote(op, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("operation {op} never ended: {e}"))
        .0
}

fn rmem_status(t: &Torus, at: &str) -> Value {
    t.ask(at, false, &json!({"cmd": "status"}))
        .unwrap_or(Value::Null)["rmem"]
        .clone()
}

#[test]
fn remote_memory_across_three_hops_with_loss() {
    let t = Torus::up("trm", "3x3x3");
    t.start();
    t.wait_converged(Duration::from_secs(60));
    let (here, there) = ("0,0,0", "1,1,1");
    let owner = attach(&t, there, "rm-owner");
    let init = attach(&t, here, "rm-init");
    // 2% of what arrives on the target's -x link is dropped in its XDP program.
    t.ask(
        there,
        false,
        &json!({"cmd": "fault", "link": "-x", "drop": 0.02}),
    )
    .expect("fault");

    let region = owner
        .register_region(1 << 20, READ | WRITE)
        .expect("register");
    let cap = hand_over(&owner, &init, &region.cap);
    assert_eq!(cap, region.cap);
    let local = init
        .register_region(1 << 20, READ | WRITE)
        .expect("local region");

    // Writes of 64 KiB at scattered offsets, then read back into the initiator's region.
    let mut expect = vec![0u8; 1 << 20];
    let mut ops = Vec::new();
    for k in 0..48u64 {
        let off = (k * 21_841) % ((1 << 20) - 65_536);
        let d = data(k + 1, 65_536);
        expect[off as usize..off as usize + d.len()].copy_from_slice(&d);
        loop {
            match init.remote_write(
                &cap,
                off,
                &d,
                RemoteOptions {
                    backward_fence: true,
                    ..Default::default()
                },
            ) {
                Ok(op) => {
                    ops.push(op);
                    break;
                }
                Err(torusnet_client::Error::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("write: {e}"),
            }
        }
    }
    let t0 = Instant::now();
    for op in ops {
        assert_eq!(done(&init, op), Status::Ok);
    }
    let op = init
        .remote_read(&cap, 0, 1 << 20, &local, 0, RemoteOptions::default())
        .expect("read");
    assert_eq!(done(&init, op), Status::Ok);
    let mut got = vec![0u8; 1 << 20];
    assert!(init.region_read(&local, 0, &mut got));
    let mut at_owner = vec![0u8; 1 << 20];
    assert!(owner.region_read(&region, 0, &mut at_owner));
    eprintln!("3 MiB written and 1 MiB read back in {:?}", t0.elapsed());
    let diff = |a: &[u8], b: &[u8]| {
        let bad: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        format!(
            "{} bytes differ, first at {:?}, last at {:?}",
            bad.len(),
            bad.first(),
            bad.last()
        )
    };
    eprintln!(
        "read back vs expected: {}; owner vs expected: {}",
        diff(&got, &expect),
        diff(&at_owner, &expect)
    );
    assert!(got == expect, "read back differs");
    assert!(at_owner == expect, "the owner's region differs");
    let st = rmem_status(&t, there);
    eprintln!("target: {st}");
    assert!(
        st["placed"].as_u64().unwrap_or(0) > 0,
        "bytes landed straight from frames"
    );

    // Every refusal, reported to the initiator and counted at the target.
    let mut wrong = cap;
    wrong.cookie ^= 0x5555;
    let op = init
        .remote_write(&wrong, 0, b"x", RemoteOptions::default())
        .unwrap();
    assert_eq!(done(&init, op), Status::BadCookie);
    let op = init
        .remote_write(&cap, (1 << 20) - 2, b"xyz", RemoteOptions::default())
        .unwrap();
    assert_eq!(done(&init, op), Status::OutOfRange);
    let ro = owner
        .narrow(&region.cap, 4096, 4096, READ, None)
        .expect("narrow");
    let ro = hand_over(&owner, &init, &ro);
    let op = init
        .remote_write(&ro, 0, b"x", RemoteOptions::default())
        .unwrap();
    assert_eq!(done(&init, op), Status::NoRight);
    let op = init
        .remote_read(&ro, 4000, 200, &local, 0, RemoteOptions::default())
        .unwrap();
    assert_eq!(
        done(&init, op),
        Status::OutOfRange,
        "beyond the narrowed window"
    );
    let op = init
        .remote_read(&ro, 0, 4096, &local, 0, RemoteOptions::default())
        .unwrap();
    assert_eq!(done(&init, op), Status::Ok);
    let brief = owner
        .narrow(
            &region.cap,
            0,
            64,
            READ | WRITE,
            Some(Duration::from_secs(1)),
        )
        .expect("ttl");
    std::thread::sleep(Duration::from_millis(1100));
    let op = init
        .remote_write(&brief, 0, b"x", RemoteOptions::default())
        .unwrap();
    assert_eq!(done(&init, op), Status::Expired);
    let temp = owner
        .narrow(&region.cap, 0, 64, WRITE, None)
        .expect("narrow");
    owner.revoke(&temp).expect("revoke");
    let op = init
        .remote_write(&temp, 0, b"x", RemoteOptions::default())
        .unwrap();
    assert_eq!(done(&init, op), Status::Revoked);
    // Another application cannot narrow or revoke what it does not own.
    assert!(init.narrow(&cap, 0, 8, READ, None).is_err());
    let refused = rmem_status(&t, there)["refused"].clone();
    eprintln!("refused at the target: {refused}");
    for r in [
        "bad cookie",
        "out of range",
        "no right",
        "expired",
        "revoked",
    ] {
        assert!(
            refused[r].as_u64().unwrap_or(0) >= 1,
            "{r} not counted: {refused}"
        );
    }

    // A tripwire wakes the owner blocked on its event queue; a notifying write tells it.
    let trip = owner.arm_tripwire(&region, 0, 8).expect("arm");
    let ev = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut seen = Vec::new();
            while Instant::now() < deadline && seen.len() < 2 {
                if let Ok(Some(e)) = owner.recv(Wait::Timeout(Duration::from_secs(1))) {
                    if matches!(e, Event::Tripwire { .. } | Event::Written { .. }) {
                        seen.push(e);
                    }
                }
            }
            seen
        });
        std::thread::sleep(Duration::from_millis(300));
        let op = init
            .remote_write(
                &cap,
                4,
                b"trip",
                RemoteOptions {
                    notify: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(done(&init, op), Status::Ok);
        waiter.join().expect("waiter")
    });
    eprintln!("owner's events: {ev:?}");
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Tripwire { id, offset: 4, len: 4, .. } if *id == trip)),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::Written {
                offset: 4,
                len: 4,
                ..
            }
        )),
        "{ev:?}"
    );

    // CLAN's message queue: a checked stream of 20,000 messages.
    let rx_client = attach(&t, there, "mq-rx");
    let tx_client = attach(&t, here, "mq-tx");
    let (mut rx, ring) = QueueReceiver::new(&rx_client, 256, 256).expect("ring");
    let ring = hand_over(&rx_client, &tx_client, &ring);
    let (mut tx, back) = QueueSender::new(&tx_client, ring, 256, 256).expect("sender");
    let back = hand_over(&tx_client, &rx_client, &back);
    rx.connect(back);
    let n = 20_000u64;
    let t0 = Instant::now();
    let got = std::thread::scope(|s| {
        let r = s.spawn(move || {
            let mut k = 0u64;
            while k < n {
                match rx.recv(Duration::from_secs(10)).expect("queue recv") {
                    Some(m) => {
                        assert_eq!(m, data(k, 8 + (k % 200) as usize), "message {k}");
                        k += 1;
                    }
                    None => break,
                }
            }
            k
        });
        for k in 0..n {
            tx.send(&data(k, 8 + (k % 200) as usize), Duration::from_secs(10))
                .expect("queue send");
        }
        tx.flush(Duration::from_secs(10)).expect("flush");
        r.join().expect("receiver")
    });
    eprintln!(
        "message queue: {got} of {n} in order and byte-exact, {:.0} messages/s",
        got as f64 / t0.elapsed().as_secs_f64()
    );
    assert_eq!(got, n);

    // A program embedding the dataplane in place of torusd at 2,2,2: the same operations
    // through the embedded API, both ways.
    let emb_at = "2,2,2";
    t.signal(emb_at, Daemon::Torusd, "TERM");
    let (ns, node) = (t.ns(emb_at), t.node_file(emb_at));
    let (cap_tx, cap_rx) = std::sync::mpsc::channel();
    let payload = data(7, 20_000);
    let embedded = {
        let payload = payload.clone();
        std::thread::spawn(move || -> Result<Vec<RmEvent>, String> {
            torusnet_dataplane::netns::enter(&ns).map_err(|e| e.to_string())?;
            let mut cfg = NodeConfig::load(&node).map_err(|e| e.to_string())?;
            cfg.apps = None;
            // An embedding program names its coordinate (torusd learns it from the control
            // process instead).
            cfg.coord = Some(torusnet_proto::topology::Coord::new(2, 2, 2));
            // It serves torusd's management socket, so the control process publishes the
            // view to it as to torusd.
            let mgmt = Mgmt::bind(&cfg.socket).map_err(|e| e.to_string())?;
            if let Some(c) = &cfg.control_socket {
                torusnet_dataplane::mgmt::ask_for_view(c);
            }
            // The stopped torusd's XDP links are released by the kernel shortly after it exits.
            let started = Instant::now();
            let d = loop {
                match MgmtDaemon::new(cfg.clone()) {
                    Ok(d) => break d,
                    Err(e) if started.elapsed() < Duration::from_secs(10) => {
                        eprintln!("embedded start: {e}; again");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(e),
                }
            };
            let server = {
                let d = d.clone();
                std::thread::spawn(move || mgmt.serve(&d))
            };
            let rm = d
                .with_dataplane(|dp| dp.remote_memory(100))
                .flatten()
                .ok_or("no remote memory")?;
            let mine = rm
                .register(65_536, READ | WRITE)
                .map_err(|s| s.name().to_string())?;
            rm.arm_tripwire(&mine, 0, 8)
                .map_err(|s| s.name().to_string())?;
            let _ = cap_tx.send(mine.cap);
            // The first operations wait for this server's coordinate and routes.
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut tries = Vec::new();
            loop {
                let op = rm.write(&cap, 900_000, &payload, false, Fences::default());
                match rm.wait(op, Duration::from_secs(10)) {
                    (Status::Ok, n) if n == payload.len() as u64 => break,
                    (s, _) if Instant::now() < deadline => {
                        tries.push(s.name());
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    (s, _) => return Err(format!("embedded write: {} after {tries:?}", s.name())),
                }
            }
            let op = rm.read(
                &cap,
                900_000,
                payload.len() as u64,
                &mine,
                100,
                Fences::default(),
            );
            match rm.wait(op, Duration::from_secs(10)) {
                (Status::Ok, _) => {}
                (s, _) => return Err(format!("embedded read: {}", s.name())),
            }
            let mut back = vec![0u8; payload.len()];
            if !mine.read(100, &mut back) || back != payload {
                return Err("the embedded read differs".into());
            }
            // The application at 0,0,0 writes into this region: tripwire and notification.
            let mut events = Vec::new();
            let until = Instant::now() + Duration::from_secs(30);
            while events.len() < 2 && Instant::now() < until {
                if let Some(e) = rm.next_event(Duration::from_millis(500)) {
                    if matches!(e, RmEvent::Tripwire { .. } | RmEvent::Written { .. }) {
                        events.push(e);
                    }
                }
            }
            let mut head = [0u8; 8];
            if !mine.read(0, &mut head) || &head != b"embedded" {
                return Err(format!("the application's write did not land: {head:?}"));
            }
            drop(rm);
            d.stop.store(true, std::sync::atomic::Ordering::Release);
            let _ = server.join();
            d.shutdown()?;
            Ok(events)
        })
    };
    let Ok(emb_cap) = cap_rx.recv_timeout(Duration::from_secs(60)) else {
        panic!(
            "the embedded program gave no capability: {:?}",
            embedded.join()
        );
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let op = init
            .remote_write(
                &emb_cap,
                0,
                b"embedded",
                RemoteOptions {
                    notify: true,
                    ..Default::default()
                },
            )
            .expect("write to the embedded program");
        match done(&init, op) {
            Status::Ok => break,
            s if Instant::now() < deadline => {
                eprintln!("write to the embedded program: {}; again", s.name());
                std::thread::sleep(Duration::from_millis(200));
            }
            s => panic!("write to the embedded program: {}", s.name()),
        }
    }
    let events = embedded
        .join()
        .expect("embedded thread")
        .expect("embedded program");
    eprintln!("embedded program's events: {events:?}");
    assert!(events.iter().any(|e| matches!(
        e,
        RmEvent::Tripwire {
            offset: 0,
            len: 8,
            ..
        }
    )));
    assert!(events.iter().any(|e| matches!(
        e,
        RmEvent::Written {
            offset: 0,
            len: 8,
            ..
        }
    )));
    let mut at_owner = vec![0u8; payload.len()];
    assert!(owner.region_read(&region, 900_000, &mut at_owner));
    assert!(
        at_owner == payload,
        "the embedded program's write differs at the owner"
    );

    // The owner exits while large writes are in flight: each ends, some with a failure.
    let big = data(99, 4 << 20);
    let region2 = owner
        .register_region(8 << 20, WRITE)
        .expect("register 8 MiB");
    let cap2 = hand_over(&owner, &init, &region2.cap);
    let ops: Vec<u64> = (0..12)
        .map(|k| loop {
            match init.remote_write(&cap2, (k % 2) * (4 << 20), &big, RemoteOptions::default()) {
                Ok(op) => break op,
                // The channel's ring holds two of these at a time.
                Err(torusnet_client::Error::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("write: {e}"),
            }
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    drop(owner);
    let t0 = Instant::now();
    let ends: Vec<Status> = ops.iter().map(|&op| done(&init, op)).collect();
    eprintln!("after the owner left: {ends:?} within {:?}", t0.elapsed());
    assert!(
        ends.iter().any(|s| *s != Status::Ok),
        "the owner's exit failed nothing: {ends:?}"
    );
    assert!(ends.iter().all(|s| matches!(
        s,
        Status::Ok | Status::Revoked | Status::NoRegion | Status::BadCookie
    )));

    // An initiator that exits with its writes in flight: their ends arrive for an owner
    // nobody serves any more. Once the applications are gone, the daemons that hosted them
    // and their regions go back to sleep between timers instead of polling (such an event
    // once kept a poller awake for good).
    drop(init);
    let owner3 = attach(&t, there, "rm-owner3");
    let init3 = attach(&t, here, "rm-init3");
    let region3 = owner3
        .register_region(8 << 20, WRITE)
        .expect("register 8 MiB");
    let cap3 = hand_over(&owner3, &init3, &region3.cap);
    for k in 0..2u64 {
        loop {
            match init3.remote_write(&cap3, k * (4 << 20), &big, RemoteOptions::default()) {
                Ok(_) => break,
                Err(torusnet_client::Error::WouldBlock) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("write: {e}"),
            }
        }
    }
    drop(init3);
    std::thread::sleep(Duration::from_millis(1500));
    drop(owner3);
    std::thread::sleep(Duration::from_millis(500));
    for at in [here, there] {
        let pid = t.pids(at, Daemon::Torusd)[0];
        let before = cpu_time(pid).expect("cpu time");
        std::thread::sleep(Duration::from_secs(2));
        let used = (cpu_time(pid).expect("cpu time") - before).as_secs_f64();
        eprintln!("{at}: torusd used {used:.2} s of CPU in 2 s, idle");
        assert!(
            used < 1.0,
            "{at}: an idle torusd used {used:.2} s of CPU in 2 s"
        );
    }
}

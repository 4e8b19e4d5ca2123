//! Two dataplanes in two namespaces joined by two veth pairs: reliable messages striped over
//! both links arrive exactly once and intact, with and without in-kernel fault injection,
//! at MTU 1500 and 9000. Needs root.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use torusnet_dataplane::config::NodeConfig;
use torusnet_dataplane::fault::Fault;
use torusnet_dataplane::netns::{enter, format_mac, mac_of, veth_pair, Netns};
use torusnet_dataplane::runtime::Dataplane;
use torusnet_dataplane::shared::Command;
use torusnet_proto::harness::payload;
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::topology::{Coord, Dir};

/// A node file; `name` is unique per test, so that tests running at once never share a
/// socket path (the application socket is named after it).
fn config(name: &str, coord: &str, links: &[(&str, &str, [u8; 6])], mtu: u32) -> NodeConfig {
    let mut t = format!(
        "name = \"{name}\"\ndims = \"2x1x1\"\ncoord = \"{coord}\"\nmtu = {mtu}\npolling = \"adaptive\"\numem_chunks = 4096\n"
    );
    for (ifname, dir, mac) in links {
        t += &format!(
            "[[link]]\nifname = \"{ifname}\"\ndir = \"{dir}\"\nneighbor_mac = \"{}\"\n",
            format_mac(*mac)
        );
    }
    NodeConfig::parse(&t).expect("config")
}

/// Two dataplanes, 0,0,0 (A) and 1,0,0 (B), joined by one or two veth pairs in their own
/// namespaces (which go when the returned handles drop).
fn start_pair(tag: &str, mtu: u32, two_links: bool) -> (Netns, Netns, Dataplane, Dataplane) {
    let na = Netns::new(&format!("tnpa{tag}")).unwrap();
    let nb = Netns::new(&format!("tnpb{tag}")).unwrap();
    veth_pair(&na, "a-px", &nb, "b-mx", mtu).unwrap();
    if two_links {
        veth_pair(&na, "a-mx", &nb, "b-px", mtu).unwrap();
    }
    let mac = |ns: &Netns, ifname: &str| {
        let name = ns.name().to_string();
        let ifname = ifname.to_string();
        std::thread::spawn(move || {
            enter(&name).unwrap();
            mac_of(&ifname).unwrap()
        })
        .join()
        .unwrap()
    };
    let mut la = vec![("a-px", "+x", mac(&nb, "b-mx"))];
    let mut lb = vec![("b-mx", "-x", mac(&na, "a-px"))];
    if two_links {
        la.push(("a-mx", "-x", mac(&nb, "b-px")));
        lb.push(("b-px", "+x", mac(&na, "a-mx")));
    }
    let ca = config(&format!("tnpa{tag}"), "0,0,0", &la, mtu);
    let cb = config(&format!("tnpb{tag}"), "1,0,0", &lb, mtu);
    let (a_name, b_name) = (na.name().to_string(), nb.name().to_string());
    let b = std::thread::spawn(move || {
        enter(&b_name).unwrap();
        Dataplane::start(&cb).expect("start B")
    })
    .join()
    .unwrap();
    let a = std::thread::spawn(move || {
        enter(&a_name).unwrap();
        Dataplane::start(&ca).expect("start A")
    })
    .join()
    .unwrap();
    (na, nb, a, b)
}

/// A reliable transfer from A to B over one or two links whose frames suffer `fault` (in
/// both directions: data and acknowledgements); every message arrives once and intact.
fn run(label: &str, mtu: u32, two_links: bool, fault: Fault, messages: u64, size: usize) {
    // Unique per test: tests that shared a tag (same MTU and links, loss with and without
    // duplication) ran at once and deleted each other's namespaces.
    let tag = format!("{}{label}", std::process::id() % 10000);
    let (_na, _nb, a, b) = start_pair(&tag, mtu, two_links);
    if fault != Fault::default() {
        for d in [Dir::PlusX, Dir::MinusX] {
            for side in [&a, &b] {
                side.command(Command::SetFault { dir: d, fault }).unwrap();
            }
        }
    }
    let tx = a.service(100);
    let rx = b.service(100);
    let opts = MsgOptions {
        reliable: true,
        ..MsgOptions::default()
    };
    let dest = Target::Server(Coord::new(1, 0, 0));
    let sender = std::thread::spawn(move || {
        for id in 0..messages {
            tx.send_blocking(dest, &payload(id, size), opts, Duration::from_secs(30))
                .expect("send");
        }
    });
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < messages && Instant::now() < deadline {
        if let Some(Event::Message { data, .. }) = rx.recv_timeout(Duration::from_millis(100)) {
            let id = u64::from_le_bytes(data[..8].try_into().unwrap());
            assert_eq!(data, payload(id, size), "message {id} corrupted");
            assert!(seen.insert(id), "message {id} delivered twice");
        }
    }
    sender.join().unwrap();
    // Status snapshots are published periodically, so counters may lag the
    // last delivery; wait (bounded) for snapshots that reflect the loss and its repair.
    let (mut sa, mut sb) = (a.status(), b.status());
    let dropped = |sb: &torusnet_dataplane::status::Status| -> u64 {
        sb.links.iter().map(|l| l.xdp.fault_dropped).sum()
    };
    let mangled = |s: &torusnet_dataplane::status::Status| -> (u64, u64) {
        let dup = s.links.iter().map(|l| l.counters.fault_duplicated).sum();
        let re = s.links.iter().map(|l| l.counters.fault_reordered).sum();
        (dup, re)
    };
    let settle = Instant::now() + Duration::from_secs(3);
    let seen_by_b = |sb: &torusnet_dataplane::status::Status| {
        let t = &sb.engine.transport;
        (fault.duplicate == 0.0 || t.duplicate_frames > 0)
            && (fault.reorder == 0.0 || t.out_of_order_frames > 0)
    };
    while (fault.drop > 0.0 && (sa.engine.transport.retransmitted_frames == 0 || dropped(&sb) == 0)
        || !seen_by_b(&sb))
        && Instant::now() < settle
    {
        std::thread::sleep(Duration::from_millis(50));
        (sa, sb) = (a.status(), b.status());
    }
    assert_eq!(seen.len() as u64, messages, "A: {sa:#?}\nB: {sb:#?}");
    if two_links {
        assert!(
            sa.links.iter().all(|l| l.counters.tx_frames > 0),
            "striped over both links"
        );
    }
    eprintln!(
        "{messages} messages of {size} B over {} link(s), MTU {mtu}, {fault:?}: dropped {}, \
         duplicated/reordered at A {:?}, retransmitted {}, duplicates and out-of-order \
         frames at B {} {}",
        1 + usize::from(two_links),
        dropped(&sb),
        mangled(&sa),
        sa.engine.transport.retransmitted_frames,
        sb.engine.transport.duplicate_frames,
        sb.engine.transport.out_of_order_frames
    );
    let (dup, re) = mangled(&sa);
    assert_eq!(dup > 0, fault.duplicate > 0.0, "duplicated: {sa:#?}");
    assert_eq!(re > 0, fault.reorder > 0.0, "reordered: {sa:#?}");
    assert!(
        seen_by_b(&sb),
        "B saw the duplicates and the reordering: {sb:#?}"
    );
    if fault.drop > 0.0 {
        assert!(
            dropped(&sb) > 0,
            "fault injection dropped frames in the kernel: {sb:#?}"
        );
        assert!(
            sa.engine.transport.retransmitted_frames > 0,
            "lost frames were recovered by retransmission: {sa:#?}"
        );
    }
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

fn loss(p: f64) -> Fault {
    Fault::new(p, 0.0, 0.0).expect("a probability")
}

#[test]
fn one_link_mtu1500_with_duplication_and_reordering() {
    let f = Fault::new(0.0, 0.02, 0.02).expect("probabilities");
    run("d1", 1500, false, f, 20_000, 200);
}

#[test]
fn two_links_mtu9000_with_loss_duplication_and_reordering() {
    let f = Fault::new(0.01, 0.02, 0.02).expect("probabilities");
    run("d9", 9000, true, f, 3_000, 20_000);
}

#[test]
fn one_link_mtu1500_with_loss() {
    run("l1", 1500, false, loss(0.02), 20_000, 200);
}

#[test]
fn two_links_mtu1500_with_loss() {
    run("l2", 1500, true, loss(0.02), 20_000, 3000);
}

#[test]
fn one_link_mtu9000_with_loss() {
    run("l9", 9000, false, loss(0.02), 3_000, 20_000);
}

#[test]
fn two_links_mtu9000_with_loss() {
    run("m9", 9000, true, loss(0.02), 5_000, 20_000);
}

/// An embedded service that stops reading: once its inbox is full, reliable messages for it
/// are refused at its server and reported to their sender (`ReceiverFull`); when it reads
/// again it gets every message that was not refused. Nothing accepted is lost.
#[test]
fn a_service_that_stops_reading_refuses_and_its_sender_learns() {
    use torusnet_proto::transport::FailReason;
    let tag = format!("{}f", std::process::id() % 10000);
    let (_na, _nb, a, b) = start_pair(&tag, 1500, false);
    let tx = a.service(101);
    let rx = b.service(101);
    let dest = Target::Server(Coord::new(1, 0, 0));
    let sent = 100_000u64;
    let mut refused = HashSet::new();
    fn tally(e: Event, refused: &mut HashSet<u64>) {
        match e {
            Event::Failed { tags, reason, .. } => {
                assert_eq!(reason, FailReason::ReceiverFull);
                for t in tags {
                    assert!(refused.insert(t), "message {t} reported twice");
                }
            }
            other => panic!("the sender got {other:?}"),
        }
    }
    for id in 0..sent {
        let opts = MsgOptions {
            reliable: true,
            tag: id,
            ..MsgOptions::default()
        };
        tx.send_blocking(dest, &payload(id, 64), opts, Duration::from_secs(30))
            .expect("send");
        while let Some(e) = tx.recv() {
            tally(e, &mut refused);
        }
    }
    // Only once B has taken or refused every message does the service read again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = b.status().engine.transport;
        if t.messages_delivered + t.refused_full >= sent || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut delivered = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (delivered.len() + refused.len()) < sent as usize && Instant::now() < deadline {
        while let Some(e) = rx.recv_timeout(Duration::from_millis(10)) {
            if let Event::Message { data, .. } = e {
                let id = u64::from_le_bytes(data[..8].try_into().unwrap());
                assert_eq!(data, payload(id, 64), "message {id} corrupted");
                assert!(delivered.insert(id), "message {id} delivered twice");
            }
        }
        while let Some(e) = tx.recv() {
            tally(e, &mut refused);
        }
    }
    let st = b.status();
    eprintln!(
        "{sent} sent to a service that stopped reading: {} delivered, {} refused; B: refused_full {}, inbox_overflow {}",
        delivered.len(),
        refused.len(),
        st.engine.transport.refused_full,
        st.engine.inbox_overflow
    );
    assert!(
        !refused.is_empty(),
        "the flood beyond the inbox was refused"
    );
    assert!(
        refused.iter().all(|t| !delivered.contains(t)),
        "a refused message was delivered"
    );
    assert_eq!(delivered.len() + refused.len(), sent as usize);
    assert_eq!(st.engine.inbox_overflow, 0, "nothing accepted was dropped");
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

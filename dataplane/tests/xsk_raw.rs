//! Raw AF_XDP over a veth pair, no protocol: frames written into one UMEM shared by both
//! sockets go out of one end and come back in on the other, byte-exact, both as single
//! 1500-byte frames and as 9000-byte multi-buffer frames. Needs root (a namespace).

use std::time::{Duration, Instant};

use torusnet_dataplane::loader::{AttachPreference, XdpProgram};
use torusnet_dataplane::netns::{veth_pair, Netns};
use torusnet_dataplane::xsk::{SocketConfig, Umem, XdpDesc, XskSocket, CHUNK};
use torusnet_proto::topology::Dir;

const CONTD: u32 = 1;

fn frame(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[12] = 0x88;
    f[13] = 0xB5;
    for (k, b) in f.iter_mut().enumerate().skip(14) {
        *b = (k as u32).wrapping_mul(31).wrapping_add(i) as u8;
    }
    f[14..18].copy_from_slice(&i.to_be_bytes());
    f
}

fn run(mtu: u32) {
    let ns = Netns::new(&format!("tnraw{}m{mtu}", std::process::id())).expect("netns");
    veth_pair(&ns, "va", &ns, "vb", mtu).expect("veth");
    ns.enter().expect("enter netns");
    let cfg = SocketConfig {
        multi_buffer: mtu > 3000,
        ..SocketConfig::default()
    };
    let mut umem = Umem::new(2048).expect("umem");
    let mut b = XskSocket::new(&umem, None, "vb", 0, &cfg).expect("socket on vb");
    let mut a = XskSocket::new(&umem, Some(&b), "va", 0, &cfg).expect("shared socket on va");
    assert!(a.info().shared_umem);
    assert!(!b.info().zero_copy, "veth is copy mode only");
    let mut xdp = XdpProgram::load(mtu, 1).expect("load");
    xdp.attach("vb", Dir::PlusX, AttachPreference::Auto)
        .expect("attach");
    xdp.register_socket(Dir::PlusX, b.raw_fd()).expect("xskmap");

    let n = b.fill.free().min(1024);
    for i in 0..n {
        let c = umem.alloc().expect("chunk");
        b.fill.write(i, c);
    }
    b.fill.submit(n);

    let len = mtu as usize + 14;
    let count = 200u32;
    let mut sent = 0u32;
    let mut got = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < count as usize && Instant::now() < deadline {
        // Send a few frames, each as ceil(len / CHUNK) descriptors.
        while sent < count && a.tx.free() >= 4 {
            let f = frame(sent, len);
            let parts: Vec<&[u8]> = f.chunks(CHUNK).collect();
            for (k, p) in parts.iter().enumerate() {
                let c = umem.alloc().expect("chunk");
                umem.slice_mut(c, p.len()).copy_from_slice(p);
                let options = if k + 1 < parts.len() { CONTD } else { 0 };
                a.tx.write(
                    k as u32,
                    XdpDesc {
                        addr: c,
                        len: p.len() as u32,
                        options,
                    },
                );
            }
            a.tx.submit(parts.len() as u32);
            sent += 1;
        }
        a.kick_tx().expect("kick");
        let done = a.comp.available(4096);
        for i in 0..done {
            umem.release(a.comp.read(i));
        }
        a.comp.release(done);
        let r = b.rx.available(256);
        for i in 0..r {
            let d = b.rx.read(i);
            partial.extend_from_slice(umem.slice(d.addr, d.len as usize));
            umem.release(d.addr);
            if d.options & CONTD == 0 {
                got.push(std::mem::take(&mut partial));
            }
        }
        b.rx.release(r);
        let free = b.fill.free().min(r);
        for i in 0..free {
            b.fill.write(i, umem.alloc().expect("chunk"));
        }
        b.fill.submit(free);
    }
    assert_eq!(
        got.len(),
        count as usize,
        "received {} of {count} at MTU {mtu}",
        got.len()
    );
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f, &frame(i as u32, len), "frame {i} differs at MTU {mtu}");
    }
    let c = xdp.counters(Some(Dir::PlusX));
    assert_eq!(c.redirected, u64::from(count));
    drop(xdp);
    drop(a);
    drop(b);
}

#[test]
fn raw_frames_cross_a_veth_pair() {
    run(1500);
}

#[test]
fn raw_jumbo_frames_are_multi_buffer() {
    run(9000);
}

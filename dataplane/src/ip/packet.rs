//! What a packet read from the TUN interface is for, without I/O: where it goes (a server
//! of the torus, or nowhere the torus can take it), and the ICMP error a sender gets when its
//! destination cannot be reached. Packets carry the kernel's `virtio_net_hdr` in front (the
//! interface has IFF_VNET_HDR, so large TCP segments and unfinished checksums pass through
//! as they are); it travels with the packet and is handed to the destination's kernel.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::addr::{Prefix4, Prefix6};

/// Length of the `virtio_net_hdr` in front of every packet.
pub const VNET_HDR: usize = 10;

/// `virtio_net_hdr.gso_type` of a packet that is one segment.
pub const GSO_NONE: u8 = 0;

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// To server number `i`.
    Server(usize),
    /// Broadcast or multicast: not carried (the torus is point-to-point; neighbour discovery
    /// and ARP have nothing to do on a TUN interface).
    Group,
    /// An address of the torus's prefix that no server has.
    NoServer,
    /// Outside the torus's prefixes (the routes send nothing else here).
    Outside,
    /// Not an IPv4 or IPv6 packet.
    Malformed,
}

/// Where `pkt` (vnet header included) goes, for a torus of `count` servers.
pub fn classify(pkt: &[u8], v4: &Prefix4, v6: &Prefix6, count: usize) -> Dest {
    let Some(ip) = pkt.get(VNET_HDR..) else {
        return Dest::Malformed;
    };
    match ip.first().map(|b| b >> 4) {
        Some(4) if ip.len() >= 20 => {
            let d = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            if d.is_multicast() || d.is_broadcast() || d == v4.broadcast() {
                Dest::Group
            } else if !v4.contains(d) {
                Dest::Outside
            } else {
                v4.server(d, count).map_or(Dest::NoServer, Dest::Server)
            }
        }
        Some(6) if ip.len() >= 40 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&ip[24..40]);
            let d = Ipv6Addr::from(a);
            if d.is_multicast() {
                Dest::Group
            } else {
                match v6.server(d, count) {
                    Some(i) => Dest::Server(i),
                    None => {
                        let mask = u128::MAX << (128 - v6.len);
                        if u128::from(d) & mask == u128::from(v6.net) {
                            Dest::NoServer
                        } else {
                            Dest::Outside
                        }
                    }
                }
            }
        }
        _ => Dest::Malformed,
    }
}

fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for p in parts {
        let mut c = p.chunks_exact(2);
        for w in &mut c {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [b] = c.remainder() {
            sum += u32::from(u16::from_be_bytes([*b, 0]));
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The ICMP "destination unreachable" (host unreachable) answer to `pkt` (vnet header
/// included), from `from`, as a packet for the TUN interface (vnet header included); `None`
/// for packets that get no ICMP error (ICMP errors themselves, fragments, malformed ones).
pub fn unreachable(pkt: &[u8], from4: Ipv4Addr, from6: Ipv6Addr) -> Option<Vec<u8>> {
    let ip = pkt.get(VNET_HDR..)?;
    let mut out = vec![0u8; VNET_HDR];
    match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0xf) * 4;
            if ihl < 20 || ip.len() < ihl {
                return None;
            }
            // No error about an error (RFC 1122): of ICMP, only echo requests get one; nor
            // about a fragment other than the first.
            let frag_offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            if ip[9] == 1 && ip.get(ihl) != Some(&8) || frag_offset != 0 {
                return None;
            }
            let quote = &ip[..ip.len().min(ihl + 8)];
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let total = 20 + 8 + quote.len();
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            h[8] = 64;
            h[9] = 1;
            h[12..16].copy_from_slice(&from4.octets());
            h[16..20].copy_from_slice(&src.octets());
            let c = checksum(&[&h]);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            let mut icmp = vec![3u8, 1, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(quote);
            let c = checksum(&[&icmp]);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&h);
            out.extend_from_slice(&icmp);
        }
        6 => {
            // ICMPv6 errors (types below 128) get none.
            if ip.len() < 40 || ip[6] == 58 && ip.get(40).is_none_or(|t| *t < 128) {
                return None;
            }
            let quote = &ip[..ip.len().min(1280 - 48)];
            let mut src = [0u8; 16];
            src.copy_from_slice(&ip[8..24]);
            let len = 8 + quote.len();
            let mut icmp = vec![1u8, 3, 0, 0, 0, 0, 0, 0];
            icmp.extend_from_slice(quote);
            let pseudo_len = (len as u32).to_be_bytes();
            let c = checksum(&[&from6.octets(), &src, &pseudo_len, &[0, 0, 0, 58], &icmp]);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut h = [0u8; 40];
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(len as u16).to_be_bytes());
            h[6] = 58;
            h[7] = 64;
            h[8..24].copy_from_slice(&from6.octets());
            h[24..40].copy_from_slice(&src);
            out.extend_from_slice(&h);
            out.extend_from_slice(&icmp);
        }
        _ => return None,
    }
    Some(out)
}

/// The fuzz body of the TUN service's packet parsing (`fuzz/`'s `ip_packet`, and a short
/// run in the tests): a packet of any bytes is classified without a panic, and an ICMP
/// "unreachable" answer to it, when one is made, is a well-formed packet: lengths that
/// match, checksums that verify, no larger than IPv4's 576 or IPv6's 1280 bytes.
pub fn check_untrusted(data: &[u8]) {
    let v4: Prefix4 = "10.77.0.0/16".parse().expect("prefix");
    let v6: Prefix6 = "fd77::/64".parse().expect("prefix");
    let _ = classify(data, &v4, &v6, 27);
    let Some(out) = unreachable(data, v4.router(), v6.router()) else {
        return;
    };
    let ip = &out[VNET_HDR..];
    match ip[0] >> 4 {
        4 => {
            assert!(ip.len() <= 576, "an ICMPv4 error of {} bytes", ip.len());
            assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len());
            assert_eq!(checksum(&[&ip[..20]]), 0, "IPv4 header checksum");
            assert_eq!(checksum(&[&ip[20..]]), 0, "ICMP checksum");
        }
        6 => {
            assert!(ip.len() <= 1280, "an ICMPv6 error of {} bytes", ip.len());
            assert_eq!(
                usize::from(u16::from_be_bytes([ip[4], ip[5]])) + 40,
                ip.len()
            );
            let len = ((ip.len() - 40) as u32).to_be_bytes();
            let sum = checksum(&[&ip[8..24], &ip[24..40], &len, &[0, 0, 0, 58], &ip[40..]]);
            assert_eq!(sum, 0, "ICMPv6 checksum");
        }
        v => panic!("an answer of IP version {v}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_fuzz_run() {
        let mut v6 = vec![0u8; VNET_HDR];
        let mut h = [0u8; 48];
        h[0] = 0x60;
        h[4..6].copy_from_slice(&8u16.to_be_bytes());
        h[6] = 17;
        h[7] = 64;
        h[8] = 0xfd;
        h[9] = 0x77;
        h[23] = 1;
        h[24] = 0xfd;
        h[25] = 0x77;
        h[39] = 9;
        v6.extend_from_slice(&h);
        let seeds = vec![
            v4([10, 77, 0, 5], 6),
            v4([10, 77, 0, 29], 17),
            v4([10, 77, 255, 255], 1),
            v4([224, 0, 0, 1], 17),
            v4([8, 8, 8, 8], 6),
            v6,
        ];
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "ip_packet", &seeds);
        torusnet_proto::fuzz::run(&seeds, 200_000, 26, check_untrusted);
    }

    fn v4(dst: [u8; 4], proto: u8) -> Vec<u8> {
        let mut p = vec![0u8; VNET_HDR];
        let mut h = [0u8; 28];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&28u16.to_be_bytes());
        h[9] = proto;
        h[12..16].copy_from_slice(&[10, 77, 0, 1]);
        h[16..20].copy_from_slice(&dst);
        h[20] = 8; // echo request, if ICMP
        p.extend_from_slice(&h);
        p
    }

    fn prefixes() -> (Prefix4, Prefix6) {
        (
            "10.77.0.0/16".parse().unwrap(),
            "fd77::/64".parse().unwrap(),
        )
    }

    #[test]
    fn packets_go_to_their_server_or_nowhere() {
        let (p4, p6) = prefixes();
        assert_eq!(
            classify(&v4([10, 77, 0, 5], 6), &p4, &p6, 27),
            Dest::Server(4)
        );
        assert_eq!(
            classify(&v4([10, 77, 0, 29], 6), &p4, &p6, 27),
            Dest::NoServer
        );
        assert_eq!(
            classify(&v4([10, 77, 255, 255], 17), &p4, &p6, 27),
            Dest::Group
        );
        assert_eq!(classify(&v4([224, 0, 0, 1], 17), &p4, &p6, 27), Dest::Group);
        assert_eq!(classify(&v4([8, 8, 8, 8], 6), &p4, &p6, 27), Dest::Outside);
        assert_eq!(classify(&[0u8; 12], &p4, &p6, 27), Dest::Malformed);
        let mut p = vec![0u8; VNET_HDR + 40];
        p[VNET_HDR] = 0x60;
        p[VNET_HDR + 24..VNET_HDR + 40]
            .copy_from_slice(&"fd77::3".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(classify(&p, &p4, &p6, 27), Dest::Server(2));
        p[VNET_HDR + 24..VNET_HDR + 40]
            .copy_from_slice(&"ff02::2".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(classify(&p, &p4, &p6, 27), Dest::Group);
        let mut rng = torusnet_proto::rng::SplitMix64::new(9);
        for _ in 0..20_000 {
            let mut b = vec![0u8; rng.below(80) as usize];
            rng.fill(&mut b);
            let _ = classify(&b, &p4, &p6, 27);
            let _ = unreachable(&b, p4.addr(0), p6.addr(0));
        }
    }

    #[test]
    fn icmp_errors_are_well_formed_and_never_about_icmp_errors() {
        let (p4, p6) = prefixes();
        let e = unreachable(&v4([10, 77, 0, 29], 6), p4.addr(0), p6.addr(0)).unwrap();
        let ip = &e[VNET_HDR..];
        assert_eq!(ip[9], 1);
        assert_eq!(checksum(&[&ip[..20]]), 0, "IPv4 header checksum");
        assert_eq!(checksum(&[&ip[20..]]), 0, "ICMP checksum");
        assert_eq!((ip[20], ip[21]), (3, 1));
        assert_eq!(&ip[16..20], &[10, 77, 0, 1]);
        // An echo request gets one; an ICMP error does not.
        assert!(unreachable(&v4([10, 77, 0, 29], 1), p4.addr(0), p6.addr(0)).is_some());
        let mut err = v4([10, 77, 0, 29], 1);
        err[VNET_HDR + 20] = 3;
        assert!(unreachable(&err, p4.addr(0), p6.addr(0)).is_none());
    }
}

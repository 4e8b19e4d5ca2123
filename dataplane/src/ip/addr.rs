//! Addresses of the torus's IP network: server number i (the dense index of its coordinate,
//! x fastest) is host i + 1 of the configured IPv4 and IPv6 prefixes. One flat network, so
//! one prefix route through the TUN interface reaches every server.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix4 {
    /// Network address (host bits zero).
    pub net: Ipv4Addr,
    /// Prefix length.
    pub len: u8,
}

/// An IPv6 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix6 {
    /// Network address (host bits zero).
    pub net: Ipv6Addr,
    /// Prefix length.
    pub len: u8,
}

fn split(s: &str) -> Result<(&str, u8), String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not ADDRESS/LENGTH"))?;
    let l: u8 = l.parse().map_err(|_| format!("{s:?}: bad prefix length"))?;
    Ok((a, l))
}

impl FromStr for Prefix4 {
    type Err = String;
    fn from_str(s: &str) -> Result<Prefix4, String> {
        let (a, len) = split(s)?;
        let a: Ipv4Addr = a.parse().map_err(|_| format!("{s:?}: bad IPv4 address"))?;
        if !(8..=30).contains(&len) {
            return Err(format!("{s:?}: an IPv4 prefix is /8 to /30"));
        }
        let mask = u32::MAX << (32 - len);
        if u32::from(a) & !mask != 0 {
            return Err(format!("{s:?}: host bits are set"));
        }
        Ok(Prefix4 { net: a, len })
    }
}

impl FromStr for Prefix6 {
    type Err = String;
    fn from_str(s: &str) -> Result<Prefix6, String> {
        let (a, len) = split(s)?;
        let a: Ipv6Addr = a.parse().map_err(|_| format!("{s:?}: bad IPv6 address"))?;
        if !(16..=112).contains(&len) {
            return Err(format!("{s:?}: an IPv6 prefix is /16 to /112"));
        }
        let mask = u128::MAX << (128 - len);
        if u128::from(a) & !mask != 0 {
            return Err(format!("{s:?}: host bits are set"));
        }
        Ok(Prefix6 { net: a, len })
    }
}

impl Prefix4 {
    /// Hosts it can number (network and broadcast excluded).
    pub fn hosts(&self) -> u64 {
        (1u64 << (32 - self.len)) - 2
    }

    /// The address of server number `i`.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.net) + i as u32 + 1)
    }

    /// The server number of `a`, if it is one of `count` servers' addresses.
    pub fn server(&self, a: Ipv4Addr, count: usize) -> Option<usize> {
        let off = u32::from(a).checked_sub(u32::from(self.net))?;
        let i = (off as usize).checked_sub(1)?;
        (i < count).then_some(i)
    }

    /// Whether `a` is inside the prefix.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.len);
        u32::from(a) & mask == u32::from(self.net)
    }

    /// The prefix's broadcast address.
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.net) | !(u32::MAX << (32 - self.len)))
    }

    /// The address ICMP errors come from (the last host of the prefix: the kernel drops an
    /// error that claims to come from its own address).
    pub fn router(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.broadcast()) - 1)
    }

    /// The netmask.
    pub fn mask(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::MAX << (32 - self.len))
    }
}

impl Prefix6 {
    /// The address of server number `i`.
    pub fn addr(&self, i: usize) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.net) + i as u128 + 1)
    }

    /// The address ICMP errors come from (the last host of the prefix).
    pub fn router(&self) -> Ipv6Addr {
        let host = !(u128::MAX << (128 - self.len));
        Ipv6Addr::from(u128::from(self.net) | (host - 1))
    }

    /// The server number of `a`, if it is one of `count` servers' addresses.
    pub fn server(&self, a: Ipv6Addr, count: usize) -> Option<usize> {
        let off = u128::from(a).checked_sub(u128::from(self.net))?;
        let i = usize::try_from(off.checked_sub(1)?).ok()?;
        (i < count).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_hosts_one_up() {
        let p: Prefix4 = "10.77.0.0/16".parse().unwrap();
        assert_eq!(p.addr(0), Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(p.addr(300), Ipv4Addr::new(10, 77, 1, 45));
        assert_eq!(p.server(Ipv4Addr::new(10, 77, 1, 45), 512), Some(300));
        assert_eq!(p.server(Ipv4Addr::new(10, 77, 0, 0), 512), None);
        assert_eq!(
            p.server(Ipv4Addr::new(10, 77, 2, 1), 512),
            None,
            "beyond the torus"
        );
        assert_eq!(p.broadcast(), Ipv4Addr::new(10, 77, 255, 255));
        assert_eq!(p.mask(), Ipv4Addr::new(255, 255, 0, 0));
        assert_eq!(p.router(), Ipv4Addr::new(10, 77, 255, 254));
        let q: Prefix6 = "fd77::/64".parse().unwrap();
        assert_eq!(q.addr(26), "fd77::1b".parse::<Ipv6Addr>().unwrap());
        assert_eq!(q.server("fd77::1b".parse().unwrap(), 27), Some(26));
        assert_eq!(q.server("fd77::1c".parse().unwrap(), 27), None);
        assert_eq!(
            q.router(),
            "fd77::ffff:ffff:ffff:fffe".parse::<Ipv6Addr>().unwrap()
        );
        for bad in ["10.77.0.1/16", "10.77.0.0", "10.77.0.0/31", "x/16"] {
            assert!(bad.parse::<Prefix4>().is_err(), "{bad}");
        }
        assert!("fd77::1/64".parse::<Prefix6>().is_err());
    }
}

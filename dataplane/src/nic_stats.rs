//! A link's own driver counters (what `ethtool -S` prints), read by ioctl: of them torusd
//! reads the frames the XDP program redirected to a link that the link could not take (on
//! veth `tx_queue_N_xdp_xmit_errors`: the peer's ring was full). The names are read once,
//! when the link opens; the values at every status snapshot.

use std::io;
use std::os::fd::AsRawFd;

use crate::netns::ifreq_for;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;

/// The driver counters of one link that count failed XDP redirects into it.
#[derive(Debug, Clone)]
pub struct RedirectErrors {
    ifname: String,
    /// How many counters the driver has, and which of them to add up.
    count: usize,
    picked: Vec<usize>,
}

/// Issues SIOCETHTOOL on `ifname` with `data` as the request.
fn ethtool(ifname: &str, data: *mut libc::c_void) -> io::Result<()> {
    let (fd, mut req) = ifreq_for(ifname)?;
    req.ifr_ifru.ifru_data = data.cast();
    // SAFETY: req names the interface and points at a request buffer the caller sized for
    // the command it holds.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL, &mut req) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The names of `ifname`'s driver counters.
fn names(ifname: &str) -> io::Result<Vec<String>> {
    // struct ethtool_sset_info: cmd, reserved, sset_mask (u64), then one u32 per set.
    let mut info = [0u32; 5];
    info[0] = ETHTOOL_GSSET_INFO;
    info[2] = 1 << ETH_SS_STATS;
    ethtool(ifname, info.as_mut_ptr().cast())?;
    let count = if info[2] & (1 << ETH_SS_STATS) != 0 {
        info[4] as usize
    } else {
        0
    };
    // struct ethtool_gstrings: cmd, string_set, len, then the names, 32 bytes each.
    let mut buf = vec![0u8; 12 + count * ETH_GSTRING_LEN];
    buf[0..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
    buf[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
    buf[8..12].copy_from_slice(&(count as u32).to_ne_bytes());
    ethtool(ifname, buf.as_mut_ptr().cast())?;
    Ok(buf[12..]
        .chunks(ETH_GSTRING_LEN)
        .map(|n| {
            let end = n.iter().position(|b| *b == 0).unwrap_or(n.len());
            String::from_utf8_lossy(&n[..end]).into_owned()
        })
        .collect())
}

impl RedirectErrors {
    /// Finds `ifname`'s counters of failed XDP redirects (none on a driver without them).
    pub fn new(ifname: &str) -> io::Result<RedirectErrors> {
        let names = names(ifname)?;
        let picked = names
            .iter()
            .enumerate()
            .filter(|(_, n)| n.contains("xdp_xmit_err"))
            .map(|(i, _)| i)
            .collect();
        Ok(RedirectErrors {
            ifname: ifname.to_string(),
            count: names.len(),
            picked,
        })
    }

    /// Frames redirected into the link that it could not take, so far (0 on a driver that
    /// counts none). Reads the interface in the calling thread's network namespace.
    pub fn read(&self) -> u64 {
        if self.picked.is_empty() {
            return 0;
        }
        // struct ethtool_stats: cmd, n_stats, then the values (u64 each).
        let mut buf = vec![0u8; 8 + 8 * self.count];
        buf[0..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
        if ethtool(&self.ifname, buf.as_mut_ptr().cast()).is_err() {
            return 0;
        }
        let value = |i: usize| {
            let at = 8 + 8 * i;
            let b: [u8; 8] = buf.get(at..at + 8)?.try_into().ok()?;
            Some(u64::from_ne_bytes(b))
        };
        self.picked.iter().filter_map(|i| value(*i)).sum()
    }
}

//! The payload of probe frames (`Kind::Probe`): path probes, their replies, and the
//! path-failure reports of servers that cannot forward a source-routed frame.
//!
//! ```text
//!  offset size field
//!       0    1 what: 0 probe, 1 reply, 2 path failure
//!       1    1 path: the probed path's index in its source's path set
//!       2    1 hop: where the route broke (failures)
//!       3    1 dir: the link that could not be taken (failures)
//!       4    4 round: the source's probing round
//!       8    4 available bandwidth, Mb/s: the least of every link's so far
//!      12    6 the flow's destination server (x, y, z)
//!      18    2 zero
//! ```
//!
//! A probe travels its path as a source-routed frame and every server it passes lowers the
//! bandwidth figure to what its input and output links have free; the destination sends it
//! back as a reply, routed by next hops. A failure report also goes back by next hops.

use crate::topology::{Coord, Dir};

/// Bytes of a probe payload.
pub const PROBE_LEN: usize = 20;

/// What a probe frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Going out along the path.
    Probe,
    /// Coming back from the destination.
    Reply,
    /// A server on the path could not take its next hop.
    Failure {
        /// The route's hop that could not be taken.
        hop: u8,
        /// Its direction.
        dir: Dir,
    },
}

/// A decoded probe payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// What it is.
    pub kind: ProbeKind,
    /// The path's index in the source's set.
    pub path: u8,
    /// The source's probing round.
    pub round: u32,
    /// The least available bandwidth seen so far, Mb/s.
    pub avail_mbps: u32,
    /// The flow's destination.
    pub flow_dst: Coord,
}

impl Probe {
    /// Parses an untrusted payload; `None` when it is not a well-formed probe.
    pub fn parse(p: &[u8]) -> Option<Probe> {
        if p.len() < PROBE_LEN || p[18] != 0 || p[19] != 0 {
            return None;
        }
        let kind = match p[0] {
            0 if p[2] == 0 && p[3] == 0 => ProbeKind::Probe,
            1 if p[2] == 0 && p[3] == 0 => ProbeKind::Reply,
            2 => ProbeKind::Failure {
                hop: p[2],
                dir: Dir::from_index(p[3])?,
            },
            _ => return None,
        };
        let u16_at = |i: usize| u16::from_be_bytes([p[i], p[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        Some(Probe {
            kind,
            path: p[1],
            round: u32_at(4),
            avail_mbps: u32_at(8),
            flow_dst: Coord::new(u16_at(12), u16_at(14), u16_at(16)),
        })
    }

    /// Writes the payload into `p` (at least [`PROBE_LEN`] bytes).
    pub fn emit(&self, p: &mut [u8]) -> Option<()> {
        let p = p.get_mut(..PROBE_LEN)?;
        let (what, hop, dir) = match self.kind {
            ProbeKind::Probe => (0, 0, 0),
            ProbeKind::Reply => (1, 0, 0),
            ProbeKind::Failure { hop, dir } => (2, hop, dir.index()),
        };
        p[0] = what;
        p[1] = self.path;
        p[2] = hop;
        p[3] = dir;
        p[4..8].copy_from_slice(&self.round.to_be_bytes());
        p[8..12].copy_from_slice(&self.avail_mbps.to_be_bytes());
        p[12..14].copy_from_slice(&self.flow_dst.x.to_be_bytes());
        p[14..16].copy_from_slice(&self.flow_dst.y.to_be_bytes());
        p[16..18].copy_from_slice(&self.flow_dst.z.to_be_bytes());
        p[18..20].copy_from_slice(&[0, 0]);
        Some(())
    }

    /// Lowers the available-bandwidth figure in the payload `p` to `mbps` (a hop's links).
    pub fn lower(p: &mut [u8], mbps: u32) {
        if let Some(f) = p.get_mut(8..12) {
            let now = u32::from_be_bytes([f[0], f[1], f[2], f[3]]);
            f.copy_from_slice(&now.min(mbps).to_be_bytes());
        }
    }
}

/// The fuzz body of the probe decoder (`fuzz/`'s `probe`, and a short run in the tests): any
/// payload parses or not without a panic, a probe that parses emits back to the same, and
/// lowering its bandwidth figure keeps it parseable.
pub fn check_untrusted(data: &[u8]) {
    if let Some(p) = Probe::parse(data) {
        let mut b = [0u8; PROBE_LEN];
        p.emit(&mut b).expect("a probe fits PROBE_LEN");
        assert_eq!(Probe::parse(&b), Some(p), "re-emitted probe differs");
        let mut c = data.to_vec();
        Probe::lower(&mut c, 1);
        assert!(Probe::parse(&c).is_some(), "lowered probe no longer parses");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_garbage() {
        for kind in [
            ProbeKind::Probe,
            ProbeKind::Reply,
            ProbeKind::Failure {
                hop: 3,
                dir: Dir::MinusY,
            },
        ] {
            let p = Probe {
                kind,
                path: 2,
                round: 77,
                avail_mbps: 9_000,
                flow_dst: Coord::new(1, 2, 3),
            };
            let mut b = [0u8; PROBE_LEN];
            p.emit(&mut b).unwrap();
            assert_eq!(Probe::parse(&b), Some(p));
            Probe::lower(&mut b, 400);
            assert_eq!(Probe::parse(&b).unwrap().avail_mbps, 400);
            Probe::lower(&mut b, 900);
            assert_eq!(Probe::parse(&b).unwrap().avail_mbps, 400);
        }
        assert!(Probe::parse(&[0u8; 5]).is_none());
        let mut b = [0u8; PROBE_LEN];
        b[0] = 3;
        assert!(Probe::parse(&b).is_none());
        b[0] = 2;
        b[3] = 6;
        assert!(Probe::parse(&b).is_none());
        b = [0u8; PROBE_LEN];
        b[19] = 1;
        assert!(Probe::parse(&b).is_none());
    }
}

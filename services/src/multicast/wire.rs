//! Messages of the multicast service (service 9, reliable, little endian). Every `Data`
//! and `Have` carries what a server needs to join a transfer it has not heard of yet (size,
//! chunk size, checksum, root), so a chunk that overtakes the `Start`, or a repair request
//! to a server whose `Start` was lost, is never lost. Decoding
//! checks every length; nothing panics on bytes from the network.

use torusnet_proto::topology::Coord;

/// What every transfer's messages name it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// Chosen by the root.
    pub id: u64,
    /// The root (source).
    pub root: Coord,
    /// Bytes in all.
    pub size: u64,
    /// Bytes per chunk.
    pub chunk: u32,
    /// The service members deliver to (0: none; torusd checks the bytes and drops them).
    pub service: u16,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg<'a> {
    /// From the root to every server: whether it is a member (relays only forward).
    Start {
        /// The transfer.
        t: Transfer,
        /// A member (delivers and reports) or a relay.
        member: bool,
    },
    /// Chunk `index` (of tree `index % trees`), parent to child.
    Data {
        /// The transfer.
        t: Transfer,
        /// Its index.
        index: u32,
        /// Its bytes.
        data: &'a [u8],
    },
    /// A child to its (new) parent in tree `tree`: the chunks of that tree it holds. It
    /// names the whole transfer, so a parent that never heard of it (its `Start` and
    /// chunks were lost while it was unreachable) joins it and repairs its subtree.
    Have {
        /// The transfer.
        t: Transfer,
        /// The tree.
        tree: u8,
        /// Bit `j`: the tree's `j`-th chunk (chunk `j * trees + tree`) is held.
        bits: &'a [u8],
    },
    /// A member to the root: it delivered everything, and the checksum it computed.
    Done {
        /// The transfer's id.
        id: u64,
        /// The checksum of what it delivered (`super::fold` over the chunks in order).
        checksum: u64,
    },
    /// A member to the root: how many chunks it delivered in order (the root sends at most
    /// a window beyond the slowest member).
    Progress {
        /// The transfer's id.
        id: u64,
        /// Chunks delivered, from the first.
        delivered: u32,
    },
    /// A member to the root: the chunks of a window it holds (bit `j`: chunk `from + j`);
    /// the root sends the others it has sent before (its parents may no longer hold them).
    Want {
        /// The transfer.
        t: Transfer,
        /// The window's first chunk.
        from: u32,
        /// What it holds of it.
        bits: &'a [u8],
    },
    /// A member to the root: it cannot deliver the transfer (no application there hosts
    /// its service), and why.
    Refused {
        /// The transfer's id.
        id: u64,
        /// Why, in words (at most [`MAX_REASON`] bytes).
        reason: &'a str,
    },
    /// From the root: the transfer is over (complete, or given up); forget it.
    End {
        /// The transfer's id.
        id: u64,
    },
}

/// Bytes of a `Data` before its chunk.
pub const DATA_HEADER: usize = 1 + 8 + 6 + 8 + 4 + 2 + 4;

/// Longest reason a `Refused` carries.
pub const MAX_REASON: usize = 200;

fn put_t(o: &mut Vec<u8>, t: &Transfer) {
    o.extend_from_slice(&t.id.to_le_bytes());
    for v in t.root.to_array() {
        o.extend_from_slice(&v.to_le_bytes());
    }
    o.extend_from_slice(&t.size.to_le_bytes());
    o.extend_from_slice(&t.chunk.to_le_bytes());
    o.extend_from_slice(&t.service.to_le_bytes());
}

struct R<'a>(&'a [u8]);

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        (self.0.len() >= n).then(|| {
            let (h, t) = self.0.split_at(n);
            self.0 = t;
            h
        })
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    fn t(&mut self) -> Option<Transfer> {
        Some(Transfer {
            id: self.u64()?,
            root: Coord::new(self.u16()?, self.u16()?, self.u16()?),
            size: self.u64()?,
            chunk: self.u32()?,
            service: self.u16()?,
        })
    }
}

impl Msg<'_> {
    /// Encoded.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Msg::Start { t, member } => {
                o.push(1);
                put_t(&mut o, t);
                o.push(u8::from(*member));
            }
            Msg::Data { t, index, data } => {
                o.reserve(DATA_HEADER + data.len());
                o.push(2);
                put_t(&mut o, t);
                o.extend_from_slice(&index.to_le_bytes());
                o.extend_from_slice(data);
            }
            Msg::Have { t, tree, bits } => {
                o.push(3);
                put_t(&mut o, t);
                o.push(*tree);
                o.extend_from_slice(bits);
            }
            Msg::Done { id, checksum } => {
                o.push(4);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&checksum.to_le_bytes());
            }
            Msg::End { id } => {
                o.push(5);
                o.extend_from_slice(&id.to_le_bytes());
            }
            Msg::Progress { id, delivered } => {
                o.push(6);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&delivered.to_le_bytes());
            }
            Msg::Want { t, from, bits } => {
                o.push(7);
                put_t(&mut o, t);
                o.extend_from_slice(&from.to_le_bytes());
                o.extend_from_slice(bits);
            }
            Msg::Refused { id, reason } => {
                o.push(8);
                o.extend_from_slice(&id.to_le_bytes());
                let mut n = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(n) {
                    n -= 1;
                }
                o.extend_from_slice(&reason.as_bytes()[..n]);
            }
        }
        o
    }

    /// A `Data` message of `len` bytes whose chunk `fill` writes in place (`None`: `fill`
    /// could not).
    pub fn data_with(
        t: &Transfer,
        index: u32,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<Vec<u8>> {
        let mut o = Vec::with_capacity(DATA_HEADER + len);
        o.push(2);
        put_t(&mut o, t);
        o.extend_from_slice(&index.to_le_bytes());
        o.resize(DATA_HEADER + len, 0);
        fill(&mut o[DATA_HEADER..]).then_some(o)
    }

    /// Decoded (`None`: malformed).
    pub fn decode(b: &[u8]) -> Option<Msg<'_>> {
        let mut r = R(b);
        let m = match r.u8()? {
            1 => Msg::Start {
                t: r.t()?,
                member: r.u8()? != 0,
            },
            2 => Msg::Data {
                t: r.t()?,
                index: r.u32()?,
                data: r.0,
            },
            3 => Msg::Have {
                t: r.t()?,
                tree: r.u8()?,
                bits: r.0,
            },
            4 => Msg::Done {
                id: r.u64()?,
                checksum: r.u64()?,
            },
            5 => Msg::End { id: r.u64()? },
            6 => Msg::Progress {
                id: r.u64()?,
                delivered: r.u32()?,
            },
            7 => Msg::Want {
                t: r.t()?,
                from: r.u32()?,
                bits: r.0,
            },
            8 => {
                let id = r.u64()?;
                if r.0.len() > MAX_REASON {
                    return None;
                }
                Msg::Refused {
                    id,
                    reason: std::str::from_utf8(r.0).ok()?,
                }
            }
            _ => return None,
        };
        Some(m)
    }
}

/// The fuzz body of this decoder (`fuzz/`'s `multicast_wire`, and a short run in the
/// tests): any bytes decode without a panic, and a message that decodes encodes back to
/// itself.
pub fn check_untrusted(data: &[u8]) {
    if let Some(m) = Msg::decode(data) {
        assert_eq!(
            Msg::decode(&m.encode()).as_ref(),
            Some(&m),
            "re-encoded message differs"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_fuzz_run() {
        let t = Transfer {
            id: 7,
            root: Coord::new(1, 2, 3),
            size: 1 << 20,
            chunk: 4096,
            service: 1025,
        };
        let seeds: Vec<Vec<u8>> = [
            Msg::Start { t, member: true },
            Msg::Data {
                t,
                index: 5,
                data: &[7u8; 40],
            },
            Msg::Have {
                t,
                tree: 3,
                bits: &[0xff, 1, 0, 0x80],
            },
            Msg::Done {
                id: 7,
                checksum: 99,
            },
            Msg::End { id: 7 },
            Msg::Progress {
                id: 7,
                delivered: 12,
            },
            Msg::Want {
                t,
                from: 8,
                bits: &[0x0f, 0],
            },
            Msg::Refused {
                id: 7,
                reason: "no application hosts service 1025 here",
            },
        ]
        .iter()
        .map(Msg::encode)
        .collect();
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "multicast_wire", &seeds);
        torusnet_proto::fuzz::run(&seeds, 200_000, 22, check_untrusted);
    }

    #[test]
    fn round_trips_and_refuses_garbage() {
        let t = Transfer {
            id: 7,
            root: Coord::new(1, 2, 3),
            size: 1 << 30,
            chunk: 65536,
            service: 0,
        };
        let all = [
            Msg::Start { t, member: true },
            Msg::Data {
                t,
                index: 5,
                data: b"abc",
            },
            Msg::Have {
                t,
                tree: 3,
                bits: &[0xff, 1],
            },
            Msg::Done {
                id: 7,
                checksum: 99,
            },
            Msg::End { id: 7 },
            Msg::Progress {
                id: 7,
                delivered: 3,
            },
            Msg::Want {
                t,
                from: 2,
                bits: &[1],
            },
            Msg::Refused { id: 7, reason: "x" },
        ];
        for m in &all {
            assert_eq!(Msg::decode(&m.encode()).as_ref(), Some(m));
        }
        assert_eq!(
            Msg::Data {
                t,
                index: 0,
                data: &[]
            }
            .encode()
            .len(),
            DATA_HEADER
        );
        let mut rng = torusnet_proto::rng::SplitMix64::new(9);
        for _ in 0..20_000 {
            let n = rng.below(64) as usize;
            let b: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            let _ = Msg::decode(&b);
        }
        for m in &all {
            let e = m.encode();
            for cut in 0..e.len().min(DATA_HEADER) {
                let short = Msg::decode(&e[..cut]);
                assert!(
                    short.is_none()
                        || matches!(
                            short,
                            Some(
                                Msg::Data { .. }
                                    | Msg::Have { .. }
                                    | Msg::Want { .. }
                                    | Msg::Refused { .. }
                            )
                        ),
                    "{cut}"
                );
            }
        }
    }
}

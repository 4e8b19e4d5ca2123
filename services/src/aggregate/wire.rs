//! Messages of the aggregation service (service 10, reliable, little endian). Lengths are
//! checked; keys are UTF-8 of at most 255 bytes; nothing panics on bytes from the network.

use std::collections::HashMap;

use torusnet_proto::topology::Coord;

use super::WordCount;

/// Key/value records.
pub type Records = HashMap<String, u64>;

/// What a partial result accounts for: the servers whose records it holds, and the link
/// bytes spent (as sent, and as they would have been had every server sent its own records
/// straight to the root).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Servers whose records are in it.
    pub servers: u64,
    /// Bytes times link hops of the partial results that made it.
    pub agg_byte_hops: u64,
    /// Bytes times hops had each server sent its records to the root itself.
    pub raw_byte_hops: u64,
}

/// One message.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// From the root: take part in epoch `epoch` of job `id`.
    Start {
        /// The job.
        id: u64,
        /// Its epoch (a restart after a failure is a new one).
        epoch: u32,
        /// The root.
        root: Coord,
        /// The combiner's name.
        combiner: String,
        /// What every server contributes.
        input: WordCount,
    },
    /// A child's merged records of tree `tree`, for its parent.
    Partial {
        /// The job.
        id: u64,
        /// The epoch.
        epoch: u32,
        /// The tree.
        tree: u8,
        /// What it accounts for.
        tally: Tally,
        /// The records.
        records: Records,
    },
}

/// Encoded bytes of `r` in a `Partial`.
pub fn records_len(r: &Records) -> usize {
    r.keys().map(|k| 1 + k.len().min(255) + 8).sum::<usize>() + 4
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
    fn str(&mut self) -> Option<String> {
        let n = usize::from(self.u8()?);
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

fn put_str(o: &mut Vec<u8>, s: &str) {
    let mut n = s.len().min(255);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    o.push(n as u8);
    o.extend_from_slice(&s.as_bytes()[..n]);
}

impl Msg {
    /// Encoded.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        match self {
            Msg::Start {
                id,
                epoch,
                root,
                combiner,
                input,
            } => {
                o.push(1);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&epoch.to_le_bytes());
                for v in root.to_array() {
                    o.extend_from_slice(&v.to_le_bytes());
                }
                put_str(&mut o, combiner);
                o.extend_from_slice(&input.words.to_le_bytes());
                o.extend_from_slice(&input.vocabulary.to_le_bytes());
                o.extend_from_slice(&input.seed.to_le_bytes());
            }
            Msg::Partial {
                id,
                epoch,
                tree,
                tally,
                records,
            } => {
                o.reserve(40 + records_len(records));
                o.push(2);
                o.extend_from_slice(&id.to_le_bytes());
                o.extend_from_slice(&epoch.to_le_bytes());
                o.push(*tree);
                o.extend_from_slice(&tally.servers.to_le_bytes());
                o.extend_from_slice(&tally.agg_byte_hops.to_le_bytes());
                o.extend_from_slice(&tally.raw_byte_hops.to_le_bytes());
                o.extend_from_slice(&(records.len() as u32).to_le_bytes());
                for (k, v) in records {
                    put_str(&mut o, k);
                    o.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        o
    }

    /// Decoded (`None`: malformed).
    pub fn decode(b: &[u8]) -> Option<Msg> {
        let mut r = R(b);
        match r.u8()? {
            1 => Some(Msg::Start {
                id: r.u64()?,
                epoch: r.u32()?,
                root: Coord::new(r.u16()?, r.u16()?, r.u16()?),
                combiner: r.str()?,
                input: WordCount {
                    words: r.u32()?,
                    vocabulary: r.u32()?,
                    seed: r.u64()?,
                },
            }),
            2 => {
                let id = r.u64()?;
                let epoch = r.u32()?;
                let tree = r.u8()?;
                let tally = Tally {
                    servers: r.u64()?,
                    agg_byte_hops: r.u64()?,
                    raw_byte_hops: r.u64()?,
                };
                let n = r.u32()? as usize;
                // Each record takes at least 9 bytes: a count the bytes cannot hold is a lie.
                if n > r.0.len() / 9 {
                    return None;
                }
                let mut records = Records::with_capacity(n);
                for _ in 0..n {
                    let k = r.str()?;
                    let v = r.u64()?;
                    records.insert(k, v);
                }
                Some(Msg::Partial {
                    id,
                    epoch,
                    tree,
                    tally,
                    records,
                })
            }
            _ => None,
        }
    }
}

/// The fuzz body of this decoder (`fuzz/`'s `aggregation_wire`, and a short run in the
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
        let records: Records = [("alpha", 3u64), ("b", 1), ("", 0), ("word", u64::MAX)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let seeds: Vec<Vec<u8>> = [
            Msg::Start {
                id: 1,
                epoch: 2,
                root: Coord::new(1, 1, 1),
                combiner: "sum".into(),
                input: WordCount {
                    words: 100,
                    vocabulary: 10,
                    seed: 3,
                },
            },
            Msg::Partial {
                id: 1,
                epoch: 2,
                tree: 4,
                tally: Tally {
                    servers: 9,
                    agg_byte_hops: 100,
                    raw_byte_hops: 300,
                },
                records,
            },
        ]
        .iter()
        .map(Msg::encode)
        .collect();
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "aggregation_wire", &seeds);
        torusnet_proto::fuzz::run(&seeds, 200_000, 23, check_untrusted);
    }
}

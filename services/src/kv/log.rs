//! Disk mode: an append-only log of the store's changes (every copy applied, every flush
//! floor), read back at start so a server that restarts holds what it held and only catches
//! up on what changed while it was away (CamCube's reboots that cause no migration).
//!
//! Why a log and not an embedded database: the store already keeps every item in memory (it
//! is a cache-speed store, bounded by `store_bytes`), so the disk only has to survive a
//! restart; appends are sequential and need no index, a torn last record is detected by its
//! length and checksum and ignored, and the log is compacted (one record per key) each time
//! it is read back.
//!
//! Record: `len u32 | fnv u64 | body`, body `1 key_len u8 key copy` or `2 floor u64`. A copy
//! is `0 version origin` (deleted) or `1 version origin flags expiry_us len value`, expiry in
//! wall-clock microseconds (0: never).

use std::collections::HashMap;

use torusnet_proto::time::Time;

use super::store::{Copy, Item};
use crate::builtin::fnv;

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A key's state.
    Copy {
        /// The key.
        key: Vec<u8>,
        /// Its state.
        copy: Copy,
    },
    /// A flush: versions below this are gone.
    Floor(u64),
}

fn wall(t: Time, epoch_us: u64) -> u64 {
    epoch_us.saturating_add(t.as_nanos() / 1000)
}

impl Record {
    /// Encoded, with expiry times made absolute (`epoch_us`: wall-clock microseconds at
    /// `Time::ZERO`).
    pub fn encode(&self, epoch_us: u64) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Record::Copy { key, copy } => {
                b.push(1);
                let n = key.len().min(255);
                b.push(n as u8);
                b.extend_from_slice(&key[..n]);
                match copy {
                    Copy::Deleted { version, origin } => {
                        b.push(0);
                        b.extend_from_slice(&version.to_le_bytes());
                        b.extend_from_slice(&origin.to_le_bytes());
                    }
                    Copy::Item(i) => {
                        b.push(1);
                        b.extend_from_slice(&i.version.to_le_bytes());
                        b.extend_from_slice(&i.origin.to_le_bytes());
                        b.extend_from_slice(&i.flags.to_le_bytes());
                        let e = i.expires.map_or(0, |t| wall(t, epoch_us).max(1));
                        b.extend_from_slice(&e.to_le_bytes());
                        b.extend_from_slice(&(i.value.len() as u32).to_le_bytes());
                        b.extend_from_slice(&i.value);
                    }
                }
            }
            Record::Floor(f) => {
                b.push(2);
                b.extend_from_slice(&f.to_le_bytes());
            }
        }
        let mut out = Vec::with_capacity(b.len() + 12);
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&fnv(&b).to_le_bytes());
        out.extend_from_slice(&b);
        out
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn body(b: &[u8], epoch_us: u64) -> Option<Record> {
    let mut r = Reader(b);
    let rec = match r.take(1)?[0] {
        1 => {
            let n = usize::from(r.take(1)?[0]);
            let key = r.take(n)?.to_vec();
            let copy = match r.take(1)?[0] {
                0 => Copy::Deleted {
                    version: r.u64()?,
                    origin: r.u64()?,
                },
                1 => {
                    let version = r.u64()?;
                    let origin = r.u64()?;
                    let flags = r.u32()?;
                    let e = r.u64()?;
                    let len = r.u32()? as usize;
                    let value = r.take(len)?.to_vec();
                    let expires = (e != 0)
                        .then(|| Time::from_nanos(e.saturating_sub(epoch_us).saturating_mul(1000)));
                    Copy::Item(Item {
                        value,
                        flags,
                        expires,
                        version,
                        origin,
                    })
                }
                _ => return None,
            };
            Record::Copy { key, copy }
        }
        2 => Record::Floor(r.u64()?),
        _ => return None,
    };
    r.0.is_empty().then_some(rec)
}

/// Reads a log back (`epoch_us`: this run's wall-clock microseconds at `Time::ZERO`), up to
/// the first record that is torn or damaged; returns the records and how many bytes were good.
pub fn read(bytes: &[u8], epoch_us: u64) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while bytes.len() - pos >= 12 {
        let h = &bytes[pos..pos + 12];
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let sum = u64::from_le_bytes([h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11]]);
        let Some(b) = bytes.get(pos + 12..pos + 12 + len) else {
            break;
        };
        if fnv(b) != sum {
            break;
        }
        let Some(r) = body(b, epoch_us) else {
            break;
        };
        out.push(r);
        pos += 12 + len;
    }
    (out, pos)
}

/// The same state in fewer records: the newest copy of each key, and the highest floor.
pub fn compact(records: Vec<Record>) -> Vec<Record> {
    let mut floor = 0;
    let mut keys: HashMap<Vec<u8>, Copy> = HashMap::new();
    for r in records {
        match r {
            Record::Floor(f) => floor = floor.max(f),
            Record::Copy { key, copy } => {
                if keys.get(&key).is_none_or(|c| c.version() < copy.version()) {
                    keys.insert(key, copy);
                }
            }
        }
    }
    let mut out: Vec<Record> = Vec::new();
    if floor > 0 {
        out.push(Record::Floor(floor));
    }
    out.extend(
        keys.into_iter()
            .filter(|(_, c)| c.version() >= floor)
            .map(|(key, copy)| Record::Copy { key, copy }),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_is_ignored() {
        let epoch = 1_700_000_000_000_000;
        let item = Item {
            value: b"hello".to_vec(),
            flags: 9,
            expires: Some(Time::from_nanos(5_000_000_000)),
            version: 42,
            origin: 7,
        };
        let recs = vec![
            Record::Copy {
                key: b"a".to_vec(),
                copy: Copy::Item(item.clone()),
            },
            Record::Copy {
                key: b"b".to_vec(),
                copy: Copy::Deleted {
                    version: 3,
                    origin: 1,
                },
            },
            Record::Floor(2),
        ];
        let mut log: Vec<u8> = recs.iter().flat_map(|r| r.encode(epoch)).collect();
        let good = log.len();
        let (back, n) = read(&log, epoch);
        assert_eq!((back, n), (recs.clone(), good));
        // The next run started 2 s later: the item has 3 s left.
        let (later, _) = read(&log, epoch + 2_000_000);
        let Record::Copy {
            copy: Copy::Item(i),
            ..
        } = &later[0]
        else {
            panic!("{later:?}");
        };
        assert_eq!(i.expires, Some(Time::from_nanos(3_000_000_000)));
        log.extend_from_slice(&recs[0].encode(epoch)[..10]);
        assert_eq!(read(&log, epoch).1, good, "torn record");
        let mut bad = log.clone();
        bad[20] ^= 1;
        assert_eq!(
            read(&bad, epoch).0.len(),
            0,
            "damaged record stops the read"
        );
    }

    #[test]
    fn compaction_keeps_the_newest_copy_above_the_floor() {
        let it = |v: u64| {
            Copy::Item(Item {
                version: v,
                ..Item::default()
            })
        };
        let recs = vec![
            Record::Copy {
                key: b"a".to_vec(),
                copy: it(1),
            },
            Record::Copy {
                key: b"a".to_vec(),
                copy: it(5),
            },
            Record::Copy {
                key: b"b".to_vec(),
                copy: it(2),
            },
            Record::Floor(3),
        ];
        let mut c = compact(recs);
        c.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(
            c,
            vec![
                Record::Copy {
                    key: b"a".to_vec(),
                    copy: it(5)
                },
                Record::Floor(3)
            ]
        );
    }
}

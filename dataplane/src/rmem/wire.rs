//! Remote-memory messages between torusds (service 8, reliable), and the records a placer
//! hands its service for what it did with a message straight from its frame. Decoding
//! borrows the payload; every length is checked, nothing panics on bytes from the network.

use torusnet_client::rmem::Status;

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg<'a> {
    /// One frame's worth of a write: `data` at region offset `offset`, which is `pos` bytes
    /// into an operation of `op_len` bytes.
    Write {
        /// The initiator's operation id.
        op: u64,
        /// The capability's cookie.
        cookie: u64,
        /// The region's owner.
        owner: u16,
        /// The region.
        region: u32,
        /// Region offset of these bytes.
        offset: u64,
        /// Where these bytes are in the operation.
        pos: u64,
        /// The whole operation's bytes.
        op_len: u64,
        /// Tell the owner when the whole write has landed.
        notify: bool,
        /// The bytes.
        data: &'a [u8],
    },
    /// Read `len` bytes at region offset `offset`.
    Read {
        /// The initiator's operation id.
        op: u64,
        /// The capability's cookie.
        cookie: u64,
        /// The region's owner.
        owner: u16,
        /// The region.
        region: u32,
        /// Region offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Bytes of a read, `pos` bytes into it.
    ReadData {
        /// The initiator's operation id.
        op: u64,
        /// Where in the read.
        pos: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// Operation `op` ended at the target.
    Result {
        /// The initiator's operation id.
        op: u64,
        /// Whether it succeeded, and if not why.
        status: Status,
        /// Bytes moved.
        bytes: u64,
    },
    /// A placer wrote a `Write` in place (internal, sealed with the process's secret).
    Landed {
        /// The secret.
        secret: u64,
        /// The operation.
        op: u64,
        /// The owner (application) of the region written.
        owner: u16,
        /// The region.
        region: u32,
        /// The byte offset in the region where the write starts.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The operation's length.
        op_len: u64,
        /// Its notify flag.
        notify: bool,
        /// Tripwires touched.
        tripwires: Vec<u64>,
    },
    /// A placer refused a `Write` (internal).
    Refused {
        /// The secret.
        secret: u64,
        /// The operation.
        op: u64,
        /// Why.
        status: Status,
    },
    /// A placer landed `ReadData` (internal): the read now has `got` bytes.
    ReadLanded {
        /// The secret.
        secret: u64,
        /// The operation.
        op: u64,
        /// Bytes landed so far.
        got: u64,
        /// Or why not.
        status: Status,
    },
}

/// Bytes of a `Write` before its data.
pub const WRITE_HEADER: usize = 1 + 8 + 8 + 2 + 4 + 8 + 8 + 8 + 1;
/// Bytes of a `ReadData` before its data.
pub const READ_DATA_HEADER: usize = 1 + 8 + 8;

/// A `ReadData` message of `len` bytes at `pos` of read `op`, its bytes zero: the target
/// reads the region straight into `[READ_DATA_HEADER..]` (no copy of the bytes in between).
pub fn read_data_message(op: u64, pos: u64, len: usize) -> Vec<u8> {
    let mut o = Vec::with_capacity(READ_DATA_HEADER + len);
    o.push(3);
    o.extend_from_slice(&op.to_le_bytes());
    o.extend_from_slice(&pos.to_le_bytes());
    o.resize(READ_DATA_HEADER + len, 0);
    o
}

/// Writes a `Write`'s header into `h` (at least [`WRITE_HEADER`] bytes).
#[allow(clippy::too_many_arguments)]
pub fn put_write_header(
    h: &mut [u8],
    op: u64,
    cookie: u64,
    owner: u16,
    region: u32,
    offset: u64,
    pos: u64,
    op_len: u64,
    notify: bool,
) {
    h[0] = 1;
    h[1..9].copy_from_slice(&op.to_le_bytes());
    h[9..17].copy_from_slice(&cookie.to_le_bytes());
    h[17..19].copy_from_slice(&owner.to_le_bytes());
    h[19..23].copy_from_slice(&region.to_le_bytes());
    h[23..31].copy_from_slice(&offset.to_le_bytes());
    h[31..39].copy_from_slice(&pos.to_le_bytes());
    h[39..47].copy_from_slice(&op_len.to_le_bytes());
    h[47] = u8::from(notify);
}

/// A write's bytes laid out as the messages that will carry them: every `chunk` bytes of
/// data preceded by room for its header. Whoever gathers the bytes (from an application's
/// channel, or an embedding program's slice) writes them here once; the service fills the
/// headers in place and hands each message to the transport from this one buffer.
#[derive(Debug, Default)]
pub struct WriteFrames {
    buf: Vec<u8>,
    chunk: usize,
    len: usize,
}

impl WriteFrames {
    /// Empty, for messages carrying `chunk` bytes of data each.
    pub fn new(chunk: usize) -> WriteFrames {
        WriteFrames {
            buf: Vec::new(),
            chunk: chunk.max(1),
            len: 0,
        }
    }

    /// `data` laid out.
    pub fn from_slice(chunk: usize, data: &[u8]) -> WriteFrames {
        let mut w = WriteFrames::new(chunk);
        w.append(data.len(), |at, out| {
            out.copy_from_slice(&data[at..at + out.len()]);
            true
        });
        w
    }

    /// Appends `n` bytes of data, which `fill(at, out)` copies in piece by piece (`at`:
    /// where `out` starts among the `n`); false (nothing kept) when a fill fails.
    pub fn append(&mut self, n: usize, mut fill: impl FnMut(usize, &mut [u8]) -> bool) -> bool {
        let (keep_buf, keep_len) = (self.buf.len(), self.len);
        self.buf.reserve(n + (n / self.chunk + 1) * WRITE_HEADER);
        let mut done = 0;
        while done < n {
            let in_chunk = self.len % self.chunk;
            if in_chunk == 0 {
                self.buf.resize(self.buf.len() + WRITE_HEADER, 0);
            }
            let k = (self.chunk - in_chunk).min(n - done);
            let at = self.buf.len();
            self.buf.resize(at + k, 0);
            if !fill(done, &mut self.buf[at..]) {
                self.buf.truncate(keep_buf);
                self.len = keep_len;
                return false;
            }
            done += k;
            self.len += k;
        }
        true
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Messages it makes (at least one: an empty write is one empty message).
    pub fn messages(&self) -> usize {
        self.len.div_ceil(self.chunk).max(1)
    }

    /// Fills every message's header (`pos` and `offset` per message) and returns the buffer
    /// with each message's range in it.
    #[allow(clippy::too_many_arguments)]
    pub fn seal(
        mut self,
        op: u64,
        cookie: u64,
        owner: u16,
        region: u32,
        base: u64,
        notify: bool,
    ) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
        if self.buf.is_empty() {
            self.buf.resize(WRITE_HEADER, 0);
        }
        let op_len = self.len as u64;
        let mut ranges = Vec::with_capacity(self.messages());
        let mut start = 0;
        let mut pos = 0usize;
        while start < self.buf.len() {
            let n = self.chunk.min(self.len - pos);
            let end = start + WRITE_HEADER + n;
            put_write_header(
                &mut self.buf[start..],
                op,
                cookie,
                owner,
                region,
                base + pos as u64,
                pos as u64,
                op_len,
                notify,
            );
            ranges.push(start..end);
            pos += n;
            start = end;
        }
        (self.buf, ranges)
    }
}

struct R<'a>(&'a [u8]);

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
}

impl Msg<'_> {
    /// Encoded.
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        let p64 = |o: &mut Vec<u8>, v: u64| o.extend_from_slice(&v.to_le_bytes());
        match self {
            Msg::Write {
                op,
                cookie,
                owner,
                region,
                offset,
                pos,
                op_len,
                notify,
                data,
            } => {
                o.resize(WRITE_HEADER, 0);
                put_write_header(
                    &mut o, *op, *cookie, *owner, *region, *offset, *pos, *op_len, *notify,
                );
                o.extend_from_slice(data);
            }
            Msg::Read {
                op,
                cookie,
                owner,
                region,
                offset,
                len,
            } => {
                o.push(2);
                p64(&mut o, *op);
                p64(&mut o, *cookie);
                o.extend_from_slice(&owner.to_le_bytes());
                o.extend_from_slice(&region.to_le_bytes());
                p64(&mut o, *offset);
                p64(&mut o, *len);
            }
            Msg::ReadData { op, pos, data } => {
                o.reserve(READ_DATA_HEADER + data.len());
                o.push(3);
                p64(&mut o, *op);
                p64(&mut o, *pos);
                o.extend_from_slice(data);
            }
            Msg::Result { op, status, bytes } => {
                o.push(4);
                p64(&mut o, *op);
                o.push(*status as u8);
                p64(&mut o, *bytes);
            }
            Msg::Landed {
                secret,
                op,
                owner,
                region,
                offset,
                len,
                op_len,
                notify,
                tripwires,
            } => {
                o.push(0x81);
                p64(&mut o, *secret);
                p64(&mut o, *op);
                o.extend_from_slice(&owner.to_le_bytes());
                o.extend_from_slice(&region.to_le_bytes());
                p64(&mut o, *offset);
                p64(&mut o, *len);
                p64(&mut o, *op_len);
                o.push(u8::from(*notify));
                o.extend_from_slice(&(tripwires.len() as u32).to_le_bytes());
                for t in tripwires {
                    p64(&mut o, *t);
                }
            }
            Msg::Refused { secret, op, status } => {
                o.push(0x82);
                p64(&mut o, *secret);
                p64(&mut o, *op);
                o.push(*status as u8);
            }
            Msg::ReadLanded {
                secret,
                op,
                got,
                status,
            } => {
                o.push(0x83);
                p64(&mut o, *secret);
                p64(&mut o, *op);
                p64(&mut o, *got);
                o.push(*status as u8);
            }
        }
        o
    }

    /// Decodes (`None`: malformed).
    pub fn decode(b: &[u8]) -> Option<Msg<'_>> {
        let mut r = R(b);
        let m = match r.u8()? {
            1 => Msg::Write {
                op: r.u64()?,
                cookie: r.u64()?,
                owner: r.u16()?,
                region: r.u32()?,
                offset: r.u64()?,
                pos: r.u64()?,
                op_len: r.u64()?,
                notify: r.u8()? != 0,
                data: std::mem::take(&mut r.0),
            },
            2 => Msg::Read {
                op: r.u64()?,
                cookie: r.u64()?,
                owner: r.u16()?,
                region: r.u32()?,
                offset: r.u64()?,
                len: r.u64()?,
            },
            3 => Msg::ReadData {
                op: r.u64()?,
                pos: r.u64()?,
                data: std::mem::take(&mut r.0),
            },
            4 => Msg::Result {
                op: r.u64()?,
                status: Status::from_code(r.u8()?),
                bytes: r.u64()?,
            },
            0x81 => {
                let secret = r.u64()?;
                let op = r.u64()?;
                let owner = r.u16()?;
                let region = r.u32()?;
                let offset = r.u64()?;
                let len = r.u64()?;
                let op_len = r.u64()?;
                let notify = r.u8()? != 0;
                let n = r.u32()? as usize;
                if n > 4096 {
                    return None;
                }
                let mut tripwires = Vec::with_capacity(n);
                for _ in 0..n {
                    tripwires.push(r.u64()?);
                }
                Msg::Landed {
                    secret,
                    op,
                    owner,
                    region,
                    offset,
                    len,
                    op_len,
                    notify,
                    tripwires,
                }
            }
            0x82 => Msg::Refused {
                secret: r.u64()?,
                op: r.u64()?,
                status: Status::from_code(r.u8()?),
            },
            0x83 => Msg::ReadLanded {
                secret: r.u64()?,
                op: r.u64()?,
                got: r.u64()?,
                status: Status::from_code(r.u8()?),
            },
            _ => return None,
        };
        r.0.is_empty().then_some(m)
    }
}

/// The fuzz body of this decoder (`fuzz/`'s `rmem_wire`, and a short run in the tests): any
/// bytes decode without a panic, and a message that decodes encodes back to itself.
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
        let seeds: Vec<Vec<u8>> = samples().iter().map(Msg::encode).collect();
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "rmem_wire", &seeds);
        torusnet_proto::fuzz::run(&seeds, 200_000, 27, check_untrusted);
    }

    /// One message of every kind.
    fn samples() -> Vec<Msg<'static>> {
        vec![
            Msg::Write {
                op: 1,
                cookie: 2,
                owner: 3,
                region: 4,
                offset: 5,
                pos: 6,
                op_len: 7,
                notify: true,
                data: b"abc",
            },
            Msg::Read {
                op: 1,
                cookie: 2,
                owner: 3,
                region: 4,
                offset: 5,
                len: 6,
            },
            Msg::ReadData {
                op: 9,
                pos: 8,
                data: b"",
            },
            Msg::Result {
                op: 1,
                status: Status::Revoked,
                bytes: 0,
            },
            Msg::Landed {
                secret: 7,
                op: 1,
                owner: 2,
                region: 3,
                offset: 4,
                len: 5,
                op_len: 6,
                notify: false,
                tripwires: vec![1, 2],
            },
            Msg::Refused {
                secret: 7,
                op: 1,
                status: Status::NoRight,
            },
            Msg::ReadLanded {
                secret: 7,
                op: 1,
                got: 4,
                status: Status::Ok,
            },
        ]
    }

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        for m in samples() {
            let b = m.encode();
            assert_eq!(Msg::decode(&b), Some(m.clone()));
            for cut in 0..b.len() {
                let d = Msg::decode(&b[..cut]);
                // Variable-length tails (write and read data) may decode shorter.
                if let Some(x) = d {
                    assert!(matches!(x, Msg::Write { .. } | Msg::ReadData { .. }));
                }
            }
        }
        assert_eq!(WRITE_HEADER, 48);
        // Laid out in place, a write's messages are what encoding each chunk gives.
        for (n, chunk) in [
            (0usize, 100usize),
            (1, 100),
            (100, 100),
            (101, 100),
            (1000, 64),
        ] {
            let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let mut w = WriteFrames::new(chunk);
            // In uneven pieces, as a channel's entries bring them.
            let mut at = 0;
            for piece in [7usize, 1, 33, 2000] {
                let k = piece.min(n - at);
                assert!(w.append(k, |o, out| {
                    out.copy_from_slice(&data[at + o..at + o + out.len()]);
                    true
                }));
                at += k;
            }
            assert!(!w.append(5, |_, _| false), "a failed fill keeps nothing");
            assert_eq!(w.len(), n);
            let (buf, ranges) = w.seal(9, 8, 7, 6, 1000, true);
            let pieces: Vec<&[u8]> = if n == 0 {
                vec![&data[..]]
            } else {
                data.chunks(chunk).collect()
            };
            assert_eq!(ranges.len(), pieces.len());
            for (k, (r, d)) in ranges.iter().zip(pieces).enumerate() {
                let want = Msg::Write {
                    op: 9,
                    cookie: 8,
                    owner: 7,
                    region: 6,
                    offset: 1000 + (k * chunk) as u64,
                    pos: (k * chunk) as u64,
                    op_len: n as u64,
                    notify: true,
                    data: d,
                }
                .encode();
                assert_eq!(&buf[r.clone()], &want[..], "message {k} of {n}/{chunk}");
            }
        }
        let mut rng = torusnet_proto::rng::SplitMix64::new(3);
        for _ in 0..20_000 {
            let mut b = vec![0u8; rng.below(80) as usize];
            rng.fill(&mut b);
            let _ = Msg::decode(&b);
        }
    }
}

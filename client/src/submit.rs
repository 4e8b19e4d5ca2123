//! Submission: destinations checked and resolved, entries and their bytes written to the
//! submission queue and the TX data ring, torusd woken when it sleeps.

use crate::*;

/// Send-side state (the SQ and the TX data ring).
#[derive(Debug)]
pub(crate) struct Tx {
    sq_tail: u32,
    txd_tail: u64,
    next_tag: u64,
    /// torusd's SQ head and TX data head as last read: re-read only when the ring looks
    /// full, so a send does not touch torusd's cache lines.
    sq_head: u32,
    txd_head: u64,
}

impl Tx {
    /// Empty rings; tags start at 1.
    pub(crate) fn new() -> Tx {
        Tx {
            sq_tail: 0,
            txd_tail: 0,
            next_tag: 1,
            sq_head: 0,
            txd_head: 0,
        }
    }

    /// Writes `e`, an entry with no bytes in the TX data ring, as the next SQ entry and
    /// publishes it; `false`, with nothing written, when the SQ is full.
    pub(crate) fn push_bare(&mut self, r: &Region, e: &Sqe) -> bool {
        if self.sq_tail.wrapping_sub(self.sq_head) >= r.geometry().sq_entries {
            self.sq_head = r.u32(off::SQ_HEAD).load(Ordering::Acquire);
            if self.sq_tail.wrapping_sub(self.sq_head) >= r.geometry().sq_entries {
                return false;
            }
        }
        r.write_sqe(self.sq_tail, e);
        self.sq_tail = self.sq_tail.wrapping_add(1);
        r.u32(off::SQ_TAIL).store(self.sq_tail, Ordering::Release);
        true
    }
}

impl Client {
    pub(crate) fn target(&self, to: &Dest) -> Result<(u8, u64, u16), Error> {
        if let Dest::Service(a) = to {
            let (x, y, z) = a.server;
            if x >= self.dims.0 || y >= self.dims.1 || z >= self.dims.2 {
                return Err(Error::Refused(format!(
                    "server {:?} is outside the {}x{}x{} torus",
                    a.server, self.dims.0, self.dims.1, self.dims.2
                )));
            }
        }
        Ok(match to {
            Dest::Service(a) => (
                dest::SERVER,
                pack_coord(a.server.0, a.server.1, a.server.2),
                a.service,
            ),
            Dest::Key { key, service } => (dest::KEY, *key, *service),
            Dest::Name(n) => {
                let cached = self.names.lock().get(n).and_then(|v| v.first().copied());
                let a = match cached {
                    Some(a) => a,
                    None => *self
                        .resolve(n, Duration::from_secs(2))?
                        .first()
                        .ok_or_else(|| Error::NotFound(n.clone()))?,
                };
                (
                    dest::SERVER,
                    pack_coord(a.server.0, a.server.1, a.server.2),
                    a.service,
                )
            }
        })
    }

    /// Sends a message; returns its tag. `WouldBlock` when the channel is full (receive,
    /// then try again). A message larger than half the TX data ring goes in segments.
    pub fn send(&self, to: Dest, data: &[u8], opts: SendOptions) -> Result<u64, Error> {
        self.submit(to, data, opts, kind::DATA, None)
    }

    /// Sends a message into a return buffer another application posted (its descriptor
    /// came in a message). If the buffer is gone when the message arrives, the message is
    /// not delivered and this application gets [`Event::BufferMissed`].
    pub fn send_to_buffer(
        &self,
        buf: &ReturnBuffer,
        data: &[u8],
        opts: SendOptions,
    ) -> Result<u64, Error> {
        if data.len() > buf.len as usize {
            return Err(Error::TooLarge(data.len()));
        }
        let to = Dest::Service(buf.owner);
        self.submit(
            to,
            data,
            SendOptions {
                reliable: true,
                ..opts
            },
            kind::DATA,
            Some((buf.id, buf.cookie)),
        )
    }

    pub(crate) fn submit(
        &self,
        to: Dest,
        data: &[u8],
        opts: SendOptions,
        app_kind: u8,
        into: Option<(u32, u64)>,
    ) -> Result<u64, Error> {
        let (dest_kind, dest, service) = self.target(&to)?;
        if let Some(f) = opts.from {
            if f != self.service && !self.added.lock().contains(&f) {
                return Err(Error::Refused(format!(
                    "service {f} is not one of this application's names"
                )));
            }
        }
        if data.len() > u32::MAX as usize {
            return Err(Error::TooLarge(data.len()));
        }
        let mut flags = 0u8;
        if opts.reliable {
            flags |= sflag::RELIABLE;
        }
        if opts.backward_fence {
            flags |= sflag::BWD_FENCE;
        }
        if opts.forward_fence {
            flags |= sflag::FWD_FENCE;
        }
        if into.is_some() {
            flags |= sflag::INTO_BUFFER;
        }
        if opts.on_path {
            flags |= sflag::ON_PATH;
        }
        let tag = self.next_tag(opts.tag);
        let mut e = Sqe {
            op: op::SEND,
            flags,
            dest_kind,
            kind: app_kind,
            service,
            tag,
            dest,
            total_len: data.len() as u32,
            src_service: opts.from.unwrap_or(0),
            ..Sqe::default()
        };
        if let Some((id, cookie)) = into {
            e.buf_id = id;
            e.aux = cookie;
        }
        self.submit_entry(e, data)?;
        Ok(tag)
    }

    /// Its verdict on frame `id` it was shown ([`Event::Intercepted`]): the frame goes on
    /// (as it was, or with a new payload) or is dropped. To answer it instead, send the
    /// answer and drop the frame. A verdict after the frame's deadline has no effect (it
    /// went on as it was).
    pub fn verdict(&self, id: u64, v: OnPath<'_>) -> Result<(), Error> {
        let (kind, data) = match v {
            OnPath::Pass => (channel::verdict::PASS, &[][..]),
            OnPath::Change(d) => (channel::verdict::CHANGE, d),
            OnPath::Drop => (channel::verdict::DROP, &[][..]),
        };
        if data.len() > 65536 {
            return Err(Error::TooLarge(data.len()));
        }
        let e = Sqe {
            op: op::VERDICT,
            kind,
            tag: id,
            total_len: data.len() as u32,
            ..Sqe::default()
        };
        self.submit_entry(e, data)
    }

    /// A tag for a submission: `want`, or the next unused one.
    pub(crate) fn next_tag(&self, want: Option<u64>) -> u64 {
        let mut tx = self.tx.lock();
        let tag = want.unwrap_or(tx.next_tag);
        tx.next_tag = tx.next_tag.max(tag) + 1;
        tag
    }

    /// Submits `template` with `data` in the TX data ring, in segments (MORE) when it is
    /// larger than half the ring.
    pub(crate) fn submit_entry(&self, template: Sqe, data: &[u8]) -> Result<(), Error> {
        let r = &self.region;
        let (_, txd_size) = r.txd();
        let seg = (txd_size / 2) as usize;
        let mut tx = self.tx.lock();
        let flags = template.flags;
        let nseg = data.len().div_ceil(seg).max(1);
        let entries = r.geometry().sq_entries;
        for i in 0..nseg {
            let part = &data[(i * seg).min(data.len())..((i + 1) * seg).min(data.len())];
            let last = i + 1 == nseg;
            // Space in both rings; the first segment refuses at once, later ones wait for
            // torusd to make room (the message is already half submitted).
            let mut deadline = None;
            let mut fresh = false;
            let (pos, new_tail) = loop {
                let sq_room = tx.sq_tail.wrapping_sub(tx.sq_head) < entries;
                let alloc = byte_ring_alloc(tx.txd_head, tx.txd_tail, txd_size, part.len() as u64);
                if let (true, Some(a)) = (sq_room, alloc) {
                    break a;
                }
                if !fresh {
                    tx.sq_head = r.u32(off::SQ_HEAD).load(Ordering::Acquire);
                    tx.txd_head = r.u64(off::TXD_HEAD).load(Ordering::Acquire);
                    fresh = true;
                    continue;
                }
                fresh = false;
                if i == 0 {
                    return Err(Error::WouldBlock);
                }
                let d = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(10));
                if Instant::now() > d {
                    return Err(Error::Timeout);
                }
                self.kick();
                std::thread::yield_now();
            };
            r.copy_in(r.txd(), pos % txd_size, part);
            let e = Sqe {
                flags: if last { flags } else { flags | sflag::MORE },
                data_pos: pos,
                data_len: part.len() as u32,
                ..template
            };
            r.write_sqe(tx.sq_tail, &e);
            tx.sq_tail = tx.sq_tail.wrapping_add(1);
            tx.txd_tail = new_tail;
            r.u32(off::SQ_TAIL).store(tx.sq_tail, Ordering::Release);
        }
        drop(tx);
        self.kick();
        Ok(())
    }

    /// Wakes torusd's poller if it sleeps (a syscall only then).
    pub(crate) fn kick(&self) {
        fence(Ordering::SeqCst);
        if self.region.u32(off::TORUSD_WAITING).load(Ordering::SeqCst) != 0 {
            sys::signal(self.torusd_efd.as_raw_fd());
        }
    }
}

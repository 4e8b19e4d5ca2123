//! Remote-memory submissions of attached applications, and their completions: the host's
//! side of `crate::rmem`. Regions are parts of an application's pool; registering,
//! narrowing, revoking and tripwires are answered at once from the table; writes and reads
//! go to the remote-memory service, whose completions come back as channel events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_client::channel::{sflag, Cqe, Sqe};
use torusnet_client::rmem::{self, cq as rcq, op as rop, Capability, Status};
use torusnet_proto::transport::Fences;

use super::host::{pack, AppsHost};
use crate::rmem::memory::{Memory, PoolMemory};
use crate::rmem::table::Tripwire;
use crate::rmem::wire::WriteFrames;
use crate::rmem::{RmCommand, RmEvent};

/// A submission whose data arrives over several channel entries.
#[derive(Debug)]
pub struct Gathering {
    first: Sqe,
    /// The capability and, but for a write, the rest of the data.
    head: Vec<u8>,
    /// A write's bytes, laid out as its messages.
    frames: Option<WriteFrames>,
}

/// Whether `op` is a remote-memory submission.
pub fn is_rmem_op(op: u8) -> bool {
    (rop::REGISTER..=rop::DISARM).contains(&op)
}

fn fences(flags: u8) -> Fences {
    Fences {
        backward: flags & sflag::BWD_FENCE != 0,
        forward: flags & sflag::FWD_FENCE != 0,
    }
}

impl AppsHost {
    fn rm_cap(&mut self, i: usize, tag: u64, r: Result<Capability, Status>) {
        let (status, data) = match r {
            Ok(c) => (Status::Ok, c.encode().to_vec()),
            Err(s) => (s, Vec::new()),
        };
        let e = Cqe {
            kind: rcq::RM_CAP,
            reason: status as u8,
            tag,
            ..Cqe::default()
        };
        self.enqueue(i, e, &data);
    }

    fn rm_done(&mut self, i: usize, tag: u64, status: Status, bytes: u64) {
        let e = Cqe {
            kind: rcq::RM_DONE,
            reason: status as u8,
            tag,
            count: bytes,
            ..Cqe::default()
        };
        self.enqueue(i, e, &[]);
    }

    /// A remote-memory submission of application `i`.
    pub(super) fn rm_submission(&mut self, i: usize, e: &Sqe) {
        let Some(rm) = self.shared.rmem.get().cloned() else {
            return self.rm_done(i, e.tag, Status::Invalid, 0);
        };
        let owner = self.apps[i].info.service;
        match e.op {
            rop::REGISTER => {
                let (pool_off, pool_size) = self.apps[i].region.pool();
                let fits = e
                    .aux
                    .checked_add(e.aux2)
                    .is_some_and(|end| end <= pool_size);
                let mem = fits
                    .then(|| PoolMemory::new(self.apps[i].map.clone(), pool_off + e.aux, e.aux2))
                    .flatten();
                let r = match mem {
                    Some(m) if e.aux2 > 0 => {
                        let m: Arc<dyn Memory> = Arc::new(m);
                        rm.table.lock().register(owner, e.buf_id, m, e.kind)
                    }
                    _ => Err(Status::OutOfRange),
                };
                self.rm_cap(i, u64::from(e.buf_id), r);
            }
            rop::DEREGISTER => {
                let ok = rm.table.lock().deregister(owner, e.buf_id);
                let s = if ok { Status::Ok } else { Status::NoRegion };
                self.rm_done(i, e.tag, s, 0);
            }
            rop::ARM => {
                let t = Tripwire {
                    id: e.tag,
                    offset: e.aux,
                    len: e.aux2,
                };
                let s = rm.table.lock().arm(owner, e.buf_id, t);
                self.rm_done(i, e.tag, s, 0);
            }
            rop::DISARM => {
                rm.table.lock().disarm(owner, e.buf_id, e.tag);
                self.rm_done(i, e.tag, Status::Ok, 0);
            }
            _ => {
                let Some(g) = self.rm_gather(i, e, rm.chunk) else {
                    return;
                };
                let (first, data) = (g.first, g.head);
                let Some(cap) = Capability::decode(&data) else {
                    return self.rm_done(i, first.tag, Status::Invalid, 0);
                };
                match first.op {
                    rop::NARROW => {
                        let ttl = (first.total_len > 0)
                            .then(|| Duration::from_secs(u64::from(first.total_len)));
                        let r = rm.table.lock().narrow(
                            owner,
                            &cap,
                            first.aux,
                            first.aux2,
                            first.kind,
                            ttl,
                            Instant::now(),
                        );
                        self.rm_cap(i, first.tag, r);
                    }
                    rop::REVOKE => {
                        let s = rm.table.lock().revoke(owner, cap.cookie);
                        self.rm_done(i, first.tag, s, 0);
                    }
                    rop::WRITE => rm.submit(RmCommand::Write {
                        owner,
                        tag: first.tag,
                        cap,
                        offset: first.aux,
                        frames: g.frames.unwrap_or_default(),
                        notify: first.flags & rmem::flag::NOTIFY != 0,
                        fences: fences(first.flags),
                    }),
                    rop::READ => rm.submit(RmCommand::Read {
                        owner,
                        tag: first.tag,
                        cap,
                        offset: first.aux,
                        len: first.aux2,
                        region: first.buf_id,
                        local_offset: first.dest,
                        fences: fences(first.flags),
                    }),
                    _ => self.rm_done(i, first.tag, Status::Invalid, 0),
                }
            }
        }
    }

    /// Collects the data of a submission that carries some (several entries with MORE).
    fn rm_gather(&mut self, i: usize, e: &Sqe, chunk: usize) -> Option<Gathering> {
        let a = &mut self.apps[i];
        let r = a.region;
        let (_, txd_size) = r.txd();
        let len = e.data_len as usize;
        let mut g = a.rm_assembling.take().unwrap_or_else(|| Gathering {
            first: *e,
            head: Vec::new(),
            frames: (e.op == rop::WRITE).then(|| WriteFrames::new(chunk)),
        });
        let have = g.head.len() + g.frames.as_ref().map_or(0, WriteFrames::len);
        if len as u64 > txd_size || have + len > crate::rmem::MAX_READ as usize + rmem::CAP_LEN {
            a.info.counters.bad.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let at = e.data_pos % txd_size;
        // The capability (and a small submission's body) into `head`; a write's bytes
        // straight into the layout of the messages that carry them.
        let to_head = match g.frames {
            Some(_) => len.min(rmem::CAP_LEN.saturating_sub(g.head.len())),
            None => len,
        };
        let h = g.head.len();
        g.head.resize(h + to_head, 0);
        let mut ok = r.copy_out(r.txd(), at, &mut g.head[h..]);
        if let Some(f) = g.frames.as_mut() {
            let rest = len - to_head;
            let from = at + to_head as u64;
            ok = ok && f.append(rest, |o, out| r.copy_out(r.txd(), from + o as u64, out));
        }
        if !ok {
            a.info.counters.bad.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        a.txd_done = a.txd_done.max(e.data_pos.saturating_add(len as u64));
        if e.flags & sflag::MORE != 0 {
            a.rm_assembling = Some(g);
            return None;
        }
        Some(g)
    }

    /// Hands remote-memory events to their applications.
    pub(super) fn rm_events(&mut self) -> usize {
        let Some(rm) = self.shared.rmem.get().cloned() else {
            return 0;
        };
        if !rm.pending.load(Ordering::Acquire) {
            return 0;
        }
        let mut n = 0;
        for i in 0..self.apps.len() {
            for ev in rm.take_events(self.apps[i].info.service) {
                let e = match ev {
                    RmEvent::Done { tag, status, bytes } => Cqe {
                        kind: rcq::RM_DONE,
                        reason: status as u8,
                        tag,
                        count: bytes,
                        ..Cqe::default()
                    },
                    RmEvent::Tripwire {
                        id,
                        region,
                        offset,
                        len,
                        src,
                    } => Cqe {
                        kind: rcq::RM_TRIPWIRE,
                        tag: id,
                        extra: u64::from(region),
                        count: offset,
                        total_len: len as u32,
                        peer: pack(src),
                        ..Cqe::default()
                    },
                    RmEvent::Written {
                        region,
                        offset,
                        len,
                        src,
                    } => Cqe {
                        kind: rcq::RM_WRITTEN,
                        extra: u64::from(region),
                        count: offset,
                        total_len: len as u32,
                        peer: pack(src),
                        ..Cqe::default()
                    },
                };
                self.enqueue(i, e, &[]);
                n += 1;
            }
        }
        n
    }
}

//! Multicast for applications: the host's side of `torusnet_client`'s multicast.
//!
//! - A sender's submission (`op::MULTICAST`) becomes a request to the multicast service
//!   whose source is the part of the application's pool it named (kept mapped for as long as
//!   the transfer lasts, even if the application exits); the root's report comes back as the
//!   application's `MCAST_REPORT` event.
//! - On a member, the multicast service delivers into [`AppSinks`]: each transfer's bytes go
//!   in order into a bounded inbox per service (`crate::shared::McastInbox`), which the host
//!   empties into the application's channel when it has room, so a slow application slows
//!   its transfer (its progress reports hold the root back) instead of filling torusd.

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use torusnet_client::channel::{cq, unpack_coord, Cqe, Sqe};
use torusnet_proto::topology::Coord;
use torusnet_services::multicast::wire::Transfer;
use torusnet_services::multicast::{MulticastRequest, Sink, Sinks, Source, MCAST};

use super::host::{bump, pack, AppsHost};
use crate::rmem::memory::{Memory, PoolMemory};
use crate::shared::{Command, Delivery, Flushed, Shared};

/// Multicasts one application may have running at once.
const MAX_RUNNING: usize = 64;

/// The multicast service's way to this server's applications.
#[derive(Debug)]
pub struct AppSinks {
    shared: Arc<Shared>,
}

impl AppSinks {
    /// Sinks delivering to the applications attached to this torusd.
    pub fn new(shared: Arc<Shared>) -> AppSinks {
        AppSinks { shared }
    }
}

impl Sinks for AppSinks {
    fn open(&mut self, t: &Transfer) -> Result<Box<dyn Sink>, String> {
        // Ids below 1024 are torusd's own services, which take no multicast.
        if t.service < 1024 || !self.shared.hosted.hosts(t.service) {
            return Err(format!(
                "no application on this server hosts service {}",
                t.service
            ));
        }
        Ok(Box::new(AppSink {
            shared: self.shared.clone(),
        }))
    }
}

#[derive(Debug)]
struct AppSink {
    shared: Arc<Shared>,
}

impl Sink for AppSink {
    fn deliver(&mut self, t: &Transfer, offset: u64, data: &[u8]) -> Result<bool, String> {
        self.present(t)?;
        Ok(self.shared.apps.multicast.offer(t, offset, data))
    }

    fn end(&mut self, t: &Transfer, complete: bool) {
        self.shared.apps.multicast.end(t, complete);
    }

    fn flushed(&mut self, t: &Transfer) -> Result<bool, String> {
        // Everything in its channel, the end too: complete, even if it left since (a
        // receiver may detach as soon as it has read the end).
        match self.shared.apps.multicast.flushed(t.service, t.id) {
            Flushed::All => Ok(true),
            Flushed::Waiting => self.present(t).map(|()| false),
            Flushed::Dropped => Err(format!(
                "the application of service {} left before it had every byte",
                t.service
            )),
        }
    }
}

impl AppSink {
    /// Whether an application still hosts the transfer's service here.
    fn present(&self, t: &Transfer) -> Result<(), String> {
        if self.shared.hosted.hosts(t.service) {
            Ok(())
        } else {
            Err(format!(
                "the application of service {} left before it had every byte",
                t.service
            ))
        }
    }
}

/// A sender's bytes: part of its pool.
struct PoolSource(PoolMemory);

impl std::fmt::Debug for PoolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PoolSource({} bytes)", self.0.len())
    }
}

impl Source for PoolSource {
    fn len(&self) -> u64 {
        Memory::len(&self.0)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        Memory::read(&self.0, offset, out)
    }
}

/// A sender's multicast in flight: whose, its tag, where its report comes.
#[derive(Debug)]
pub(super) struct Running {
    service: u16,
    tag: u64,
    report: Receiver<Value>,
}

impl AppsHost {
    fn mcast_report(&mut self, i: usize, tag: u64, v: &Value) {
        let ok = v.get("error").is_none()
            && v["completed"].as_u64() == v["members"].as_u64()
            && v["checksum_mismatch"].as_array().is_some_and(Vec::is_empty);
        let e = Cqe {
            kind: cq::MCAST_REPORT,
            reason: u8::from(!ok),
            tag,
            ..Cqe::default()
        };
        let data = serde_json::to_vec(v).unwrap_or_default();
        self.enqueue(i, e, &data);
    }

    /// Application `i` asks to multicast part of its pool (`op::MULTICAST`).
    pub(super) fn mcast_submission(&mut self, i: usize, e: &Sqe) {
        let refuse = |h: &mut AppsHost, why: String| {
            h.count_bad(i);
            let v = serde_json::json!({ "error": why });
            h.mcast_report(i, e.tag, &v);
        };
        let r = self.apps[i].region;
        let (_, txd_size) = r.txd();
        // The length is the application's: bounded before anything is allocated for it.
        let fits = u64::from(e.data_len) <= txd_size.min(8 << 16);
        let mut members = vec![0u8; if fits { e.data_len as usize } else { 0 }];
        let read =
            e.data_len == 0 || (fits && r.copy_out(r.txd(), e.data_pos % txd_size, &mut members));
        let a = &mut self.apps[i];
        a.txd_done = a
            .txd_done
            .max(e.data_pos.saturating_add(u64::from(e.data_len)));
        if !read || !members.len().is_multiple_of(8) {
            return refuse(self, "multicast: the member list is unreadable".into());
        }
        if self
            .running
            .iter()
            .filter(|m| m.service == a.info.service)
            .count()
            >= MAX_RUNNING
        {
            return refuse(
                self,
                format!("multicast: {MAX_RUNNING} of this application's are running already"),
            );
        }
        let dims = self.shared.dims;
        let group: Option<Vec<Coord>> = (!members.is_empty()).then(|| {
            members
                .chunks_exact(8)
                .map(|b| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(b);
                    let (x, y, z) = unpack_coord(u64::from_le_bytes(w));
                    Coord::new(x, y, z)
                })
                .collect()
        });
        if let Some(bad) = group.iter().flatten().find(|c| !dims.contains(**c)) {
            return refuse(self, format!("multicast: {bad} is not in the torus"));
        }
        let (pool_off, pool_size) = r.pool();
        let fits = e
            .aux
            .checked_add(e.aux2)
            .is_some_and(|end| end <= pool_size);
        let source = fits
            .then(|| PoolMemory::new(self.apps[i].map.clone(), pool_off + e.aux, e.aux2))
            .flatten();
        let Some(source) = source.filter(|_| e.aux2 > 0) else {
            return refuse(
                self,
                format!(
                    "multicast: {} bytes at {} are not inside the pool ({pool_size} bytes)",
                    e.aux2, e.aux
                ),
            );
        };
        let (tx, rx) = channel();
        let req = MulticastRequest {
            group,
            service: e.service,
            data: Arc::new(PoolSource(source)),
            chunk: if e.buf_id == 0 {
                torusnet_services::multicast::DEFAULT_CHUNK
            } else {
                e.buf_id
            },
            timeout: Duration::from_secs(u64::from(e.total_len.max(1))),
            reply: tx,
        };
        let c = Command::Request {
            service: MCAST,
            request: Box::new(req),
        };
        if self.shared.push_to(0, c).is_err() {
            return refuse(self, "multicast: torusd is busy: try again".into());
        }
        let service = self.apps[i].info.service;
        self.running.push(Running {
            service,
            tag: e.tag,
            report: rx,
        });
    }

    /// Reports of ended multicasts to their senders; what members' sinks delivered, into
    /// their applications' channels while they have room.
    pub(super) fn mcast_events(&mut self) -> usize {
        let mut n = 0;
        let mut k = 0;
        while k < self.running.len() {
            match self.running[k].report.try_recv() {
                Ok(v) => {
                    let m = self.running.swap_remove(k);
                    if let Some(i) = self.owner_of(m.service) {
                        self.mcast_report(i, m.tag, &v);
                    }
                    n += 1;
                }
                // The service's reply channel is gone (torusd stops): nothing will come.
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.running.swap_remove(k);
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => k += 1,
            }
        }
        let inbox = self.shared.apps.multicast.clone();
        n += inbox.drain(|id, d| {
            let i = self.owner_of(id)?;
            let a = &mut self.apps[i];
            // Events queued before these go first.
            if !a.backlog.is_empty() {
                return Some(false);
            }
            let (e, data): (Cqe, &[u8]) = match d {
                Delivery::Data { t, offset, data } => (
                    Cqe {
                        kind: cq::MCAST_DATA,
                        dst_service: t.service,
                        peer: pack(t.root),
                        tag: t.id,
                        extra: *offset,
                        extra2: t.size,
                        ..Cqe::default()
                    },
                    data,
                ),
                Delivery::End { t, complete } => (
                    Cqe {
                        kind: cq::MCAST_END,
                        reason: u8::from(!complete),
                        dst_service: t.service,
                        peer: pack(t.root),
                        tag: t.id,
                        extra2: t.size,
                        ..Cqe::default()
                    },
                    &[],
                ),
            };
            let taken = a.write_event(e, data);
            if taken {
                bump(&a.info.counters.multicast_bytes, data.len() as u64);
            }
            Some(taken)
        });
        n
    }

    /// Whether multicast bytes wait for application `i` (the poller must not sleep on
    /// them while its channel has room).
    pub(super) fn mcast_waiting(&self, i: usize) -> bool {
        self.apps[i]
            .ids
            .iter()
            .any(|id| self.shared.apps.multicast.waiting_for(*id))
    }
}

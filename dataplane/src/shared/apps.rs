//! The applications attached to torusd from their own processes, as the threads that meet
//! them see them: the listener adds them, the host (in the first poller) adopts their
//! channels, the status reads their counters.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use torusnet_client::channel::Region;
use torusnet_client::sys::Mapping;

use crate::status::AppStatus;

/// Counters of one application, updated by the host.
#[derive(Debug, Default)]
pub struct AppCounters {
    /// Messages it submitted that torusd took.
    pub sent: AtomicU64,
    /// Messages delivered into its channel.
    pub received: AtomicU64,
    /// Of its messages, acknowledged.
    pub acked: AtomicU64,
    /// Of its messages, reported failed.
    pub failed: AtomicU64,
    /// Incoming messages dropped because it did not read them.
    pub dropped: AtomicU64,
    /// Times its backlog of unread events crossed the mark at which the transports refuse
    /// reliable messages for it (`ReceiverFull`).
    pub full_marks: AtomicU64,
    /// Submissions refused as malformed.
    pub bad: AtomicU64,
    /// Return buffers filled.
    pub buffers_filled: AtomicU64,
    /// "Return buffer missing" notices owed to senders that could not be sent: more were
    /// waiting for room in the transport than it keeps, or the sender could not be reached.
    pub notices_lost: AtomicU64,
    /// Frames of its service passing through shown to it (it intercepts on the path).
    pub on_path_seen: AtomicU64,
    /// Of those, dropped by its verdict.
    pub on_path_dropped: AtomicU64,
    /// Of those, sent on as they were because no verdict came by the deadline (or it left).
    pub on_path_expired: AtomicU64,
    /// Frames that could not be put back on their way (no link took them).
    pub on_path_lost: AtomicU64,
    /// Multicast bytes delivered into its channel.
    pub multicast_bytes: AtomicU64,
}

/// One attached application, as both the listener and the host see it.
#[derive(Debug)]
pub struct AppInfo {
    /// Its service name.
    pub name: String,
    /// Its service id.
    pub service: u16,
    /// Its process.
    pub pid: i32,
    /// Its user.
    pub uid: u32,
    /// When it attached.
    pub attached: Instant,
    /// Set when the host has taken its channel: from then on, messages for its service
    /// reach it. The listener answers the attach only after this, so an application never
    /// holds a channel its torusd would not deliver to yet.
    pub adopted: AtomicBool,
    /// Set when its socket closed (or the host closed its channel).
    pub dead: AtomicBool,
    /// Why the host closed its channel, if it did.
    pub closed_why: Mutex<Option<String>>,
    /// Its counters.
    pub counters: AppCounters,
    /// Its fair-queuing weight (`crate::weights`).
    pub weight: std::sync::atomic::AtomicU32,
    /// Names it added after its attach name, with their service ids (the listener adds,
    /// the host reads at its next reindex).
    pub added: Mutex<Vec<(String, u16)>>,
    /// How many of `added` the host delivers to: the listener answers an added name only
    /// once the host has taken it, as for the attach.
    pub indexed: std::sync::atomic::AtomicUsize,
    /// It intercepts its service's frames passing through this server.
    pub intercepting: AtomicBool,
}

impl AppInfo {
    /// Its service ids: the attach name's first, then the added ones.
    pub fn services(&self) -> Vec<u16> {
        let mut v = vec![self.service];
        v.extend(self.added.lock().iter().map(|(_, id)| *id));
        v
    }

    /// Whether service id `id` is one of its own.
    pub fn owns(&self, id: u16) -> bool {
        id == self.service || self.added.lock().iter().any(|(_, s)| *s == id)
    }
}

/// A channel ready for the host to adopt.
pub struct NewApp {
    pub(crate) info: Arc<AppInfo>,
    pub(crate) map: Mapping,
    pub(crate) region: Region,
    pub(crate) app_efd: OwnedFd,
}

/// The applications of one torusd: new channels on their way to the host, and every
/// attached application (for status and for unique service ids).
pub struct AppsRegistry {
    pub(crate) pending: ArrayQueue<NewApp>,
    /// Frames of intercepting applications' services that pollers held on their way (whole
    /// frames), for the host to hand to the applications.
    pub(crate) intercepted: ArrayQueue<Vec<u8>>,
    pub(crate) apps: Mutex<Vec<Arc<AppInfo>>>,
    /// Set when an application added a name: the host indexes its services again.
    pub(crate) renamed: AtomicBool,
    /// Multicast bytes members' sinks delivered for applications, not yet in their channels.
    pub(crate) multicast: Arc<super::McastInbox>,
}

impl std::fmt::Debug for AppsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppsRegistry")
            .field("apps", &self.apps.lock().len())
            .finish()
    }
}

impl Default for AppsRegistry {
    fn default() -> AppsRegistry {
        AppsRegistry {
            pending: ArrayQueue::new(64),
            intercepted: ArrayQueue::new(4096),
            apps: Mutex::new(Vec::new()),
            renamed: AtomicBool::new(false),
            multicast: Arc::default(),
        }
    }
}

impl AppsRegistry {
    /// The attached applications.
    pub fn status(&self) -> Vec<AppStatus> {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.apps
            .lock()
            .iter()
            .filter(|a| !a.dead.load(Ordering::Acquire))
            .map(|a| AppStatus {
                name: a.name.clone(),
                service: a.service,
                pid: a.pid,
                uid: a.uid,
                attached_s: a.attached.elapsed().as_secs_f64(),
                added_names: a.added.lock().iter().map(|(n, _)| n.clone()).collect(),
                weight: a.weight.load(Ordering::Relaxed),
                sent: g(&a.counters.sent),
                received: g(&a.counters.received),
                acked: g(&a.counters.acked),
                failed: g(&a.counters.failed),
                dropped: g(&a.counters.dropped),
                full_marks: g(&a.counters.full_marks),
                bad: g(&a.counters.bad),
                buffers_filled: g(&a.counters.buffers_filled),
                notices_lost: g(&a.counters.notices_lost),
                on_path_seen: g(&a.counters.on_path_seen),
                on_path_dropped: g(&a.counters.on_path_dropped),
                on_path_expired: g(&a.counters.on_path_expired),
                multicast_bytes: g(&a.counters.multicast_bytes),
                on_path_lost: g(&a.counters.on_path_lost),
            })
            .collect()
    }
}

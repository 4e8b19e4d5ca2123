//! The handle of a service embedded in torusd's process (a Rust program linking the
//! dataplane): its sends become commands for the pollers, its events come from its inbox.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::transport::SendError;
use torusnet_proto::wire::TORUS_LEN;

use crate::shared::{Command, ServiceInbox, Shared};

/// Where an embedded service's message goes: a target, and the service there (by default
/// the sender's own id, the usual case of one service talking to its peers).
#[derive(Debug, Clone, Copy)]
pub struct ServiceAt {
    /// The server, or the key whose root takes it.
    pub target: Target,
    /// The service there; `None`: the sender's own id.
    pub service: Option<u16>,
}

impl ServiceAt {
    /// Service `service` at `target`.
    pub fn new(target: Target, service: u16) -> ServiceAt {
        ServiceAt {
            target,
            service: Some(service),
        }
    }
}

impl From<Target> for ServiceAt {
    fn from(target: Target) -> ServiceAt {
        ServiceAt {
            target,
            service: None,
        }
    }
}

/// A service embedded in torusd's process: it sends through the pollers' command queues and
/// receives from its own inbox.
#[derive(Debug, Clone)]
pub struct ServiceHandle {
    pub(super) id: u16,
    pub(super) shared: Arc<Shared>,
    pub(super) inbox: Arc<ServiceInbox>,
}

impl ServiceHandle {
    /// The service id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Queues a message for the poller, to `to` (a [`Target`] alone means this service's
    /// id there); `WouldBlock` when the queue to the poller is full (the transport's own
    /// back-pressure reaches here through it). A message taken ends in one report to this
    /// service when it was reliable and acknowledgements were asked for
    /// ([`ServiceHandle::notify_acks`]), and in an [`Event::Failed`] whenever it cannot be
    /// delivered, naming it by `opts.tag`. Reports come to this service whichever service
    /// the message was for.
    pub fn send(
        &self,
        to: impl Into<ServiceAt>,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        let ServiceAt { target, service } = to.into();
        let max = if opts.reliable {
            self.shared.max_message
        } else {
            self.shared.mtu as usize - TORUS_LEN - 6
        };
        if data.len() > max {
            return Err(SendError::TooLarge {
                len: data.len(),
                max,
            });
        }
        if let Target::Server(c) = target {
            if !self.shared.dims.contains(c) {
                return Err(SendError::Unreachable);
            }
        }
        let c = Command::Send {
            target,
            service: service.unwrap_or(self.id),
            data: data.to_vec(),
            opts: MsgOptions {
                from: Some(self.id),
                ..opts
            },
        };
        self.shared.push(c).map_err(|_| SendError::WouldBlock)
    }

    /// [`ServiceHandle::send`], retrying while the queue is full, up to `timeout`.
    pub fn send_blocking(
        &self,
        to: impl Into<ServiceAt>,
        data: &[u8],
        opts: MsgOptions,
        timeout: Duration,
    ) -> Result<(), SendError> {
        let to = to.into();
        let deadline = Instant::now() + timeout;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self.send(to, data, opts) {
                Err(SendError::WouldBlock) if Instant::now() < deadline => {
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
                r => return r,
            }
        }
    }

    /// Asks for [`Event::Acked`] reports of this service's reliable messages (or stops them).
    pub fn notify_acks(&self, on: bool) -> Result<(), SendError> {
        self.shared
            .push(Command::NotifyAcks(self.id, on))
            .map_err(|_| SendError::WouldBlock)
    }

    /// The next event, if one is waiting.
    pub fn recv(&self) -> Option<Event> {
        self.inbox.queue.pop()
    }

    /// The next event, waiting up to `timeout`.
    /// Spins briefly, then sleeps on the inbox's eventfd until the poller pushes. It never
    /// yields the processor while waiting: on a machine whose cores the pollers keep busy, a
    /// yielding thread waits a whole time slice for its turn, long after its event came.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if let Some(e) = self.inbox.queue.pop() {
                return Some(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if spins < 256 {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            self.inbox.waiting.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            if let Some(e) = self.inbox.queue.pop() {
                self.inbox.waiting.store(false, Ordering::SeqCst);
                return Some(e);
            }
            let ms = (deadline - now).as_millis().clamp(1, 1000) as i32;
            torusnet_client::sys::wait_readable(self.inbox.efd.as_raw_fd(), ms);
            torusnet_client::sys::drain(self.inbox.efd.as_raw_fd());
            self.inbox.waiting.store(false, Ordering::SeqCst);
        }
    }
}

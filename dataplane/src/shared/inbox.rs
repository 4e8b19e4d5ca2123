//! The inbox of a service embedded in torusd's process: events its poller delivers, waiting
//! for the program that registered it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_queue::ArrayQueue;
use torusnet_proto::node::Event;

/// Events for one embedded service, with the eventfd it sleeps on when the queue is empty.
#[derive(Debug)]
pub struct ServiceInbox {
    pub(crate) queue: ArrayQueue<Event>,
    /// The service sleeps on `efd`: the poller signals it after pushing.
    pub(crate) waiting: AtomicBool,
    pub(crate) efd: OwnedFd,
}

impl ServiceInbox {
    pub(crate) fn new() -> std::io::Result<ServiceInbox> {
        Ok(ServiceInbox {
            queue: ArrayQueue::new(1 << 16),
            waiting: AtomicBool::new(false),
            efd: torusnet_client::sys::eventfd()?,
        })
    }

    /// Wakes the service if it sleeps (called by the poller after pushing).
    pub(crate) fn notify(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) {
            torusnet_client::sys::signal(self.efd.as_raw_fd());
        }
    }
}

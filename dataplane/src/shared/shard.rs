//! The part of one poller that other threads reach: its command and hand-off queues, its
//! wake-up eventfd and the snapshot of its engine it publishes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;

use super::{Command, Handoff, HandoffCounts};
use crate::status::EngineSnapshot;

/// What other threads share with one poller.
#[derive(Debug)]
pub struct ShardShared {
    /// Commands for the poller (sends, requests, settings).
    pub(crate) commands: ArrayQueue<Command>,
    /// Frames other pollers hand it for its links.
    pub(crate) handoff: ArrayQueue<Handoff>,
    /// Set while the poller sleeps: a producer then kicks `wake`.
    pub(crate) sleeping: AtomicBool,
    /// The eventfd the poller sleeps on.
    pub(crate) wake: OwnedFd,
    /// The poller's latest engine snapshot, for status queries.
    pub(crate) snapshot: Mutex<EngineSnapshot>,
}

impl ShardShared {
    pub(crate) fn new() -> std::io::Result<ShardShared> {
        // SAFETY: eventfd returns a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ShardShared {
            commands: ArrayQueue::new(1 << 16),
            handoff: ArrayQueue::new(1 << 14),
            sleeping: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            snapshot: Mutex::new(EngineSnapshot::default()),
        })
    }

    /// Queues `h` for this poller and wakes it. A full queue turns the frame away, as a
    /// full ring would (a reliable sender resends it): counted in `counts` either way.
    pub(crate) fn hand_off(&self, h: Handoff, counts: &mut HandoffCounts) -> bool {
        match self.handoff.push(h) {
            Ok(()) => {
                counts.passed += 1;
                self.wake();
                true
            }
            Err(_) => {
                counts.dropped += 1;
                false
            }
        }
    }

    /// Wakes this poller if it sleeps in poll().
    pub(crate) fn wake(&self) {
        // Pairs with the poller's fence between announcing its sleep and its last look at
        // the queues: without both, a command pushed in between waits for the poller's
        // timer.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes to our eventfd.
            unsafe {
                libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8);
            }
        }
    }
}

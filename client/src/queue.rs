//! CLAN's distributed message queue, on remote memory: a ring of slots in the receiver's
//! region that the sender fills with remote writes, with the indices where each side can
//! read them without asking.
//!
//! ```text
//! receiver's ring region   [write index u64 | pad to 64][slot 0][slot 1]...   slot: len u32, bytes
//! sender's region          [read index u64]
//! ```
//!
//! The sender writes a message into the next slot, then the new write index with a backward
//! fence (so the index never lands before the bytes it announces). A tripwire on the write
//! index wakes the receiver. The receiver reads slots locally and writes its read index into
//! the sender's region (every quarter ring, and whenever it catches up), where a tripwire
//! wakes a sender waiting for room. Neither side's application takes part in the other's
//! operations; each message costs the sender two one-sided writes (fewer with
//! [`QueueSender::push`] + [`QueueSender::publish`]).
//!
//! A queue owns its client's event stream while it waits (other events are dropped), so
//! give each queue a client of its own.

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use crate::remote::{LocalRegion, RemoteOptions};
use crate::rmem::{Capability, Status, READ, WRITE};
use crate::{Client, Error, Event, Wait};

/// Bytes before the first slot.
const HEAD: u64 = 64;

fn ring_len(slots: u64, slot: u64) -> u64 {
    HEAD + slots * slot
}

/// Reads a u64 index the other side writes remotely: twice until both reads agree, then an
/// acquire fence (the bytes it announces landed before it).
fn index(c: &Client, r: &LocalRegion, off: u64) -> u64 {
    let read = || {
        let mut b = [0u8; 8];
        c.region_read(r, off, &mut b);
        u64::from_le_bytes(b)
    };
    let mut a = read();
    loop {
        let b = read();
        if a == b {
            fence(Ordering::Acquire);
            return a;
        }
        a = b;
    }
}

fn failed(s: Status) -> Error {
    Error::Refused(format!("queue: remote write {}", s.name()))
}

/// The receiving end: owns the ring.
pub struct QueueReceiver<'c> {
    c: &'c Client,
    ring: LocalRegion,
    slots: u64,
    slot: u64,
    read: u64,
    published: u64,
    sender: Option<Capability>,
}

impl<'c> QueueReceiver<'c> {
    /// A ring of `slots` slots of `slot` bytes (4 of them the length); returns it and the
    /// capability to hand the sender (write-only, the ring and nothing else).
    pub fn new(
        c: &'c Client,
        slots: u64,
        slot: u64,
    ) -> Result<(QueueReceiver<'c>, Capability), Error> {
        if slots == 0 || slot < 8 {
            return Err(Error::Refused(
                "queue: slots and slot size too small".into(),
            ));
        }
        let ring = c.register_region(ring_len(slots, slot), WRITE)?;
        c.arm_tripwire(&ring, 0, 8)?;
        let cap = c.narrow(&ring.cap, 0, ring.len, WRITE, None)?;
        Ok((
            QueueReceiver {
                c,
                ring,
                slots,
                slot,
                read: 0,
                published: 0,
                sender: None,
            },
            cap,
        ))
    }

    /// The sender's capability for its read index.
    pub fn connect(&mut self, sender: Capability) {
        self.sender = Some(sender);
    }

    fn publish(&mut self) -> Result<(), Error> {
        if let Some(cap) = self.sender {
            // Fenced: two index writes in flight may otherwise land out of order (a
            // retransmission, another link), leaving the sender an older index than the
            // last one written and waiting for room that was freed.
            let opts = RemoteOptions {
                backward_fence: true,
                ..RemoteOptions::default()
            };
            self.c
                .remote_write(&cap, 0, &self.read.to_le_bytes(), opts)?;
            self.published = self.read;
        }
        Ok(())
    }

    /// The next message, waiting up to `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let write = index(self.c, &self.ring, 0);
            if self.read < write {
                let at = HEAD + (self.read % self.slots) * self.slot;
                let mut len = [0u8; 4];
                self.c.region_read(&self.ring, at, &mut len);
                let n = (u32::from_le_bytes(len) as u64).min(self.slot - 4) as usize;
                let mut data = vec![0u8; n];
                self.c.region_read(&self.ring, at + 4, &mut data);
                self.read += 1;
                if self.read - self.published >= (self.slots / 4).max(1) || self.read == write {
                    self.publish()?;
                }
                return Ok(Some(data));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            match self.c.recv(Wait::Timeout(left))? {
                Some(Event::RemoteDone { status, .. }) if status != Status::Ok => {
                    return Err(failed(status))
                }
                _ => {}
            }
        }
    }
}

/// The sending end.
pub struct QueueSender<'c> {
    c: &'c Client,
    ring: Capability,
    slots: u64,
    slot: u64,
    write: u64,
    local: LocalRegion,
    outstanding: u64,
}

impl<'c> QueueSender<'c> {
    /// A sender into the ring `ring` (from the receiver); returns it and the capability to
    /// hand the receiver for the read index.
    pub fn new(
        c: &'c Client,
        ring: Capability,
        slots: u64,
        slot: u64,
    ) -> Result<(QueueSender<'c>, Capability), Error> {
        if ring.len < ring_len(slots, slot) {
            return Err(Error::Refused(
                "queue: the ring is smaller than its slots".into(),
            ));
        }
        let local = c.register_region(8, WRITE | READ)?;
        c.arm_tripwire(&local, 0, 8)?;
        let cap = c.narrow(&local.cap, 0, 8, WRITE, None)?;
        Ok((
            QueueSender {
                c,
                ring,
                slots,
                slot,
                write: 0,
                local,
                outstanding: 0,
            },
            cap,
        ))
    }

    /// Takes the operations' completions that arrived; an error if one failed.
    fn drain(&mut self, wait: Wait) -> Result<(), Error> {
        let mut wait = wait;
        while let Some(e) = self.c.recv(wait)? {
            if let Event::RemoteDone { status, .. } = e {
                self.outstanding = self.outstanding.saturating_sub(1);
                if status != Status::Ok {
                    return Err(failed(status));
                }
            }
            wait = Wait::NoWait;
        }
        Ok(())
    }

    /// Writes a message into the next slot, without announcing it yet (`publish` does);
    /// waits up to `timeout` for room.
    pub fn push(&mut self, data: &[u8], timeout: Duration) -> Result<(), Error> {
        if data.len() as u64 > self.slot - 4 {
            return Err(Error::TooLarge(data.len()));
        }
        let deadline = Instant::now() + timeout;
        while self.write - index(self.c, &self.local, 0) >= self.slots || self.outstanding > 4096 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            self.drain(Wait::Timeout(left.min(Duration::from_millis(10))))?;
        }
        let at = HEAD + (self.write % self.slots) * self.slot;
        let mut b = Vec::with_capacity(4 + data.len());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(data);
        loop {
            match self
                .c
                .remote_write(&self.ring, at, &b, RemoteOptions::default())
            {
                Ok(_) => break,
                Err(Error::WouldBlock) if Instant::now() < deadline => self.drain(Wait::NoWait)?,
                Err(e) => return Err(e),
            }
        }
        self.outstanding += 1;
        self.write += 1;
        Ok(())
    }

    /// Announces every message pushed so far (one fenced write of the index).
    pub fn publish(&mut self) -> Result<(), Error> {
        let opts = RemoteOptions {
            backward_fence: true,
            ..RemoteOptions::default()
        };
        self.c
            .remote_write(&self.ring, 0, &self.write.to_le_bytes(), opts)?;
        self.outstanding += 1;
        self.drain(Wait::NoWait)
    }

    /// Sends one message (push and publish).
    pub fn send(&mut self, data: &[u8], timeout: Duration) -> Result<(), Error> {
        self.push(data, timeout)?;
        self.publish()
    }

    /// Waits until every operation so far has completed.
    pub fn flush(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        while self.outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            self.drain(Wait::Timeout(left))?;
        }
        Ok(())
    }
}

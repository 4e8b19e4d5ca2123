//! Remote memory for a program that embeds the dataplane (`Dataplane::remote_memory`): the
//! same regions, capabilities, one-sided operations and event queue an attached application
//! gets through its channel, with memory the program allocated (`HeapMemory`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use torusnet_client::rmem::{Capability, Status};
use torusnet_proto::transport::Fences;

use super::memory::{HeapMemory, Memory};
use super::table::Tripwire;
use super::wire::WriteFrames;
use super::{RmCommand, RmEvent, Rmem};

/// A region an embedding program registered: its bytes and the capability for all of them.
#[derive(Clone)]
pub struct Region {
    /// Its id among the owner's regions.
    pub id: u32,
    /// The capability for the whole region (hand it, or a narrowed one, to others).
    pub cap: Capability,
    mem: Arc<HeapMemory>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.id)
            .field("len", &self.mem.len())
            .finish()
    }
}

impl Region {
    /// Copies bytes out of the region (false: outside it).
    pub fn read(&self, off: u64, out: &mut [u8]) -> bool {
        self.mem.read(off, out)
    }
    /// Copies bytes into the region (false: outside it).
    pub fn write(&self, off: u64, data: &[u8]) -> bool {
        self.mem.write(off, data)
    }
    /// Its length.
    pub fn len(&self) -> u64 {
        self.mem.len()
    }
    /// Whether it is empty (never, once registered).
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
}

/// One owner's handle on this server's remote memory. Owner ids share the space of service
/// ids: use a service id the program holds, so no attached application has the same.
pub struct RemoteMemory {
    rm: Arc<Rmem>,
    owner: u16,
    next_region: AtomicU32,
    next_tag: AtomicU64,
    /// Events taken while waiting for one operation, kept for `next_event`.
    early: Mutex<VecDeque<RmEvent>>,
}

impl std::fmt::Debug for RemoteMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMemory")
            .field("owner", &self.owner)
            .finish()
    }
}

impl RemoteMemory {
    /// The handle of `owner` on `rm`.
    pub fn new(rm: Arc<Rmem>, owner: u16) -> RemoteMemory {
        rm.add_owner(owner);
        RemoteMemory {
            rm,
            owner,
            // Clear of the ids attached applications choose (they count from 1).
            next_region: AtomicU32::new(0x8000_0000),
            next_tag: AtomicU64::new(1),
            early: Mutex::new(VecDeque::new()),
        }
    }

    /// Registers `len` zeroed bytes with `rights` (`rmem::READ | rmem::WRITE`).
    pub fn register(&self, len: usize, rights: u8) -> Result<Region, Status> {
        if len == 0 {
            return Err(Status::OutOfRange);
        }
        let mem = Arc::new(HeapMemory::new(len));
        let id = self.next_region.fetch_add(1, Ordering::Relaxed);
        let cap = self
            .rm
            .table
            .lock()
            .register(self.owner, id, mem.clone(), rights)?;
        Ok(Region { id, cap, mem })
    }

    /// Removes a region and every capability of it.
    pub fn deregister(&self, r: &Region) -> bool {
        self.rm.table.lock().deregister(self.owner, r.id)
    }

    /// A capability for part of what `cap` allows (`len` bytes from `offset`, fewer rights,
    /// an expiry).
    pub fn narrow(
        &self,
        cap: &Capability,
        offset: u64,
        len: u64,
        rights: u8,
        ttl: Option<Duration>,
    ) -> Result<Capability, Status> {
        self.rm
            .table
            .lock()
            .narrow(self.owner, cap, offset, len, rights, ttl, Instant::now())
    }

    /// Revokes a capability this owner minted (and every one narrowed from it).
    pub fn revoke(&self, cap: &Capability) -> Status {
        self.rm.table.lock().revoke(self.owner, cap.cookie)
    }

    /// Arms a tripwire on `len` bytes at `offset` of region `r`; returns its id.
    pub fn arm_tripwire(&self, r: &Region, offset: u64, len: u64) -> Result<u64, Status> {
        let id = self.next_tag.fetch_add(1, Ordering::Relaxed);
        match self
            .rm
            .table
            .lock()
            .arm(self.owner, r.id, Tripwire { id, offset, len })
        {
            Status::Ok => Ok(id),
            s => Err(s),
        }
    }

    /// Disarms a tripwire.
    pub fn disarm_tripwire(&self, r: &Region, id: u64) {
        self.rm.table.lock().disarm(self.owner, r.id, id);
    }

    /// Starts a one-sided write of `data` at `offset` of `cap`; returns the operation's tag
    /// (its `RmEvent::Done` names it).
    pub fn write(
        &self,
        cap: &Capability,
        offset: u64,
        data: &[u8],
        notify: bool,
        fences: Fences,
    ) -> u64 {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        self.rm.submit(RmCommand::Write {
            owner: self.owner,
            tag,
            cap: *cap,
            offset,
            frames: WriteFrames::from_slice(self.rm.chunk, data),
            notify,
            fences,
        });
        tag
    }

    /// Starts a one-sided read of `len` bytes at `offset` of `cap` into region `into` at
    /// `local_offset`; returns the operation's tag.
    pub fn read(
        &self,
        cap: &Capability,
        offset: u64,
        len: u64,
        into: &Region,
        local_offset: u64,
        fences: Fences,
    ) -> u64 {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        self.rm.submit(RmCommand::Read {
            owner: self.owner,
            tag,
            cap: *cap,
            offset,
            len,
            region: into.id,
            local_offset,
            fences,
        });
        tag
    }

    /// The next event of this owner (completions, tripwires, notifications), waiting up to
    /// `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<RmEvent> {
        if let Some(e) = self.early.lock().pop_front() {
            return Some(e);
        }
        self.rm.wait_event(self.owner, timeout)
    }

    /// Waits up to `timeout` for operation `tag` to end: its status and bytes moved
    /// (`Status::Timeout` if it did not end in time). Other events stay for `next_event`.
    pub fn wait(&self, tag: u64, timeout: Duration) -> (Status, u64) {
        let deadline = Instant::now() + timeout;
        {
            let mut early = self.early.lock();
            if let Some(i) = early
                .iter()
                .position(|e| matches!(e, RmEvent::Done { tag: t, .. } if *t == tag))
            {
                if let Some(RmEvent::Done { status, bytes, .. }) = early.remove(i) {
                    return (status, bytes);
                }
            }
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (Status::Timeout, 0);
            }
            match self.rm.wait_event(self.owner, left) {
                Some(RmEvent::Done {
                    tag: t,
                    status,
                    bytes,
                }) if t == tag => return (status, bytes),
                Some(e) => self.early.lock().push_back(e),
                None => return (Status::Timeout, 0),
            }
        }
    }
}

impl Drop for RemoteMemory {
    /// An owner that goes away revokes everything it registered, as an exiting application.
    fn drop(&mut self) {
        self.rm.remove_owner(self.owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use torusnet_client::rmem::{READ, WRITE};

    #[test]
    fn regions_capabilities_and_tripwires_locally() {
        let rm = Arc::new(Rmem::new(0, 8936, Box::new(|| {})));
        let m = RemoteMemory::new(rm.clone(), 7);
        let r = m.register(4096, READ | WRITE).expect("register");
        assert_eq!(r.cap.len, 4096);
        let narrow = m.narrow(&r.cap, 1024, 16, WRITE, None).expect("narrow");
        let trip = m.arm_tripwire(&r, 1030, 4).expect("arm");
        // What a peer's write does when it lands here.
        let landed = rm
            .table
            .lock()
            .write(
                narrow.cookie,
                narrow.owner,
                narrow.region,
                narrow.offset + 4,
                b"abcd",
                Instant::now(),
            )
            .expect("land");
        assert_eq!(landed.tripwires, vec![trip]);
        let mut out = [0u8; 4];
        assert!(r.read(1028, &mut out));
        assert_eq!(&out, b"abcd");
        // Outside the narrowed window, and after revocation: refused, nothing written.
        let t = Instant::now();
        let mut tbl = rm.table.lock();
        assert_eq!(
            tbl.write(
                narrow.cookie,
                narrow.owner,
                narrow.region,
                narrow.offset + 14,
                b"abcd",
                t
            )
            .err(),
            Some(Status::OutOfRange)
        );
        drop(tbl);
        assert_eq!(m.revoke(&narrow), Status::Ok);
        tbl = rm.table.lock();
        assert_eq!(
            tbl.write(
                narrow.cookie,
                narrow.owner,
                narrow.region,
                narrow.offset,
                b"x",
                t
            )
            .err(),
            Some(Status::Revoked)
        );
        drop(tbl);
        // Another owner cannot narrow or revoke it.
        let other = RemoteMemory::new(rm.clone(), 8);
        assert!(other.narrow(&r.cap, 0, 8, READ, None).is_err());
        assert_ne!(other.revoke(&r.cap), Status::Ok);
        drop(m);
        assert_eq!(rm.stats().regions, 0, "the owner's regions went with it");
    }

    #[test]
    fn wait_keeps_other_events() {
        let rm = Arc::new(Rmem::new(0, 8936, Box::new(|| {})));
        let m = RemoteMemory::new(rm.clone(), 3);
        rm.push_event(
            3,
            RmEvent::Done {
                tag: 5,
                status: Status::Ok,
                bytes: 1,
            },
        );
        rm.push_event(
            3,
            RmEvent::Done {
                tag: 9,
                status: Status::NoRight,
                bytes: 0,
            },
        );
        assert_eq!(m.wait(9, Duration::from_millis(10)), (Status::NoRight, 0));
        assert!(matches!(
            m.next_event(Duration::ZERO),
            Some(RmEvent::Done { tag: 5, .. })
        ));
        assert_eq!(m.wait(11, Duration::from_millis(10)).0, Status::Timeout);
    }
}

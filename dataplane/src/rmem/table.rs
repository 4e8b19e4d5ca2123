//! Regions, capabilities and tripwires of one server, and the checks every remote access
//! passes: the cookie names a live capability of that region, the capability has the right,
//! the bytes lie inside the capability (and so inside the region), and it has not expired.
//! Nothing is read or written outside a region; every refusal is counted by its reason.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use torusnet_client::rmem::{Capability, Status, READ, WRITE};
use torusnet_proto::topology::Coord;

use super::memory::Memory;

/// A tripwire: a range of a region whose writes raise an event for the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tripwire {
    /// The owner's id for it.
    pub id: u64,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

struct RegionEntry {
    mem: Arc<dyn Memory>,
    rights: u8,
    tripwires: Vec<Tripwire>,
}

#[derive(Debug, Clone, Copy)]
struct CapEntry {
    owner: u16,
    region: u32,
    offset: u64,
    len: u64,
    rights: u8,
    expires: Option<Instant>,
    parent: Option<u64>,
}

/// A read this server started: where the answer's bytes land.
#[derive(Debug, Clone, Copy)]
pub struct ReadDest {
    /// The server answering.
    pub src: Coord,
    /// The local region's owner.
    pub owner: u16,
    /// The local region.
    pub region: u32,
    /// Where in it.
    pub offset: u64,
    /// Bytes expected.
    pub len: u64,
    /// Bytes landed so far.
    pub got: u64,
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// Tripwires it touched.
    pub tripwires: Vec<u64>,
}

/// Most revoked cookies remembered (to tell "revoked" from "wrong").
const REVOKED_MEMORY: usize = 4096;
/// Most regions and capabilities of one server.
const MAX_REGIONS: usize = 4096;
const MAX_CAPS: usize = 65536;
const MAX_TRIPWIRES: usize = 256;

/// The server's remote-memory state.
pub struct Table {
    server: u64,
    regions: HashMap<(u16, u32), RegionEntry>,
    caps: HashMap<u64, CapEntry>,
    revoked: HashSet<u64>,
    revoked_order: VecDeque<u64>,
    /// Reads in flight from this server, by operation id.
    pub reads: HashMap<u64, ReadDest>,
    /// Accesses refused here, by status code.
    pub refused: [u64; 10],
    rng: Box<dyn FnMut() -> u64 + Send>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("regions", &self.regions.len())
            .field("caps", &self.caps.len())
            .finish_non_exhaustive()
    }
}

/// 64 random bits from the kernel.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom fills our buffer; a short or failed read leaves zeros, which callers
    // never accept as a cookie.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n != 8 {
        return 0;
    }
    u64::from_le_bytes(b)
}

impl Table {
    /// The table of the server `server` (packed coordinate), with cookies from `rng`.
    pub fn new(server: u64, rng: Box<dyn FnMut() -> u64 + Send>) -> Table {
        Table {
            server,
            regions: HashMap::new(),
            caps: HashMap::new(),
            revoked: HashSet::new(),
            revoked_order: VecDeque::new(),
            reads: HashMap::new(),
            refused: [0; 10],
            rng,
        }
    }

    fn cookie(&mut self) -> u64 {
        loop {
            let c = (self.rng)();
            if c != 0 && !self.caps.contains_key(&c) && !self.revoked.contains(&c) {
                return c;
            }
        }
    }

    fn mint(&mut self, e: CapEntry) -> Result<Capability, Status> {
        if self.caps.len() >= MAX_CAPS {
            return Err(Status::Invalid);
        }
        let cookie = self.cookie();
        self.caps.insert(cookie, e);
        Ok(Capability {
            server: self.server,
            owner: e.owner,
            rights: e.rights,
            region: e.region,
            offset: e.offset,
            len: e.len,
            cookie,
        })
    }

    /// Registers region `id` of `owner` and returns a capability for all of it.
    pub fn register(
        &mut self,
        owner: u16,
        id: u32,
        mem: Arc<dyn Memory>,
        rights: u8,
    ) -> Result<Capability, Status> {
        let rights = rights & (READ | WRITE);
        if self.regions.contains_key(&(owner, id))
            || self.regions.len() >= MAX_REGIONS
            || rights == 0
        {
            return Err(Status::Invalid);
        }
        let len = mem.len();
        self.regions.insert(
            (owner, id),
            RegionEntry {
                mem,
                rights,
                tripwires: Vec::new(),
            },
        );
        self.mint(CapEntry {
            owner,
            region: id,
            offset: 0,
            len,
            rights,
            expires: None,
            parent: None,
        })
    }

    fn forget(&mut self, cookie: u64) {
        if self.caps.remove(&cookie).is_some() && self.revoked.insert(cookie) {
            self.revoked_order.push_back(cookie);
            if self.revoked_order.len() > REVOKED_MEMORY {
                if let Some(old) = self.revoked_order.pop_front() {
                    self.revoked.remove(&old);
                }
            }
        }
    }

    /// Removes region `id` of `owner` and every capability of it.
    pub fn deregister(&mut self, owner: u16, id: u32) -> bool {
        let gone: Vec<u64> = self
            .caps
            .iter()
            .filter(|(_, c)| c.owner == owner && c.region == id)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.forget(k);
        }
        self.regions.remove(&(owner, id)).is_some()
    }

    /// Removes everything of `owner` (it exited).
    pub fn remove_owner(&mut self, owner: u16) {
        let ids: Vec<u32> = self
            .regions
            .keys()
            .filter(|(o, _)| *o == owner)
            .map(|(_, r)| *r)
            .collect();
        for id in ids {
            self.deregister(owner, id);
        }
        self.reads.retain(|_, r| r.owner != owner);
    }

    /// A capability for part of `parent` (`offset`/`len` relative to it) with at most its
    /// rights, expiring after `ttl`; only the region's owner may narrow.
    #[allow(clippy::too_many_arguments)]
    pub fn narrow(
        &mut self,
        owner: u16,
        parent: &Capability,
        offset: u64,
        len: u64,
        rights: u8,
        ttl: Option<Duration>,
        now: Instant,
    ) -> Result<Capability, Status> {
        let p = self.live(parent.cookie, now)?;
        if p.owner != owner || parent.owner != owner || p.region != parent.region {
            return Err(Status::NoRight);
        }
        let end = offset.checked_add(len).ok_or(Status::OutOfRange)?;
        if end > p.len || len == 0 {
            return Err(Status::OutOfRange);
        }
        let rights = rights & p.rights;
        if rights == 0 {
            return Err(Status::NoRight);
        }
        let expires = match (ttl.map(|t| now + t), p.expires) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.mint(CapEntry {
            owner,
            region: p.region,
            offset: p.offset + offset,
            len,
            rights,
            expires,
            parent: Some(parent.cookie),
        })
    }

    /// Revokes `cookie` and every capability narrowed from it (only its owner may).
    pub fn revoke(&mut self, owner: u16, cookie: u64) -> Status {
        match self.caps.get(&cookie) {
            None => return Status::BadCookie,
            Some(c) if c.owner != owner => return Status::NoRight,
            Some(_) => {}
        }
        let mut doomed = vec![cookie];
        let mut i = 0;
        while i < doomed.len() {
            let p = doomed[i];
            doomed.extend(
                self.caps
                    .iter()
                    .filter(|(_, c)| c.parent == Some(p))
                    .map(|(k, _)| *k),
            );
            i += 1;
        }
        for k in doomed {
            self.forget(k);
        }
        Status::Ok
    }

    fn live(&self, cookie: u64, now: Instant) -> Result<CapEntry, Status> {
        match self.caps.get(&cookie) {
            Some(c) if c.expires.is_some_and(|e| e <= now) => Err(Status::Expired),
            Some(c) => Ok(*c),
            None if self.revoked.contains(&cookie) => Err(Status::Revoked),
            None => Err(Status::BadCookie),
        }
    }

    /// The checks of one access: `cookie` for `owner`'s `region`, `len` bytes at region
    /// offset `offset`, with right `right`.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        cookie: u64,
        owner: u16,
        region: u32,
        offset: u64,
        len: u64,
        right: u8,
        now: Instant,
    ) -> Result<(), Status> {
        let r = (|| {
            let c = self.live(cookie, now)?;
            if c.owner != owner || c.region != region {
                return Err(Status::BadCookie);
            }
            if c.rights & right == 0 {
                return Err(Status::NoRight);
            }
            let end = offset.checked_add(len).ok_or(Status::OutOfRange)?;
            if offset < c.offset || end > c.offset + c.len {
                return Err(Status::OutOfRange);
            }
            let reg = self.regions.get(&(owner, region)).ok_or(Status::NoRegion)?;
            if end > reg.mem.len() || reg.rights & right == 0 {
                return Err(Status::OutOfRange);
            }
            Ok(())
        })();
        if let Err(s) = r {
            self.refused[s as usize] += 1;
        }
        r
    }

    /// A remote write of `data` at region offset `offset`.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        cookie: u64,
        owner: u16,
        region: u32,
        offset: u64,
        data: &[u8],
        now: Instant,
    ) -> Result<Landed, Status> {
        self.check(cookie, owner, region, offset, data.len() as u64, WRITE, now)?;
        let reg = self.regions.get(&(owner, region)).ok_or(Status::NoRegion)?;
        if !reg.mem.write(offset, data) {
            return Err(Status::OutOfRange);
        }
        let end = offset + data.len() as u64;
        let tripwires = reg
            .tripwires
            .iter()
            .filter(|t| t.offset < end && offset < t.offset + t.len)
            .map(|t| t.id)
            .collect();
        Ok(Landed { tripwires })
    }

    /// Whether a remote read of `len` bytes at region offset `offset` would be allowed (the
    /// checks of [`Table::read`] without the bytes).
    pub fn check_read(
        &mut self,
        cookie: u64,
        owner: u16,
        region: u32,
        offset: u64,
        len: u64,
        now: Instant,
    ) -> Result<(), Status> {
        self.check(cookie, owner, region, offset, len, READ, now)?;
        let reg = self.regions.get(&(owner, region)).ok_or(Status::NoRegion)?;
        if offset.checked_add(len).is_some_and(|e| e <= reg.mem.len()) {
            Ok(())
        } else {
            Err(Status::OutOfRange)
        }
    }

    /// A remote read of `out.len()` bytes at region offset `offset`.
    pub fn read(
        &mut self,
        cookie: u64,
        owner: u16,
        region: u32,
        offset: u64,
        out: &mut [u8],
        now: Instant,
    ) -> Result<(), Status> {
        self.check_read(cookie, owner, region, offset, out.len() as u64, now)?;
        self.copy_out(owner, region, offset, out)
    }

    /// Copies `out.len()` bytes of `owner`'s region `region` at `offset` into `out`, without
    /// the capability's checks: for the pieces of a read [`Table::check_read`] allowed whole,
    /// under the same lock.
    pub fn copy_out(
        &self,
        owner: u16,
        region: u32,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), Status> {
        let reg = self.regions.get(&(owner, region)).ok_or(Status::NoRegion)?;
        if reg.mem.read(offset, out) {
            Ok(())
        } else {
            Err(Status::OutOfRange)
        }
    }

    /// Whether `owner`'s region `region` has `len` bytes at `offset` (a read's destination).
    pub fn has(&self, owner: u16, region: u32, offset: u64, len: u64) -> bool {
        self.regions
            .get(&(owner, region))
            .is_some_and(|r| offset.checked_add(len).is_some_and(|e| e <= r.mem.len()))
    }

    /// Bytes of a read this server started arriving from `src`, at `pos` of the read.
    pub fn land_read(&mut self, op: u64, src: Coord, pos: u64, data: &[u8]) -> Result<u64, Status> {
        let d = *self.reads.get(&op).ok_or(Status::Invalid)?;
        let end = pos.checked_add(data.len() as u64).ok_or(Status::Invalid)?;
        if d.src != src || end > d.len {
            return Err(Status::Invalid);
        }
        let reg = self
            .regions
            .get(&(d.owner, d.region))
            .ok_or(Status::NoRegion)?;
        if !reg.mem.write(d.offset + pos, data) {
            return Err(Status::Invalid);
        }
        let r = self.reads.get_mut(&op).ok_or(Status::Invalid)?;
        r.got += data.len() as u64;
        Ok(r.got)
    }

    /// Arms tripwire `t` on `owner`'s region `region`.
    pub fn arm(&mut self, owner: u16, region: u32, t: Tripwire) -> Status {
        let Some(reg) = self.regions.get_mut(&(owner, region)) else {
            return Status::NoRegion;
        };
        let end = t.offset.checked_add(t.len);
        if end.is_none_or(|e| e > reg.mem.len()) || t.len == 0 {
            return Status::OutOfRange;
        }
        if reg.tripwires.len() >= MAX_TRIPWIRES {
            return Status::Invalid;
        }
        reg.tripwires.retain(|x| x.id != t.id);
        reg.tripwires.push(t);
        Status::Ok
    }

    /// Disarms tripwire `id`.
    pub fn disarm(&mut self, owner: u16, region: u32, id: u64) {
        if let Some(reg) = self.regions.get_mut(&(owner, region)) {
            reg.tripwires.retain(|x| x.id != id);
        }
    }

    /// Regions and capabilities held.
    pub fn sizes(&self) -> (usize, usize) {
        (self.regions.len(), self.caps.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::HeapMemory;
    use super::*;

    fn table() -> Table {
        let mut n = 0u64;
        Table::new(
            5,
            Box::new(move || {
                n += 1;
                n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            }),
        )
    }

    #[test]
    fn every_refusal_has_its_reason_and_nothing_lands_outside() {
        let now = Instant::now();
        let mut t = table();
        let mem: Arc<dyn Memory> = Arc::new(HeapMemory::new(1024));
        let cap = t.register(2000, 1, mem.clone(), READ | WRITE).unwrap();
        assert_eq!(cap.len, 1024);
        assert!(t.write(cap.cookie, 2000, 1, 10, b"hello", now).is_ok());
        let mut out = [0u8; 5];
        t.read(cap.cookie, 2000, 1, 10, &mut out, now).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(
            t.write(cap.cookie ^ 1, 2000, 1, 0, b"x", now),
            Err(Status::BadCookie)
        );
        assert_eq!(
            t.write(cap.cookie, 2000, 2, 0, b"x", now),
            Err(Status::BadCookie),
            "another region"
        );
        assert_eq!(
            t.write(cap.cookie, 2000, 1, 1020, b"hello", now),
            Err(Status::OutOfRange)
        );
        assert_eq!(
            t.write(cap.cookie, 2000, 1, u64::MAX, b"x", now),
            Err(Status::OutOfRange)
        );
        // A narrowed, read-only window of 16 bytes at 100, expiring.
        let ro = t
            .narrow(2000, &cap, 100, 16, READ, Some(Duration::from_secs(5)), now)
            .unwrap();
        assert_ne!(ro.cookie, cap.cookie);
        assert_eq!(
            t.write(ro.cookie, 2000, 1, 100, b"x", now),
            Err(Status::NoRight)
        );
        assert_eq!(
            t.read(ro.cookie, 2000, 1, 99, &mut out, now),
            Err(Status::OutOfRange)
        );
        assert!(t.read(ro.cookie, 2000, 1, 100, &mut out, now).is_ok());
        let later = now + Duration::from_secs(6);
        assert_eq!(
            t.read(ro.cookie, 2000, 1, 100, &mut out, later),
            Err(Status::Expired)
        );
        // Only the owner narrows or revokes; revoking the parent revokes the child.
        assert_eq!(
            t.narrow(3000, &cap, 0, 1, READ, None, now),
            Err(Status::NoRight)
        );
        assert_eq!(t.revoke(3000, cap.cookie), Status::NoRight);
        let child = t.narrow(2000, &cap, 0, 8, READ | WRITE, None, now).unwrap();
        assert_eq!(t.revoke(2000, cap.cookie), Status::Ok);
        assert_eq!(
            t.write(cap.cookie, 2000, 1, 0, b"x", now),
            Err(Status::Revoked)
        );
        assert_eq!(
            t.write(child.cookie, 2000, 1, 0, b"x", now),
            Err(Status::Revoked)
        );
        assert!(t.refused.iter().sum::<u64>() >= 9);
        let mut check = [0u8; 1024];
        assert!(mem.read(0, &mut check));
        assert_eq!(
            check.iter().filter(|b| **b != 0).count(),
            5,
            "only the one write landed"
        );
    }

    #[test]
    fn tripwires_fire_on_overlap_and_an_owner_leaving_takes_everything() {
        let now = Instant::now();
        let mut t = table();
        let mem: Arc<dyn Memory> = Arc::new(HeapMemory::new(4096));
        let cap = t.register(2000, 9, mem, WRITE).unwrap();
        assert_eq!(
            t.arm(
                2000,
                9,
                Tripwire {
                    id: 7,
                    offset: 0,
                    len: 8
                }
            ),
            Status::Ok
        );
        assert_eq!(
            t.arm(
                2000,
                9,
                Tripwire {
                    id: 8,
                    offset: 4090,
                    len: 8
                }
            ),
            Status::OutOfRange
        );
        assert_eq!(
            t.write(cap.cookie, 2000, 9, 8, b"abc", now)
                .unwrap()
                .tripwires,
            Vec::<u64>::new()
        );
        assert_eq!(
            t.write(cap.cookie, 2000, 9, 6, b"abc", now)
                .unwrap()
                .tripwires,
            vec![7]
        );
        t.remove_owner(2000);
        assert_eq!(
            t.write(cap.cookie, 2000, 9, 8, b"abc", now),
            Err(Status::Revoked)
        );
        assert_eq!(t.sizes(), (0, 0));
    }
}

//! Remote memory from an application: regions in its pool, capabilities for them, one-sided
//! writes and reads of other applications' regions, tripwires (see `rmem` for the model).
//! Registering, narrowing and revoking wait for torusd's answer; writes and reads return a
//! handle at once and end in an [`Event::RemoteDone`] (or [`Client::wait_remote`]).

use std::time::{Duration, Instant};

use crate::channel::{sflag, Sqe};
use crate::rmem::{self, op as rop, Capability, Status};
use crate::{Client, Error, Event};

/// How long a registration, narrowing or revocation waits for torusd.
const ANSWER: Duration = Duration::from_secs(5);

/// A region of this application's pool registered for remote access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRegion {
    /// Its id.
    pub id: u32,
    /// Where it is in the pool.
    pub pool_offset: u64,
    /// Its length.
    pub len: u64,
    /// The capability for all of it (narrow it before handing it out).
    pub cap: Capability,
}

/// How a remote operation is ordered and reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteOptions {
    /// After every earlier message and operation to that server.
    pub backward_fence: bool,
    /// Before every later one.
    pub forward_fence: bool,
    /// Tell the region's owner when the write has landed.
    pub notify: bool,
}

fn flags(o: RemoteOptions) -> u8 {
    let mut f = 0;
    if o.backward_fence {
        f |= sflag::BWD_FENCE;
    }
    if o.forward_fence {
        f |= sflag::FWD_FENCE;
    }
    if o.notify {
        f |= rmem::flag::NOTIFY;
    }
    f
}

fn status(s: Status) -> Error {
    Error::Refused(format!("remote memory: {}", s.name()))
}

impl Client {
    fn await_cap(&self, tag: u64) -> Result<Capability, Error> {
        let deadline = Instant::now() + ANSWER;
        self.wait_until(deadline, |rx| rx.caps.remove(&tag))?
            .map_err(status)
    }

    fn await_done(&self, op: u64, deadline: Instant) -> Result<(Status, u64), Error> {
        self.wait_until(deadline, |rx| {
            let i = rx
                .pending
                .iter()
                .position(|e| matches!(e, Event::RemoteDone { op: o, .. } if *o == op))?;
            match rx.pending.remove(i) {
                Some(Event::RemoteDone { status, bytes, .. }) => Some((status, bytes)),
                _ => None,
            }
        })
    }

    /// Registers `len` bytes of the pool as a region others may access with `rights`
    /// (`rmem::READ`, `rmem::WRITE`); returns it with a capability for all of it.
    pub fn register_region(&self, len: u64, rights: u8) -> Result<LocalRegion, Error> {
        if len == 0 || len > u64::from(u32::MAX) {
            return Err(Error::TooLarge(len as usize));
        }
        let (pool_offset, id) = {
            let mut pool = self.pool.lock();
            let at = self.pool_alloc(&mut pool, len)?;
            pool.next_id = pool.next_id.wrapping_add(1).max(1);
            (at, pool.next_id)
        };
        let e = Sqe {
            op: rop::REGISTER,
            kind: rights,
            buf_id: id,
            aux: pool_offset,
            aux2: len,
            ..Sqe::default()
        };
        let cap = self
            .submit_entry(e, &[])
            .and_then(|()| self.await_cap(u64::from(id)));
        let mut pool = self.pool.lock();
        match cap {
            Ok(cap) => {
                pool.regions.insert(id, (pool_offset, len));
                Ok(LocalRegion {
                    id,
                    pool_offset,
                    len,
                    cap,
                })
            }
            Err(e) => {
                // Refused (or never submitted): the block is the pool's again.
                pool.free.push((pool_offset, len as u32));
                Err(e)
            }
        }
    }

    /// Whether `r` is a region this application registered, as registered.
    fn registered(&self, r: &LocalRegion) -> bool {
        self.pool.lock().regions.get(&r.id) == Some(&(r.pool_offset, r.len))
    }

    fn check_registered(&self, r: &LocalRegion) -> Result<(), Error> {
        if self.registered(r) {
            Ok(())
        } else {
            Err(Error::Refused(format!(
                "region {} is not one this application registered",
                r.id
            )))
        }
    }

    /// Removes a region and every capability for it.
    pub fn deregister_region(&self, r: &LocalRegion) -> Result<(), Error> {
        self.check_registered(r)?;
        let tag = self.next_tag(None);
        let e = Sqe {
            op: rop::DEREGISTER,
            tag,
            buf_id: r.id,
            ..Sqe::default()
        };
        self.submit_entry(e, &[])?;
        match self.await_done(tag, Instant::now() + ANSWER)? {
            (Status::Ok, _) => {
                let mut pool = self.pool.lock();
                if let Some((at, len)) = pool.regions.remove(&r.id) {
                    pool.free.push((at, len as u32));
                }
                Ok(())
            }
            (s, _) => Err(status(s)),
        }
    }

    /// A capability for `len` bytes at `offset` of `cap` with at most `rights`, valid for
    /// `ttl` (none: until revoked). Only the region's owner may narrow.
    pub fn narrow(
        &self,
        cap: &Capability,
        offset: u64,
        len: u64,
        rights: u8,
        ttl: Option<Duration>,
    ) -> Result<Capability, Error> {
        let tag = self.next_tag(None);
        let e = Sqe {
            op: rop::NARROW,
            kind: rights,
            tag,
            aux: offset,
            aux2: len,
            total_len: ttl.map_or(0, |t| t.as_secs().clamp(1, u64::from(u32::MAX)) as u32),
            ..Sqe::default()
        };
        self.submit_entry(e, &cap.encode())?;
        self.await_cap(tag)
    }

    /// Revokes `cap` and every capability narrowed from it.
    pub fn revoke(&self, cap: &Capability) -> Result<(), Error> {
        let tag = self.next_tag(None);
        let e = Sqe {
            op: rop::REVOKE,
            tag,
            ..Sqe::default()
        };
        self.submit_entry(e, &cap.encode())?;
        match self.await_done(tag, Instant::now() + ANSWER)? {
            (Status::Ok, _) => Ok(()),
            (s, _) => Err(status(s)),
        }
    }

    /// Arms a tripwire on `len` bytes at `offset` of region `r`: a remote write touching
    /// them raises [`Event::Tripwire`]. Returns its id.
    pub fn arm_tripwire(&self, r: &LocalRegion, offset: u64, len: u64) -> Result<u64, Error> {
        self.check_registered(r)?;
        let tag = self.next_tag(None);
        let e = Sqe {
            op: rop::ARM,
            tag,
            buf_id: r.id,
            aux: offset,
            aux2: len,
            ..Sqe::default()
        };
        self.submit_entry(e, &[])?;
        match self.await_done(tag, Instant::now() + ANSWER)? {
            (Status::Ok, _) => Ok(tag),
            (s, _) => Err(status(s)),
        }
    }

    /// Disarms tripwire `id` of region `r`.
    pub fn disarm_tripwire(&self, r: &LocalRegion, id: u64) -> Result<(), Error> {
        self.check_registered(r)?;
        let e = Sqe {
            op: rop::DISARM,
            tag: id,
            buf_id: r.id,
            ..Sqe::default()
        };
        self.submit_entry(e, &[])?;
        self.await_done(id, Instant::now() + ANSWER).map(|_| ())
    }

    /// Writes `data` at `offset` of `cap`'s bytes, without the remote application taking
    /// part; returns the operation's handle (its end: [`Event::RemoteDone`]).
    pub fn remote_write(
        &self,
        cap: &Capability,
        offset: u64,
        data: &[u8],
        opts: RemoteOptions,
    ) -> Result<u64, Error> {
        if data.len() as u64 > rmem_max() {
            return Err(Error::TooLarge(data.len()));
        }
        let tag = self.next_tag(None);
        let mut buf = Vec::with_capacity(rmem::CAP_LEN + data.len());
        buf.extend_from_slice(&cap.encode());
        buf.extend_from_slice(data);
        let e = Sqe {
            op: rop::WRITE,
            flags: flags(opts),
            tag,
            aux: offset,
            total_len: buf.len() as u32,
            ..Sqe::default()
        };
        self.submit_entry(e, &buf)?;
        Ok(tag)
    }

    /// Reads `len` bytes at `offset` of `cap`'s bytes into region `into` at `at`; returns
    /// the operation's handle.
    pub fn remote_read(
        &self,
        cap: &Capability,
        offset: u64,
        len: u64,
        into: &LocalRegion,
        at: u64,
        opts: RemoteOptions,
    ) -> Result<u64, Error> {
        self.check_registered(into)?;
        if at.checked_add(len).is_none_or(|e| e > into.len) {
            return Err(Error::TooLarge(len as usize));
        }
        let tag = self.next_tag(None);
        let e = Sqe {
            op: rop::READ,
            flags: flags(opts),
            tag,
            buf_id: into.id,
            dest: at,
            aux: offset,
            aux2: len,
            ..Sqe::default()
        };
        self.submit_entry(e, &cap.encode())?;
        Ok(tag)
    }

    /// Waits for remote operation `op` to end (other events are kept for `recv`).
    pub fn wait_remote(&self, op: u64, timeout: Duration) -> Result<(Status, u64), Error> {
        self.await_done(op, Instant::now() + timeout)
    }

    /// Copies `data` into this application's own region at `offset`; false when `r` is not
    /// a region it registered or the bytes do not fit it.
    pub fn region_write(&self, r: &LocalRegion, offset: u64, data: &[u8]) -> bool {
        self.registered(r)
            && offset
                .checked_add(data.len() as u64)
                .is_some_and(|e| e <= r.len)
            && self
                .region
                .copy_in(self.region.pool(), r.pool_offset + offset, data)
    }

    /// Copies bytes out of this application's own region at `offset`; false as for
    /// [`Client::region_write`].
    pub fn region_read(&self, r: &LocalRegion, offset: u64, out: &mut [u8]) -> bool {
        self.registered(r)
            && offset
                .checked_add(out.len() as u64)
                .is_some_and(|e| e <= r.len)
            && self
                .region
                .copy_out(self.region.pool(), r.pool_offset + offset, out)
    }
}

/// Largest remote write (torusd's limit).
fn rmem_max() -> u64 {
    64 << 20
}

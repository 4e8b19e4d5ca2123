//! Remote memory, as applications and torusd both see it: capabilities, rights, the status
//! of a finished operation, and the channel opcodes of remote-memory submissions and events.
//!
//! A region is part of an application's pool (the memory it shares with torusd). Its owner's
//! torusd hands out a [`Capability`] for it: which server and region, which bytes, which
//! rights, and an unguessable 64-bit cookie that torusd checks on every access. A capability
//! is plain bytes (40): applications pass it to others in messages. Only the owner can
//! narrow it (a new cookie for fewer bytes or rights) or revoke it.

/// Read right.
pub const READ: u8 = 1;
/// Write right.
pub const WRITE: u8 = 2;

/// Bytes of an encoded capability.
pub const CAP_LEN: usize = 40;

/// Access to bytes of a region on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capability {
    /// The server holding the region, packed (`channel::pack_coord`).
    pub server: u64,
    /// The owner's service id.
    pub owner: u16,
    /// [`READ`] | [`WRITE`].
    pub rights: u8,
    /// The owner's region id.
    pub region: u32,
    /// First byte of the region it grants.
    pub offset: u64,
    /// Bytes it grants.
    pub len: u64,
    /// The secret torusd checks.
    pub cookie: u64,
}

impl Capability {
    /// The 40-byte encoding.
    pub fn encode(&self) -> [u8; CAP_LEN] {
        let mut b = [0u8; CAP_LEN];
        b[0..8].copy_from_slice(&self.server.to_le_bytes());
        b[8..10].copy_from_slice(&self.owner.to_le_bytes());
        b[10] = self.rights;
        b[12..16].copy_from_slice(&self.region.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.cookie.to_le_bytes());
        b
    }

    /// Decodes 40 bytes (`None`: too short, or rights that mean nothing).
    pub fn decode(b: &[u8]) -> Option<Capability> {
        let b = b.get(..CAP_LEN)?;
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let rights = b[10];
        if rights & !(READ | WRITE) != 0 {
            return None;
        }
        Some(Capability {
            server: u64_at(0),
            owner: u16::from_le_bytes([b[8], b[9]]),
            rights,
            region: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            offset: u64_at(16),
            len: u64_at(24),
            cookie: u64_at(32),
        })
    }
}

/// How a remote-memory operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// No such capability at the target (a wrong cookie).
    BadCookie = 1,
    /// The capability was revoked.
    Revoked = 2,
    /// The capability expired.
    Expired = 3,
    /// Outside the bytes the capability grants.
    OutOfRange = 4,
    /// The capability lacks the right.
    NoRight = 5,
    /// The region is gone (its owner exited or deregistered it).
    NoRegion = 6,
    /// The target server failed, restarted or became unreachable.
    PeerFailed = 7,
    /// No answer by the deadline.
    Timeout = 8,
    /// Refused before it was sent (malformed, too large, a bad local region).
    Invalid = 9,
}

impl Status {
    /// From its code (unknown codes read as `Invalid`).
    pub fn from_code(c: u8) -> Status {
        match c {
            0 => Status::Ok,
            1 => Status::BadCookie,
            2 => Status::Revoked,
            3 => Status::Expired,
            4 => Status::OutOfRange,
            5 => Status::NoRight,
            6 => Status::NoRegion,
            7 => Status::PeerFailed,
            8 => Status::Timeout,
            _ => Status::Invalid,
        }
    }

    /// A short name, for counters and errors.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("invalid")
    }

    /// The same name, NUL-terminated (the C ABI's `torus_rm_status_name`).
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Status::Ok => c"ok",
            Status::BadCookie => c"bad cookie",
            Status::Revoked => c"revoked",
            Status::Expired => c"expired",
            Status::OutOfRange => c"out of range",
            Status::NoRight => c"no right",
            Status::NoRegion => c"no region",
            Status::PeerFailed => c"peer failed",
            Status::Timeout => c"timed out",
            Status::Invalid => c"invalid",
        }
    }
}

/// Remote-memory submission opcodes (beside `channel::op`).
pub mod op {
    /// Register pool bytes as region `buf_id`: offset `aux`, length `aux2`, rights in
    /// `kind`. Answered with `RM_CAP` (tag = region id).
    pub const REGISTER: u8 = 16;
    /// Remove region `buf_id` and every capability of it.
    pub const DEREGISTER: u8 = 17;
    /// Mint a narrower capability from the one in the data (40 bytes): offset `aux` and
    /// length `aux2` relative to it, rights in `kind`, lifetime in seconds in `total_len`
    /// (0: none). Answered with `RM_CAP` (tag).
    pub const NARROW: u8 = 18;
    /// Revoke the capability in the data (and those narrowed from it).
    pub const REVOKE: u8 = 19;
    /// Write the bytes after the capability (data: capability, then bytes) at offset `aux`
    /// of it. Answered with `RM_DONE` (tag).
    pub const WRITE: u8 = 20;
    /// Read `aux2` bytes at offset `aux` of the capability in the data into local region
    /// `buf_id` at offset `dest` (the SQE's dest field). Answered with `RM_DONE` (tag).
    pub const READ: u8 = 21;
    /// Arm tripwire `tag` on region `buf_id`, bytes `aux` .. `aux + aux2`.
    pub const ARM: u8 = 22;
    /// Disarm tripwire `tag` of region `buf_id`.
    pub const DISARM: u8 = 23;
}

/// Remote-memory submission flags (beside `channel::sflag`'s fences).
pub mod flag {
    /// Tell the region's owner when the write has landed (`RM_WRITTEN`).
    pub const NOTIFY: u8 = 32;
}

/// Remote-memory completion kinds (beside `channel::cq`).
pub mod cq {
    /// Operation `tag` ended: `reason` is its [`super::Status`], `count` the bytes moved.
    pub const RM_DONE: u8 = 16;
    /// A capability (the data, 40 bytes) for request `tag`, or `reason` why none.
    pub const RM_CAP: u8 = 17;
    /// Tripwire `tag` was touched by a write from `peer`: region `extra`, the write's
    /// offset in `count` and length in `total_len`.
    pub const RM_TRIPWIRE: u8 = 18;
    /// A write with NOTIFY from `peer` landed in region `extra`: `count` offset, `total_len`
    /// length.
    pub const RM_WRITTEN: u8 = 19;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_round_trip_and_bad_rights_are_refused() {
        let c = Capability {
            server: crate::channel::pack_coord(1, 2, 0),
            owner: 2000,
            rights: READ | WRITE,
            region: 7,
            offset: 4096,
            len: 65536,
            cookie: 0xdead_beef_0bad_cafe,
        };
        assert_eq!(Capability::decode(&c.encode()), Some(c));
        let mut b = c.encode();
        b[10] = 0x80;
        assert_eq!(Capability::decode(&b), None);
        assert_eq!(Capability::decode(&b[..39]), None);
        for s in 0..=10 {
            assert_eq!(Status::from_code(s) as u8, s.min(9));
        }
    }
}

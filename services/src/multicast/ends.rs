//! Where a transfer's bytes come from (the root's [`Source`]) and where members deliver them
//! (a [`Sink`] per transfer, opened by the host's [`Sinks`]).

use super::wire::Transfer;

/// The bytes a root multicasts. It reads each chunk when it first sends it and again when a
/// member asks for it, so they must stay unchanged until the transfer ends.
pub trait Source: Send + Sync + std::fmt::Debug {
    /// How many.
    fn len(&self) -> u64;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `out.len()` of them from `offset` (false: out of bounds).
    fn read(&self, offset: u64, out: &mut [u8]) -> bool;
}

impl Source for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        let Ok(start) = usize::try_from(offset) else {
            return false;
        };
        match start
            .checked_add(out.len())
            .and_then(|end| self.get(start..end))
        {
            Some(b) => {
                out.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

/// Where a member delivers a transfer for its service: the bytes in order, then the end.
pub trait Sink: Send + std::fmt::Debug {
    /// The transfer's bytes at `offset` (in order, each once): `Ok(true)` taken, `Ok(false)`
    /// no room now (offered again on a later poll), `Err` why it will never take any more
    /// (its application left): the member reports that to the root.
    fn deliver(&mut self, t: &Transfer, offset: u64, data: &[u8]) -> Result<bool, String>;
    /// The transfer ended here: every byte was delivered (`complete`), or the root gave
    /// up on it (or it was forgotten).
    fn end(&mut self, t: &Transfer, complete: bool);
    /// Whether everything it took of `t`, and the end, has reached its receiver (`Err`: it
    /// never will, and why). The member reports the transfer done only then, so a member
    /// counted complete is one whose receiver has every byte.
    fn flushed(&mut self, t: &Transfer) -> Result<bool, String> {
        let _ = t;
        Ok(true)
    }
}

/// Opens the [`Sink`]s of the services on this server (torusd: its applications).
pub trait Sinks: Send + std::fmt::Debug {
    /// The sink of transfer `t` for `t.service`, or why none can take it (reported to the
    /// root).
    fn open(&mut self, t: &Transfer) -> Result<Box<dyn Sink>, String>;
}

//! The check a reliable message to a routing key meets where it arrives: the engine's
//! (`crate::node`) key messages travel to the reserved service [`KEYED`], and this server's
//! transport admits one only when a [`KeyGate`] says it takes it (this server is the key's
//! root in its view, and the service it is for is here); otherwise it is refused like a
//! message for a service that is not hosted, and its sender's transport reports it failed
//! with the gate's reason ([`FailReason::NotRoot`]), whose engine sends it to the key's root
//! again. The transport knows nothing of keys: the engine installs the gate.

use super::FailReason;
use crate::topology::Coord;

/// The reserved service id of reliable messages to a key (one of torusd's own ids, below
/// 64, beside [`super::NOTICES`]). Ids from here up are the transport's and the engine's.
pub const KEYED: u16 = 62;

/// Whether this server takes a message to [`KEYED`] as it arrives.
pub trait KeyGate: Send + std::fmt::Debug {
    /// `Ok` to take message `data` from `src`, or why not.
    fn admit(&mut self, src: Coord, data: &[u8]) -> Result<(), FailReason>;
}

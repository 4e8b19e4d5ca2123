//! The transport's own messages to a peer's transport: a receiver that refused reliable
//! messages because no service there takes them, or because the service's queue is full,
//! names them to their sender, whose transport reports them failed
//! ([`FailReason::NoService`], [`FailReason::ReceiverFull`]) to the service that sent them.
//!
//! A notice travels as a reliable message to the reserved service [`NOTICES`], which no
//! service or application may send to. A message is named by its message number in the
//! connection (which both ends know) and the service it was for, not by the sender's tag
//! (which only the sender knows). Layout: a kind byte (1: refused for want of a service,
//! 2: refused because the service's queue was full, 3: a message to a key refused by a
//! server that is not the key's root), then entries of service (u16) and
//! message number (u64), big-endian.

use super::FailReason;

/// The reserved service id of transport notices (one of torusd's own ids, below 64).
pub const NOTICES: u16 = 63;

/// Kind byte: messages refused because their service is not hosted.
const NO_SERVICE: u8 = 1;
/// Kind byte: messages refused because their service's queue was full.
const RECEIVER_FULL: u8 = 2;
/// Kind byte: messages to a key refused because this server is not the key's root.
const NOT_ROOT: u8 = 3;
const ENTRY: usize = 10;

/// Each reason a notice can give with its kind byte, in the order a receiver settles them.
const KINDS: [(FailReason, u8); 3] = [
    (FailReason::NoService, NO_SERVICE),
    (FailReason::ReceiverFull, RECEIVER_FULL),
    (FailReason::NotRoot, NOT_ROOT),
];

/// The reasons a notice can give, in the order a receiver settles them.
pub const REASONS: [FailReason; 3] = [KINDS[0].0, KINDS[1].0, KINDS[2].0];

/// Most entries in one notice (a notice stays well inside one frame).
pub const MAX_ENTRIES: usize = 128;

/// The (service, number) pairs of `entries` that were refused for `reason`.
pub fn of_reason(entries: &[(u16, u64, FailReason)], reason: FailReason) -> Vec<(u16, u64)> {
    entries
        .iter()
        .filter(|e| e.2 == reason)
        .map(|&(s, n, _)| (s, n))
        .collect()
}

/// Encodes a notice naming `refused` (service, message number), all for `reason` (one of
/// [`REASONS`]), into `out`.
pub fn encode(reason: FailReason, refused: &[(u16, u64)], out: &mut Vec<u8>) {
    out.clear();
    let kind = KINDS
        .iter()
        .find(|k| k.0 == reason)
        .map_or(NO_SERVICE, |k| k.1);
    out.push(kind);
    for &(service, msn) in refused {
        out.extend_from_slice(&service.to_be_bytes());
        out.extend_from_slice(&msn.to_be_bytes());
    }
}

/// The reason and entries of a notice, or `None` when it is not one this transport
/// understands (an unknown kind, a torn entry): the caller counts it and ignores it.
pub fn decode(data: &[u8]) -> Option<(FailReason, impl Iterator<Item = (u16, u64)> + '_)> {
    let (&kind, body) = data.split_first()?;
    let reason = KINDS.iter().find(|k| k.1 == kind)?.0;
    if body.is_empty() || body.len() % ENTRY != 0 {
        return None;
    }
    Some((
        reason,
        body.chunks_exact(ENTRY).map(|e| {
            let mut msn = [0u8; 8];
            msn.copy_from_slice(&e[2..]);
            (u16::from_be_bytes([e[0], e[1]]), u64::from_be_bytes(msn))
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_read_back_and_bad_ones_are_refused() {
        let refused = [(7u16, 0u64), (4000, 1 << 40), (65535, u64::MAX)];
        let mut b = Vec::new();
        for reason in REASONS {
            encode(reason, &refused, &mut b);
            let (r, back) = decode(&b).map(|(r, e)| (r, e.collect::<Vec<_>>())).unwrap();
            assert_eq!((r, back.as_slice()), (reason, &refused[..]));
        }
        assert!(decode(&[]).is_none());
        assert!(decode(&[NO_SERVICE]).is_none());
        assert!(decode(&b[..b.len() - 1]).is_none());
        let mut other = b.clone();
        other[0] = 9;
        assert!(decode(&other).is_none());
    }
}

//! The header of the engine's reliable messages to keys (service `transport::KEYED`,
//! docs/wire.md "Reserved services").

/// Bytes before a reliable key message's data (the engine's, to the reserved service
/// `transport::KEYED`): the routing key (u64), the service it is for (u16), the service
/// that sent it (u16), the sender's id for it (u64), big-endian. A receipt, from the root
/// back to the sender, names [`KEYED_RECEIPT`] as its service and carries no data.
pub const KEYED_HEADER: usize = 20;

/// The service field of a key message's receipt.
pub const KEYED_RECEIPT: u16 = 0;

/// A key message's header, as [`put_keyed_header`] writes it and [`keyed_header`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedHeader {
    /// The routing key.
    pub key: u64,
    /// The service it is for ([`KEYED_RECEIPT`]: a receipt).
    pub service: u16,
    /// The service that sent it.
    pub from: u16,
    /// The sender's id for it.
    pub id: u64,
}

/// Appends a key message's header to `out`.
pub fn put_keyed_header(out: &mut Vec<u8>, h: KeyedHeader) {
    out.extend_from_slice(&h.key.to_be_bytes());
    out.extend_from_slice(&h.service.to_be_bytes());
    out.extend_from_slice(&h.from.to_be_bytes());
    out.extend_from_slice(&h.id.to_be_bytes());
}

/// A key message's header and data; `None` when it is too short to be one.
pub fn keyed_header(m: &[u8]) -> Option<(KeyedHeader, &[u8])> {
    let h = m.get(..KEYED_HEADER)?;
    let u64_at = |i: usize| {
        h.get(i..i + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    };
    Some((
        KeyedHeader {
            key: u64_at(0)?,
            service: u16::from_be_bytes([h[8], h[9]]),
            from: u16::from_be_bytes([h[10], h[11]]),
            id: u64_at(12)?,
        },
        &m[KEYED_HEADER..],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_and_short_input_is_refused() {
        let h = KeyedHeader {
            key: 0x0123_4567_89ab_cdef,
            service: 41,
            from: 40,
            id: 7,
        };
        let mut b = Vec::new();
        put_keyed_header(&mut b, h);
        assert_eq!(b.len(), KEYED_HEADER);
        b.extend_from_slice(b"data");
        assert_eq!(keyed_header(&b), Some((h, &b"data"[..])));
        for n in 0..KEYED_HEADER {
            assert_eq!(keyed_header(&b[..n]), None);
        }
        // Any bytes of the right length are a header (the gate judges what they say).
        let mut rng = crate::rng::SplitMix64::new(9);
        for _ in 0..1000 {
            let n = rng.below(64) as usize;
            let v: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            assert_eq!(keyed_header(&v).is_some(), n >= KEYED_HEADER);
        }
    }
}

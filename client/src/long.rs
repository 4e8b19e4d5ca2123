//! Long send (libRIPC): instead of pushing a large message through its channel and the
//! transport, the sender offers it: a small message carries a read-only capability for the
//! bytes in one of its regions, and the receiver pulls them with one-sided remote reads into
//! a region of its own, when and where it wants. The sender's application does no work
//! while the bytes move (its torusd serves the reads); it learns from the receiver's
//! answer, [`Event::LongDone`], when it may reuse the buffer. Every offer ends: pulled,
//! declined, failed, or expired at its deadline (the capability dies with it, so a late
//! read is refused).

use std::time::{Duration, Instant};

use crate::channel::{kind, pack_coord, unpack_coord};
use crate::rmem::{self, Capability, Status, CAP_LEN};
use crate::{Address, Client, Dest, Error, Event, LocalRegion, RemoteOptions, SendOptions};

/// Bytes of an encoded offer.
pub const OFFER_LEN: usize = 8 + 2 + 8 + 8 + CAP_LEN;

/// The most one remote read moves (torusd's limit): a longer pull is several reads.
const READ_MAX: u64 = 64 << 20;

/// A long message offered to this application: pull it ([`Client::pull`]) or decline it
/// ([`Client::decline`]). Plain bytes too ([`LongOffer::encode`]), for C and Python.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongOffer {
    /// Who offers it.
    pub from: Address,
    /// The offer's id (the sender's tag for it).
    pub offer: u64,
    /// Bytes.
    pub len: u64,
    /// Read access to them.
    pub cap: Capability,
}

impl LongOffer {
    /// Its encoding: sender (packed server, service), id, length, capability.
    pub fn encode(&self) -> [u8; OFFER_LEN] {
        let mut b = [0u8; OFFER_LEN];
        let (x, y, z) = self.from.server;
        b[0..8].copy_from_slice(&pack_coord(x, y, z).to_le_bytes());
        b[8..10].copy_from_slice(&self.from.service.to_le_bytes());
        b[10..18].copy_from_slice(&self.offer.to_le_bytes());
        b[18..26].copy_from_slice(&self.len.to_le_bytes());
        b[26..].copy_from_slice(&self.cap.encode());
        b
    }

    /// Decodes [`LongOffer::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Option<LongOffer> {
        let b = b.get(..OFFER_LEN)?;
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        Some(LongOffer {
            from: Address {
                server: unpack_coord(u64_at(0)?),
                service: u16::from_le_bytes([b[8], b[9]]),
            },
            offer: u64_at(10)?,
            len: u64_at(18)?,
            cap: Capability::decode(&b[26..])?,
        })
    }
}

/// How a long send ended, as its sender learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongEnd {
    /// The receiver pulled all of it.
    Pulled,
    /// The receiver declined it.
    Declined,
    /// The receiver's reads failed (the offer's capability was refused, or the sender's
    /// server failed).
    Failed,
    /// Nobody pulled it before its deadline.
    Expired,
}

impl LongEnd {
    /// Its code on the wire (and C's `TORUS_LONG_*`).
    pub fn code(self) -> u8 {
        match self {
            LongEnd::Pulled => 1,
            LongEnd::Declined => 2,
            LongEnd::Failed => 3,
            LongEnd::Expired => 4,
        }
    }

    fn from_code(c: u8) -> Option<LongEnd> {
        Some(match c {
            1 => LongEnd::Pulled,
            2 => LongEnd::Declined,
            3 => LongEnd::Failed,
            4 => LongEnd::Expired,
            _ => return None,
        })
    }
}

/// How a long send is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongOptions {
    /// How long the receiver has to pull it; then it ends [`LongEnd::Expired`] and its
    /// capability is refused. Whole seconds (the capability's expiry), at least one.
    pub ttl: Duration,
}

impl Default for LongOptions {
    fn default() -> LongOptions {
        LongOptions {
            ttl: Duration::from_secs(30),
        }
    }
}

/// An offer this application made and that has not ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outstanding {
    cap: Capability,
    deadline: Instant,
}

/// What a long send's message says, once parsed (`receive.rs`).
pub(crate) enum LongMessage {
    Offer(LongOffer),
    Done { offer: u64, end: LongEnd },
}

/// Parses a long send's message of kind `k` from `from`.
pub(crate) fn parse(k: u8, from: Address, body: &[u8]) -> Option<LongMessage> {
    let u64_at = |i: usize| Some(u64::from_le_bytes(body.get(i..i + 8)?.try_into().ok()?));
    match k {
        kind::LONG_OFFER => Some(LongMessage::Offer(LongOffer {
            from,
            offer: u64_at(0)?,
            len: u64_at(8)?,
            cap: Capability::decode(body.get(16..)?)?,
        })),
        kind::LONG_DONE => Some(LongMessage::Done {
            offer: u64_at(0)?,
            end: LongEnd::from_code(*body.get(8)?)?,
        }),
        _ => None,
    }
}

impl Client {
    /// Offers `len` bytes at `offset` of this application's region `r` to `to`; returns
    /// the offer's id. The bytes must stay as they are until [`Event::LongDone`] for it
    /// arrives (or its offer message is reported [`Event::Failed`], with the same id).
    pub fn send_long(
        &self,
        to: Dest,
        r: &LocalRegion,
        offset: u64,
        len: u64,
        opts: LongOptions,
    ) -> Result<u64, Error> {
        let ttl = opts.ttl.max(Duration::from_secs(1));
        // A read-only window of just these bytes, dying at the deadline: the receiver can
        // read nothing else, and nothing after.
        let cap = self.narrow(&r.cap, offset, len, rmem::READ, Some(ttl))?;
        let offer = self.next_tag(None);
        let mut body = Vec::with_capacity(16 + CAP_LEN);
        body.extend_from_slice(&offer.to_le_bytes());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(&cap.encode());
        self.offers.lock().insert(
            offer,
            Outstanding {
                cap,
                deadline: Instant::now() + ttl,
            },
        );
        let sent = self.submit(
            to,
            &body,
            SendOptions {
                tag: Some(offer),
                ..SendOptions::reliable()
            },
            kind::LONG_OFFER,
            None,
        );
        if let Err(e) = sent {
            self.offers.lock().remove(&offer);
            let _ = self.revoke(&cap);
            return Err(e);
        }
        Ok(offer)
    }

    /// Pulls an offered long message into this application's region `into` at `at` with
    /// remote reads (64 MiB each, all in flight at once), then tells the sender; waits at
    /// most `timeout`. On failure the sender is told too, and the error says why.
    pub fn pull(
        &self,
        offer: &LongOffer,
        into: &LocalRegion,
        at: u64,
        timeout: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let mut ops = Vec::new();
        let mut done = 0;
        let mut failed = None;
        while done < offer.len {
            let n = (offer.len - done).min(READ_MAX);
            match self.remote_read(
                &offer.cap,
                done,
                n,
                into,
                at + done,
                RemoteOptions::default(),
            ) {
                Ok(op) => ops.push(op),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            done += n;
        }
        // Every read issued is waited for, also after a failure: none is left to land in
        // the region later.
        for op in ops {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.wait_remote(op, left) {
                Ok((Status::Ok, _)) => {}
                Ok((s, _)) => {
                    failed.get_or_insert(Error::Refused(format!(
                        "long send {}: a read ended {}",
                        offer.offer,
                        s.name()
                    )));
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let end = if failed.is_some() {
            LongEnd::Failed
        } else {
            LongEnd::Pulled
        };
        let told = self.answer(offer, end);
        match failed {
            Some(e) => Err(e),
            None => told,
        }
    }

    /// Declines an offered long message (its sender may reuse the buffer at once).
    pub fn decline(&self, offer: &LongOffer) -> Result<(), Error> {
        self.answer(offer, LongEnd::Declined)
    }

    fn answer(&self, offer: &LongOffer, end: LongEnd) -> Result<(), Error> {
        let mut body = [0u8; 9];
        body[..8].copy_from_slice(&offer.offer.to_le_bytes());
        body[8] = end.code();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.submit(
                Dest::Service(offer.from),
                &body,
                SendOptions::reliable(),
                kind::LONG_DONE,
                None,
            ) {
                Err(Error::WouldBlock) if Instant::now() < deadline => self.stash_one()?,
                r => return r.map(|_| ()),
            }
        }
    }

    /// What `recv` does with an event about one of this application's offers before
    /// returning it: an ended offer's capability is revoked (the receiver can read nothing
    /// more). False for an end of an offer that had ended already (expired, then answered
    /// late): each offer ends once.
    pub(crate) fn settle_offer(&self, e: &Event) -> bool {
        let (offer, answer) = match e {
            Event::LongDone { offer, .. } => (*offer, true),
            Event::Failed { tag, .. } => (*tag, false),
            _ => return true,
        };
        let ended = self.offers.lock().remove(&offer);
        match ended {
            Some(o) => {
                // Best effort: the capability expires at the deadline anyway.
                let _ = self.revoke(&o.cap);
                true
            }
            None => !answer,
        }
    }

    /// An offer whose deadline has passed, ended as expired (its capability revoked), if
    /// any; and when the next one falls due.
    pub(crate) fn expired_offer(&self) -> (Option<Event>, Option<Instant>) {
        let now = Instant::now();
        let mut offers = self.offers.lock();
        let due = offers
            .iter()
            .find(|(_, o)| o.deadline <= now)
            .map(|(id, _)| *id);
        let next = offers.values().map(|o| o.deadline).min();
        let Some(id) = due else {
            return (None, next);
        };
        let o = offers.remove(&id);
        drop(offers);
        if let Some(o) = o {
            let _ = self.revoke(&o.cap);
        }
        let e = Event::LongDone {
            peer: None,
            offer: id,
            end: LongEnd::Expired,
        };
        (Some(e), None)
    }

    /// Whether this application has offers outstanding (so `recv` must wake for their
    /// deadlines).
    pub(crate) fn has_offers(&self) -> bool {
        !self.offers.lock().is_empty()
    }
}

/// The event a long send's message becomes.
pub(crate) fn event(from: Address, m: LongMessage) -> Event {
    match m {
        LongMessage::Offer(o) => Event::LongOffer(o),
        LongMessage::Done { offer, end } => Event::LongDone {
            peer: Some(from.server),
            offer,
            end,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer() -> LongOffer {
        LongOffer {
            from: Address {
                server: (1, 2, 3),
                service: 4321,
            },
            offer: 77,
            len: 256 << 20,
            cap: Capability {
                server: pack_coord(1, 2, 3),
                owner: 4321,
                rights: rmem::READ,
                region: 9,
                offset: 4096,
                len: 256 << 20,
                cookie: 0xDEAD_BEEF_F00D,
            },
        }
    }

    #[test]
    fn an_offer_survives_its_encoding_and_a_short_or_bad_one_is_refused() {
        let o = offer();
        let b = o.encode();
        assert_eq!(LongOffer::decode(&b), Some(o));
        for n in 0..OFFER_LEN {
            assert_eq!(LongOffer::decode(&b[..n]), None, "{n} bytes");
        }
        let mut bad = b;
        bad[26 + 10] = 0x80; // rights that mean nothing
        assert_eq!(LongOffer::decode(&bad), None);
    }

    #[test]
    fn the_wire_messages_parse_and_garbage_does_not() {
        let o = offer();
        let mut body = Vec::new();
        body.extend_from_slice(&o.offer.to_le_bytes());
        body.extend_from_slice(&o.len.to_le_bytes());
        body.extend_from_slice(&o.cap.encode());
        match parse(kind::LONG_OFFER, o.from, &body) {
            Some(LongMessage::Offer(p)) => assert_eq!(p, o),
            _ => panic!("an offer"),
        }
        for n in 0..body.len() {
            assert!(parse(kind::LONG_OFFER, o.from, &body[..n]).is_none());
        }
        let mut done = 77u64.to_le_bytes().to_vec();
        for end in [
            LongEnd::Pulled,
            LongEnd::Declined,
            LongEnd::Failed,
            LongEnd::Expired,
        ] {
            done.truncate(8);
            done.push(end.code());
            match parse(kind::LONG_DONE, o.from, &done) {
                Some(LongMessage::Done { offer: 77, end: e }) => assert_eq!(e, end),
                _ => panic!("a done"),
            }
        }
        done[8] = 0;
        assert!(parse(kind::LONG_DONE, o.from, &done).is_none());
        assert!(parse(kind::DATA, o.from, &body).is_none());
    }
}

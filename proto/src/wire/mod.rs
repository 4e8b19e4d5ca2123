//! The torus frame format (docs/wire.md): an Ethernet header, a fixed 66-byte torus
//! header, and a payload that is either one message (or one fragment of one) or, in
//! aggregated frames, many small messages each behind a 6-byte message header.
//!
//! Every field sits at a fixed offset so the dataplane reads what it needs without
//! parsing the rest. [`FrameView`] is a checked, zero-copy view over untrusted bytes;
//! [`Header`] is the parsed meaning, which [`Header::emit`] writes back. Nothing here
//! allocates, and no input makes it panic.

mod keyed;
pub use keyed::{keyed_header, put_keyed_header, KeyedHeader, KEYED_HEADER, KEYED_RECEIPT};

use crate::topology::Coord;

/// EtherType of torus data frames (redirected to AF_XDP by the XDP program).
pub const ETHERTYPE_DATA: u16 = 0x88B5;
/// EtherType of torus control frames (passed to the kernel, read by the control process).
pub const ETHERTYPE_CONTROL: u16 = 0x88B6;
/// The only header version this code speaks.
pub const VERSION: u8 = 1;
/// Bytes of the Ethernet header (no VLAN tag: torus links are point-to-point).
pub const ETH_LEN: usize = 14;
/// Bytes of the torus header.
pub const TORUS_LEN: usize = 66;
/// Bytes before the payload: Ethernet plus torus header.
pub const HEADERS_LEN: usize = ETH_LEN + TORUS_LEN;
/// Bytes of the per-message header inside an aggregated frame.
pub const MSG_HEADER_LEN: usize = 6;
/// Default hop budget of a new frame; a 3D torus of 65535 per axis has diameter 98301, but
/// real deployments are far smaller and a looping frame must die quickly.
pub const DEFAULT_TTL: u8 = 64;

/// Byte offsets of the torus header's fields, from the start of the Ethernet frame.
pub mod offset {
    use super::ETH_LEN;
    /// EtherType, u16.
    pub const ETHERTYPE: usize = 12;
    /// Header version, u8.
    pub const VERSION: usize = ETH_LEN;
    /// Frame kind, u8.
    pub const KIND: usize = ETH_LEN + 1;
    /// Flags, u16.
    pub const FLAGS: usize = ETH_LEN + 2;
    /// Remaining hop budget, u8.
    pub const TTL: usize = ETH_LEN + 4;
    /// Hops travelled so far, u8.
    pub const HOPS: usize = ETH_LEN + 5;
    /// Service id, u16.
    pub const SERVICE: usize = ETH_LEN + 6;
    /// Source coordinate, 3 x u16.
    pub const SRC: usize = ETH_LEN + 8;
    /// Payload length, u16.
    pub const PAYLOAD_LEN: usize = ETH_LEN + 14;
    /// Destination: a coordinate (3 x u16 + u16 zero) or a routing key (u64).
    pub const DST: usize = ETH_LEN + 16;
    /// The sender's connection id (drawn afresh for every connection instance), u32.
    pub const CONN: usize = ETH_LEN + 24;
    /// Sequence number, u32.
    pub const SEQ: usize = ETH_LEN + 28;
    /// Cumulative acknowledgement (next sequence expected), u32.
    pub const ACK: usize = ETH_LEN + 32;
    /// Message number of the frame's (first) message in its connection, u32.
    pub const MSN: usize = ETH_LEN + 36;
    /// Fragment index within a reliable message, u32.
    pub const FRAG: usize = ETH_LEN + 40;
    /// Distance back, in message numbers, to the latest forward-fenced message before the
    /// frame's first message (0: none), u32.
    pub const FENCE: usize = ETH_LEN + 44;
    /// Selective-ack bitmap, u64: bit i set = frame `ack + 1 + i` was received.
    pub const SACK: usize = ETH_LEN + 48;
    /// The receiver's connection id as the sender knows it (0: not yet known), u32.
    pub const PEER_CONN: usize = ETH_LEN + 56;
    /// Hops of the source route that follows the header (0: none), u8.
    pub const ROUTE_LEN: usize = ETH_LEN + 60;
    /// Index in the source route of the next hop to take, u8.
    pub const ROUTE_NEXT: usize = ETH_LEN + 61;
    /// The receive window the frame's sender grants its peer, in frames past the
    /// acknowledgement (0: not stated; the peer's own window applies), u16.
    pub const RWND: usize = ETH_LEN + 62;
    /// In-band telemetry: the load of the most loaded link the frame crossed, in hundredths
    /// of the link's capacity (queue included: over 100 means a queue stands), written by
    /// the sender and raised by every forwarder (poller or XDP program), u8.
    pub const CONG: usize = ETH_LEN + 64;
    /// The receiver's echo of `CONG`: the most loaded link its peer's frames crossed since
    /// it last told the peer, u8.
    pub const CONG_ECHO: usize = ETH_LEN + 65;
}

/// Most hops a source route may name: a shortest path in a 16x16x16 torus is 24 hops, a
/// detour round a failure a few more.
pub const MAX_ROUTE_HOPS: usize = 32;

/// Why bytes were refused as a torus frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the headers need.
    #[error("frame truncated: {have} bytes, headers need {need}")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Not one of the torus EtherTypes.
    #[error("not a torus frame: EtherType {0:#06x}")]
    EtherType(u16),
    /// A header version this code does not speak.
    #[error("unsupported torus header version {0}")]
    Version(u8),
    /// A frame kind this code does not know.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Flag bits that are reserved in this version.
    #[error("reserved flag bits set: {0:#06x}")]
    ReservedFlags(u16),
    /// The payload length field claims more bytes than the frame holds.
    #[error("payload length {claimed} exceeds the {have} bytes after the headers")]
    PayloadLength {
        /// Length the header claims.
        claimed: usize,
        /// Bytes actually after the headers.
        have: usize,
    },
    /// A coordinate destination with a non-zero padding field.
    #[error("coordinate destination has non-zero padding")]
    DstPadding,
    /// A source route that is too long, points past its end, names no direction, or
    /// whose fields are set on a frame without the `SOURCE_ROUTED` flag.
    #[error("malformed source route: {0}")]
    Route(&'static str),
    /// An aggregated message header that runs past the end of the payload.
    #[error("aggregated message at offset {at} runs past the payload ({len} bytes)")]
    MessageOverrun {
        /// Offset of the message header within the payload.
        at: usize,
        /// Payload length.
        len: usize,
    },
    /// An aggregated message header with reserved bits set.
    #[error("aggregated message at offset {0} has reserved bits set")]
    MessageReserved(usize),
    /// A buffer too small to emit into.
    #[error("buffer of {have} bytes cannot hold {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
}

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Application data: one message, one fragment, or many aggregated messages.
    Data = 0,
    /// A pure acknowledgement (cumulative ack plus selective bitmap).
    Ack = 1,
    /// A negative acknowledgement: the receiver saw a gap; `ack` is the first missing
    /// frame and the bitmap says which later ones did arrive.
    Nack = 2,
    /// An in-band control message between dataplanes.
    Control = 3,
    /// Connection setup and reset: the sender's connection id (`conn`), the receiver's as
    /// the sender knows it (`peer_conn`, 0 when unknown) and, as an 8-byte payload, the
    /// sender's incarnation (drawn at every start of its dataplane).
    Sync = 4,
    /// A path probe of source routing: a probe travelling a source route (every hop lowers
    /// the available bandwidth it carries to its links' figure), the destination's reply,
    /// or a path-failure report from the hop that could not go on (payload:
    /// `crate::routing::probe`).
    Probe = 5,
}

impl Kind {
    /// The kind numbered `v`.
    pub fn from_u8(v: u8) -> Result<Kind, WireError> {
        match v {
            0 => Ok(Kind::Data),
            1 => Ok(Kind::Ack),
            2 => Ok(Kind::Nack),
            3 => Ok(Kind::Control),
            4 => Ok(Kind::Sync),
            5 => Ok(Kind::Probe),
            other => Err(WireError::Kind(other)),
        }
    }
}

/// Frame flag bits (the torus header's `flags` field).
pub mod flags {
    /// Backward fence: deliver only after every earlier message of the connection.
    pub const BWD_FENCE: u16 = 1 << 0;
    /// Forward fence: deliver no later message of the connection before this one.
    pub const FWD_FENCE: u16 = 1 << 1;
    /// The payload is a sequence of messages, each behind a message header.
    pub const AGGREGATED: u16 = 1 << 2;
    /// The destination field is a 64-bit routing key, not a coordinate.
    pub const KEY_ROUTED: u16 = 1 << 3;
    /// The frame belongs to a reliable connection (sequence numbers are meaningful).
    pub const RELIABLE: u16 = 1 << 4;
    /// First fragment of a reliable message.
    pub const FRAG_FIRST: u16 = 1 << 5;
    /// Last fragment of a reliable message.
    pub const FRAG_LAST: u16 = 1 << 6;
    /// The `ack` field carries a cumulative acknowledgement (piggybacked on data).
    pub const ACK_VALID: u16 = 1 << 7;
    /// The `sack` field carries a selective-ack bitmap.
    pub const SACK_VALID: u16 = 1 << 8;
    /// Services on the path ask to see this frame at every hop.
    pub const INTERCEPT: u16 = 1 << 9;
    /// This frame is a retransmission (for counters and traces only).
    pub const RETRANSMIT: u16 = 1 << 10;
    /// A source route follows the header: forwarders take the hop it names, not their
    /// own choice. Derived from the header's route length when emitting.
    pub const SOURCE_ROUTED: u16 = 1 << 11;
    /// The sender's window is full with this frame: acknowledge it at once, not after the
    /// delayed-ACK timer (a congestion window of a few frames would wait for it every round).
    pub const ACK_NOW: u16 = 1 << 12;
    /// Every bit this version defines.
    pub const KNOWN: u16 = (1 << 13) - 1;
}

/// Per-message flag bits inside an aggregated frame.
pub mod msg_flags {
    /// Backward fence for this message.
    pub const BWD_FENCE: u8 = 1 << 0;
    /// Forward fence for this message.
    pub const FWD_FENCE: u8 = 1 << 1;
    /// Every bit this version defines.
    pub const KNOWN: u8 = 0b11;
}

/// Where a frame is going: a server, or whichever server roots a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dest {
    /// A server by coordinate.
    Server(Coord),
    /// The root of a routing key, re-evaluated at every hop.
    Key(u64),
}

/// The parsed torus header: what a frame means, independent of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame is for.
    pub kind: Kind,
    /// Flag bits ([`flags`]); `KEY_ROUTED` is derived from `dst` when emitting.
    pub flags: u16,
    /// Remaining hop budget.
    pub ttl: u8,
    /// Hops travelled so far.
    pub hops: u8,
    /// The service the payload is for (for aggregated frames, each message says its own).
    pub service: u16,
    /// The server that sent the frame.
    pub src: Coord,
    /// Where it is going.
    pub dst: Dest,
    /// The sender's connection id: which instance of the connection between the two
    /// servers the frame belongs to (0 for frames outside connections).
    pub conn: u32,
    /// The receiver's connection id as the sender knows it (0: unknown).
    pub peer_conn: u32,
    /// Sequence number of this frame in its connection.
    pub seq: u32,
    /// Cumulative acknowledgement: the next sequence number the sender expects.
    pub ack: u32,
    /// Message number of this frame's (first) message; aggregated messages follow it
    /// consecutively.
    pub msn: u32,
    /// Index of this frame's fragment within its reliable message.
    pub frag: u32,
    /// `msn` minus the number of the latest forward-fenced message before it (0: none).
    pub fence: u32,
    /// Selective-ack bitmap: bit i = frame `ack + 1 + i` received.
    pub sack: u64,
    /// Payload bytes after the headers (and after the source route, if any).
    pub payload_len: u16,
    /// Hops of the source route between the header and the payload (0: none).
    pub route_len: u8,
    /// Index of the route's next hop (`route_len` when the frame is at its destination).
    pub route_next: u8,
    /// Receive window granted to the peer, in frames past `ack` (0: not stated).
    pub rwnd: u16,
    /// Telemetry: the most loaded link crossed so far, in hundredths of its capacity.
    pub cong: u8,
    /// The receiver's echo of the peer's `cong` (the congestion controller's signal).
    pub cong_echo: u8,
}

impl Header {
    /// A header with everything zero but kind, source, destination and a fresh TTL.
    pub fn new(kind: Kind, src: Coord, dst: Dest) -> Header {
        Header {
            kind,
            flags: 0,
            ttl: DEFAULT_TTL,
            hops: 0,
            service: 0,
            src,
            dst,
            conn: 0,
            peer_conn: 0,
            seq: 0,
            ack: 0,
            msn: 0,
            frag: 0,
            fence: 0,
            sack: 0,
            payload_len: 0,
            route_len: 0,
            route_next: 0,
            rwnd: 0,
            cong: 0,
            cong_echo: 0,
        }
    }

    /// The header of a frame of `frame_len` bytes of which only the first, `head` (at
    /// least the headers), are at hand: checked as [`FrameView::new_checked`] checks the
    /// whole frame. For a forwarder that never reads the payload.
    pub fn parse_head(head: &[u8], frame_len: usize) -> Result<Header, WireError> {
        Header::parse(&FrameView::check(head, frame_len)?)
    }

    /// Parses a checked view.
    pub fn parse(v: &FrameView<'_>) -> Result<Header, WireError> {
        // Its judging fields and their checks are a passing frame's, read the same way.
        let p = Passing::read(v)?;
        Ok(Header {
            kind: p.kind,
            flags: p.flags,
            ttl: v.ttl(),
            hops: v.hops(),
            service: p.service,
            src: p.src,
            dst: p.dst,
            conn: v.conn(),
            peer_conn: v.peer_conn(),
            seq: v.seq(),
            ack: v.ack(),
            msn: v.msn(),
            frag: v.frag(),
            fence: v.fence(),
            sack: v.sack(),
            payload_len: v.payload_len() as u16,
            route_len: p.route_len,
            route_next: v.route_next() as u8,
            rwnd: v.u16_at(offset::RWND),
            cong: v.cong(),
            cong_echo: v.cong_echo(),
        })
    }

    /// Writes the torus header into `buf[ETH_LEN..HEADERS_LEN]` and the EtherType by kind
    /// (control frames go to the kernel's control process, everything else to AF_XDP); the
    /// MAC addresses are left to [`emit_eth`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < HEADERS_LEN {
            return Err(WireError::BufferTooSmall {
                have: buf.len(),
                need: HEADERS_LEN,
            });
        }
        let ethertype = if self.kind == Kind::Control {
            ETHERTYPE_CONTROL
        } else {
            ETHERTYPE_DATA
        };
        buf[offset::ETHERTYPE..offset::ETHERTYPE + 2].copy_from_slice(&ethertype.to_be_bytes());
        buf[offset::VERSION] = VERSION;
        buf[offset::KIND] = self.kind as u8;
        let mut fl = self.flags & !(flags::KEY_ROUTED | flags::SOURCE_ROUTED);
        if self.route_len > 0 {
            fl |= flags::SOURCE_ROUTED;
        }
        match self.dst {
            Dest::Key(k) => {
                fl |= flags::KEY_ROUTED;
                put(buf, offset::DST, &k.to_be_bytes());
            }
            Dest::Server(c) => {
                put_coord(buf, offset::DST, c);
                put(buf, offset::DST + 6, &[0, 0]);
            }
        }
        put(buf, offset::FLAGS, &fl.to_be_bytes());
        buf[offset::TTL] = self.ttl;
        buf[offset::HOPS] = self.hops;
        put(buf, offset::SERVICE, &self.service.to_be_bytes());
        put_coord(buf, offset::SRC, self.src);
        put(buf, offset::PAYLOAD_LEN, &self.payload_len.to_be_bytes());
        put(buf, offset::CONN, &self.conn.to_be_bytes());
        put(buf, offset::SEQ, &self.seq.to_be_bytes());
        put(buf, offset::ACK, &self.ack.to_be_bytes());
        put(buf, offset::MSN, &self.msn.to_be_bytes());
        put(buf, offset::FRAG, &self.frag.to_be_bytes());
        put(buf, offset::FENCE, &self.fence.to_be_bytes());
        put(buf, offset::SACK, &self.sack.to_be_bytes());
        put(buf, offset::PEER_CONN, &self.peer_conn.to_be_bytes());
        buf[offset::ROUTE_LEN] = self.route_len;
        buf[offset::ROUTE_NEXT] = self.route_next;
        put(buf, offset::RWND, &self.rwnd.to_be_bytes());
        buf[offset::CONG] = self.cong;
        buf[offset::CONG_ECHO] = self.cong_echo;
        Ok(())
    }

    /// Whether a flag bit is set.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

fn put_coord(buf: &mut [u8], at: usize, c: Coord) {
    put(buf, at, &c.x.to_be_bytes());
    put(buf, at + 2, &c.y.to_be_bytes());
    put(buf, at + 4, &c.z.to_be_bytes());
}

/// Writes an Ethernet header's addresses (the EtherType is written by [`Header::emit`]).
pub fn emit_eth(buf: &mut [u8], dst_mac: [u8; 6], src_mac: [u8; 6]) -> Result<(), WireError> {
    if buf.len() < ETH_LEN {
        return Err(WireError::BufferTooSmall {
            have: buf.len(),
            need: ETH_LEN,
        });
    }
    put(buf, 0, &dst_mac);
    put(buf, 6, &src_mac);
    Ok(())
}

/// What a server passing a frame on reads of its header: the fields of [`Header`] that
/// judge and route it, not the transport's. A hop parsed the whole header (a fifth of its
/// work in a simulated torus); the checks are the same, so a frame refused by one is
/// refused by the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passing {
    /// What the frame is for.
    pub kind: Kind,
    /// Flag bits ([`flags`]).
    pub flags: u16,
    /// Service it is for.
    pub service: u16,
    /// Origin.
    pub src: Coord,
    /// Where it goes.
    pub dst: Dest,
    /// Hops of its source route (0: none).
    pub route_len: u8,
}

impl Passing {
    /// [`Header::parse_head`]'s checks and fields a forwarder needs, from the first bytes
    /// `head` (at least the headers) of a frame of `frame_len` bytes.
    #[inline]
    pub fn parse_head(head: &[u8], frame_len: usize) -> Result<Passing, WireError> {
        Passing::read(&FrameView::check(head, frame_len)?)
    }

    /// The fields of a checked view ([`Header::parse`] reads them the same way).
    #[inline]
    fn read(v: &FrameView<'_>) -> Result<Passing, WireError> {
        Ok(Passing {
            kind: Kind::from_u8(v.kind_raw())?,
            flags: v.flags(),
            service: v.service(),
            src: v.src(),
            dst: v.checked_dst()?,
            route_len: v.route_len() as u8,
        })
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// A checked, zero-copy view of a torus data frame: after [`FrameView::new_checked`] every
/// fixed-offset accessor is in bounds and the payload length is consistent.
#[derive(Debug, Clone, Copy)]
pub struct FrameView<'a> {
    buf: &'a [u8],
    /// The headers, as an array: every header field is read at a constant offset into
    /// it, with no bounds check at run time (these reads are most of a hop's work).
    head: &'a [u8; HEADERS_LEN],
}

impl<'a> FrameView<'a> {
    /// Checks that `buf` holds a torus frame of a known version whose payload fits.
    /// Trailing bytes beyond the payload (Ethernet padding) are allowed and ignored.
    pub fn new_checked(buf: &'a [u8]) -> Result<FrameView<'a>, WireError> {
        Self::check(buf, buf.len())
    }

    /// The checks of [`FrameView::new_checked`] on a frame of `frame_len` bytes of which
    /// `buf` holds the first (at least the headers).
    #[inline]
    pub(crate) fn check(buf: &'a [u8], frame_len: usize) -> Result<FrameView<'a>, WireError> {
        let head = match buf.first_chunk::<HEADERS_LEN>() {
            Some(head) if frame_len >= buf.len() => head,
            _ => {
                return Err(WireError::Truncated {
                    have: buf.len(),
                    need: HEADERS_LEN,
                })
            }
        };
        let v = FrameView { buf, head };
        let et = v.ethertype();
        if et != ETHERTYPE_DATA && et != ETHERTYPE_CONTROL {
            return Err(WireError::EtherType(et));
        }
        if v.version() != VERSION {
            return Err(WireError::Version(v.version()));
        }
        Kind::from_u8(v.kind_raw())?;
        let reserved = v.flags() & !flags::KNOWN;
        if reserved != 0 {
            return Err(WireError::ReservedFlags(reserved));
        }
        v.check_route()?;
        let have = frame_len - HEADERS_LEN - v.route_len();
        let claimed = v.payload_len();
        if claimed > have {
            return Err(WireError::PayloadLength { claimed, have });
        }
        Ok(v)
    }

    /// The source route's fields agree with the flag, the route fits the frame's first
    /// bytes (`buf`: a forwarder must read it) and names only directions.
    #[inline]
    fn check_route(&self) -> Result<(), WireError> {
        let (len, next) = (self.route_len(), self.route_next());
        if self.flags() & flags::SOURCE_ROUTED == 0 {
            return match (len, next) {
                (0, 0) => Ok(()),
                _ => Err(WireError::Route("route fields set without SOURCE_ROUTED")),
            };
        }
        if len == 0 || len > MAX_ROUTE_HOPS {
            return Err(WireError::Route("length outside 1..=32"));
        }
        if next > len {
            return Err(WireError::Route("next hop past the end"));
        }
        let Some(route) = self.buf.get(HEADERS_LEN..HEADERS_LEN + len) else {
            return Err(WireError::Route("route runs past the frame"));
        };
        if route.iter().any(|d| *d >= 6) {
            return Err(WireError::Route("hop is not a direction (0..=5)"));
        }
        Ok(())
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.head[at], self.head[at + 1]])
    }
    fn u32_at(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.head[at..at + 4]);
        u32::from_be_bytes(b)
    }
    fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.head[at..at + 8]);
        u64::from_be_bytes(b)
    }
    fn coord_at(&self, at: usize) -> Coord {
        Coord::new(self.u16_at(at), self.u16_at(at + 2), self.u16_at(at + 4))
    }

    /// Destination MAC address.
    pub fn dst_mac(&self) -> [u8; 6] {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.head[0..6]);
        m
    }
    /// Source MAC address.
    pub fn src_mac(&self) -> [u8; 6] {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.head[6..12]);
        m
    }
    /// The EtherType.
    pub fn ethertype(&self) -> u16 {
        self.u16_at(offset::ETHERTYPE)
    }
    /// Header version.
    pub fn version(&self) -> u8 {
        self.head[offset::VERSION]
    }
    /// Frame kind as a number (checked to be known).
    pub fn kind_raw(&self) -> u8 {
        self.head[offset::KIND]
    }
    /// Frame kind.
    pub fn kind(&self) -> Kind {
        // new_checked validated it; Data is unreachable as a fallback.
        Kind::from_u8(self.kind_raw()).unwrap_or(Kind::Data)
    }
    /// Flag bits.
    pub fn flags(&self) -> u16 {
        self.u16_at(offset::FLAGS)
    }
    /// The most loaded link the frame crossed, in hundredths of its capacity.
    pub fn cong(&self) -> u8 {
        self.head[offset::CONG]
    }
    /// The receiver's echo of its peer's `cong`.
    pub fn cong_echo(&self) -> u8 {
        self.head[offset::CONG_ECHO]
    }
    /// Remaining hop budget.
    pub fn ttl(&self) -> u8 {
        self.head[offset::TTL]
    }
    /// Hops travelled.
    pub fn hops(&self) -> u8 {
        self.head[offset::HOPS]
    }
    /// Service id.
    pub fn service(&self) -> u16 {
        self.u16_at(offset::SERVICE)
    }
    /// Source server.
    pub fn src(&self) -> Coord {
        self.coord_at(offset::SRC)
    }
    /// Destination, read per the `KEY_ROUTED` flag, with a server's padding checked.
    #[inline]
    fn checked_dst(&self) -> Result<Dest, WireError> {
        if self.flags() & flags::KEY_ROUTED != 0 {
            return Ok(Dest::Key(self.u64_at(offset::DST)));
        }
        if self.u16_at(offset::DST + 6) != 0 {
            return Err(WireError::DstPadding);
        }
        Ok(Dest::Server(self.coord_at(offset::DST)))
    }
    /// Destination, read per the `KEY_ROUTED` flag (padding not checked here).
    pub fn dst(&self) -> Dest {
        if self.flags() & flags::KEY_ROUTED != 0 {
            Dest::Key(self.u64_at(offset::DST))
        } else {
            Dest::Server(self.coord_at(offset::DST))
        }
    }
    /// The sender's connection id.
    pub fn conn(&self) -> u32 {
        self.u32_at(offset::CONN)
    }
    /// The receiver's connection id as the sender knows it.
    pub fn peer_conn(&self) -> u32 {
        self.u32_at(offset::PEER_CONN)
    }
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        self.u32_at(offset::SEQ)
    }
    /// Cumulative acknowledgement.
    pub fn ack(&self) -> u32 {
        self.u32_at(offset::ACK)
    }
    /// Message number of the frame's first message.
    pub fn msn(&self) -> u32 {
        self.u32_at(offset::MSN)
    }
    /// Fragment index.
    pub fn frag(&self) -> u32 {
        self.u32_at(offset::FRAG)
    }
    /// Distance back to the latest forward-fenced message (0: none).
    pub fn fence(&self) -> u32 {
        self.u32_at(offset::FENCE)
    }
    /// Selective-ack bitmap.
    pub fn sack(&self) -> u64 {
        self.u64_at(offset::SACK)
    }
    /// Payload length from the header (checked to fit).
    pub fn payload_len(&self) -> usize {
        usize::from(self.u16_at(offset::PAYLOAD_LEN))
    }
    /// Hops of the source route (0: none).
    pub fn route_len(&self) -> usize {
        usize::from(self.head[offset::ROUTE_LEN])
    }
    /// Index of the source route's next hop.
    pub fn route_next(&self) -> usize {
        usize::from(self.head[offset::ROUTE_NEXT])
    }
    /// The source route's hops, as direction indices (checked to be 0..=5).
    pub fn route(&self) -> &'a [u8] {
        &self.buf[HEADERS_LEN..HEADERS_LEN + self.route_len()]
    }
    /// The payload bytes.
    pub fn payload(&self) -> &'a [u8] {
        let at = HEADERS_LEN + self.route_len();
        &self.buf[at..at + self.payload_len()]
    }
    /// The messages of an aggregated frame (or of any payload laid out that way).
    pub fn messages(&self) -> Messages<'a> {
        Messages::new(self.payload())
    }
}

/// Decrements the TTL and increments the hop count of a frame in place, as a forwarding
/// Raises the frame's telemetry to `level` (the load of the link it is about to leave by,
/// in hundredths of the link's capacity) if that link is the most loaded it has met: what a
/// sender and every forwarder (poller, XDP program, simulated link) write.
/// Frames of other EtherTypes (control frames) are left alone.
#[inline]
pub fn raise_cong(buf: &mut [u8], level: u8) {
    if buf.len() > offset::CONG
        && buf[offset::ETHERTYPE..offset::ETHERTYPE + 2] == ETHERTYPE_DATA.to_be_bytes()
    {
        buf[offset::CONG] = buf[offset::CONG].max(level);
    }
}

/// hop does; `false` (and nothing changed) when the TTL is already spent.
#[inline]
pub fn forward_hop(buf: &mut [u8]) -> bool {
    if buf.len() < HEADERS_LEN || buf[offset::TTL] == 0 {
        return false;
    }
    buf[offset::TTL] -= 1;
    buf[offset::HOPS] = buf[offset::HOPS].saturating_add(1);
    true
}

/// One message inside an aggregated payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// The service it is for.
    pub service: u16,
    /// Per-message flags ([`msg_flags`]).
    pub flags: u8,
    /// Its bytes.
    pub data: &'a [u8],
}

/// Iterator over the messages of an aggregated payload. Yields an error (once, then stops)
/// when a message header is malformed, so callers may keep the messages before it.
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    payload: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Messages<'a> {
    /// Decodes `payload` as a sequence of messages.
    pub fn new(payload: &'a [u8]) -> Messages<'a> {
        Messages {
            payload,
            at: 0,
            failed: false,
        }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, WireError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.payload.len() {
            return None;
        }
        let (len, service, flags) = match message_at(self.payload, self.at) {
            Ok(h) => h,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        let data = &self.payload[self.at + MSG_HEADER_LEN..self.at + MSG_HEADER_LEN + len];
        self.at += MSG_HEADER_LEN + len;
        Some(Ok(Message {
            service,
            flags,
            data,
        }))
    }
}

/// The header of the message at `at` in an aggregated payload, checked: its length, service
/// and flags, the message whole within the payload.
#[inline]
fn message_at(payload: &[u8], at: usize) -> Result<(usize, u16, u8), WireError> {
    let overrun = || WireError::MessageOverrun {
        at,
        len: payload.len(),
    };
    let h = payload.get(at..at + MSG_HEADER_LEN).ok_or_else(overrun)?;
    let len = usize::from(u16::from_be_bytes([h[0], h[1]]));
    if h[4] & !msg_flags::KNOWN != 0 || h[5] != 0 {
        return Err(WireError::MessageReserved(at));
    }
    if at + MSG_HEADER_LEN + len > payload.len() {
        return Err(overrun());
    }
    Ok((len, u16::from_be_bytes([h[2], h[3]]), h[4]))
}

/// `frame` (a whole frame, headers included) with its payload replaced by `payload`: the
/// headers as they are but the payload length, for an on-path service that changed a frame
/// it held. `None` when `frame` is not a frame or `payload` does not fit one.
pub fn with_payload(frame: &[u8], payload: &[u8]) -> Option<Vec<u8>> {
    let v = FrameView::new_checked(frame).ok()?;
    let mut h = Header::parse(&v).ok()?;
    if h.route_len > 0 {
        // A source-routed frame's route sits between the headers and the payload.
        return None;
    }
    h.payload_len = u16::try_from(payload.len()).ok()?;
    let mut out = vec![0u8; HEADERS_LEN + payload.len()];
    out[..ETH_LEN].copy_from_slice(frame.get(..ETH_LEN)?);
    h.emit(&mut out).ok()?;
    out[HEADERS_LEN..].copy_from_slice(payload);
    FrameView::new_checked(&out).ok()?;
    Some(out)
}

/// Checks every message of an aggregated payload, as iterating [`Messages`] over it would
/// (the same checks, the same first error), and returns how many there are, the union of
/// their flags and whether one is for a service numbered `watch` or above (the reserved
/// ids): a receiver that needs no more of them before accepting the frame reads each header
/// once, without building the messages.
pub fn check_messages(payload: &[u8], watch: u16) -> Result<(u32, u8, bool), WireError> {
    let (mut at, mut count, mut union, mut seen) = (0usize, 0u32, 0u8, false);
    // One bounds check per header and the header read as one word: this runs for every
    // message received, so it is written for the common case, and a bad header goes the
    // checking way for its error.
    while let Some(h) = payload
        .get(at..at + MSG_HEADER_LEN)
        .and_then(|h| <[u8; MSG_HEADER_LEN]>::try_from(h).ok())
    {
        let len = usize::from(u16::from_be_bytes([h[0], h[1]]));
        let end = at + MSG_HEADER_LEN + len;
        if h[4] & !msg_flags::KNOWN != 0 || h[5] != 0 || end > payload.len() {
            break;
        }
        union |= h[4];
        seen |= u16::from_be_bytes([h[2], h[3]]) >= watch;
        at = end;
        count += 1;
    }
    if at < payload.len() {
        // A header cut short or reserved bits set: the same error the iterator gives.
        return Err(message_at(payload, at)
            .err()
            .unwrap_or(WireError::MessageOverrun {
                at,
                len: payload.len(),
            }));
    }
    Ok((count, union, seen))
}

/// Writes a message header (length, service, flags) at the start of `buf`, which must hold
/// at least [`MSG_HEADER_LEN`] bytes.
#[inline]
pub fn write_msg_header(buf: &mut [u8], len: u16, service: u16, fl: u8) {
    buf[0..2].copy_from_slice(&len.to_be_bytes());
    buf[2..4].copy_from_slice(&service.to_be_bytes());
    buf[4] = fl & msg_flags::KNOWN;
    buf[5] = 0;
}

/// Appends messages to an aggregated payload buffer, refusing what would not fit.
#[derive(Debug)]
pub struct MessageWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
    count: usize,
}

impl<'a> MessageWriter<'a> {
    /// A writer filling `buf` (the payload area of a frame) from its start.
    pub fn new(buf: &'a mut [u8]) -> MessageWriter<'a> {
        MessageWriter {
            buf,
            len: 0,
            count: 0,
        }
    }

    /// Bytes a message of `len` bytes takes in an aggregated payload.
    pub const fn encoded_len(len: usize) -> usize {
        MSG_HEADER_LEN + len
    }

    /// Appends one message; `false` (and nothing written) if it does not fit or is longer
    /// than a u16 can say.
    pub fn push(&mut self, service: u16, fl: u8, data: &[u8]) -> bool {
        let need = MSG_HEADER_LEN + data.len();
        let Ok(len16) = u16::try_from(data.len()) else {
            return false;
        };
        if self.buf.len() - self.len < need {
            return false;
        }
        let at = self.len;
        write_msg_header(&mut self.buf[at..at + need], len16, service, fl);
        self.buf[at + MSG_HEADER_LEN..at + need].copy_from_slice(data);
        self.len += need;
        self.count += 1;
        true
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Messages written so far.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// Runs the parser and the aggregation decoder over arbitrary bytes, checking the
/// invariants that must hold for every input: no panic, a parsed header re-emits to the
/// same header bytes, and decoded messages lie inside the payload. The fuzz target and the
/// seeded tests share it.
pub fn check_untrusted(data: &[u8]) {
    let Ok(view) = FrameView::new_checked(data) else {
        // The decoder must also survive raw payload bytes that never passed a header check.
        for m in Messages::new(data) {
            if m.is_err() {
                break;
            }
        }
        return;
    };
    let payload = view.payload();
    let mut seen = 0usize;
    for m in view.messages() {
        match m {
            Ok(m) => {
                seen += MSG_HEADER_LEN + m.data.len();
                assert!(seen <= payload.len(), "message outside payload");
            }
            Err(_) => break,
        }
    }
    if let Ok(h) = Header::parse(&view) {
        let mut out = data.to_vec();
        h.emit(&mut out).expect("buffer is large enough");
        // Emit picks the EtherType from the kind; compare the torus header only.
        assert_eq!(
            &out[ETH_LEN..HEADERS_LEN],
            &data[ETH_LEN..HEADERS_LEN],
            "re-emit differs"
        );
        let again = FrameView::new_checked(&out).map(|v| Header::parse(&v));
        assert!(
            matches!(again, Ok(Ok(ref h2)) if *h2 == h),
            "round trip differs"
        );
    }
}

/// Runs the aggregation decoder over arbitrary bytes and checks that what it accepts
/// re-encodes, through [`MessageWriter`], to exactly the bytes it consumed. Shared by the
/// fuzz target and the seeded tests.
pub fn check_untrusted_messages(data: &[u8]) {
    let mut out = vec![0u8; data.len()];
    let mut w = MessageWriter::new(&mut out);
    for m in Messages::new(data) {
        match m {
            Ok(m) => assert!(w.push(m.service, m.flags, m.data), "re-encode refused"),
            Err(_) => break,
        }
    }
    let n = w.len();
    assert_eq!(&out[..n], &data[..n], "re-encoded messages differ");
}

#[cfg(test)]
mod tests {

    /// `check_messages` finds what iterating the messages finds: the same count, flags and
    /// sighting of the watched service on a good payload, the same first error on a bad one.
    #[test]
    fn checking_messages_agrees_with_iterating_them() {
        let mut rng = crate::rng::SplitMix64::new(4);
        for _ in 0..20_000 {
            let mut p = vec![0u8; rng.below(80) as usize];
            let mut at = 0;
            while at + MSG_HEADER_LEN <= p.len() && rng.below(8) != 0 {
                let len = rng.below(12) as usize;
                p[at..at + 2].copy_from_slice(&(len as u16).to_be_bytes());
                p[at + 2..at + 4].copy_from_slice(&(rng.below(3) as u16 + 62).to_be_bytes());
                p[at + 4] =
                    [0, msg_flags::BWD_FENCE, msg_flags::FWD_FENCE, 0x80][rng.below(4) as usize];
                p[at + 5] = u8::from(rng.below(30) == 0);
                at += MSG_HEADER_LEN + len;
            }
            if rng.below(4) == 0 {
                for b in &mut p {
                    if rng.below(10) == 0 {
                        *b = rng.below(256) as u8;
                    }
                }
            }
            let mut want = Ok((0u32, 0u8, false));
            for m in Messages::new(&p) {
                match (m, &mut want) {
                    (Ok(m), Ok((n, f, seen))) => {
                        *n += 1;
                        *f |= m.flags;
                        *seen |= m.service >= 62;
                    }
                    (Err(e), _) => {
                        want = Err(e);
                        break;
                    }
                    _ => {}
                }
            }
            assert_eq!(check_messages(&p, 62), want, "{p:?}");
        }
    }
    use super::*;

    fn frame(h: &Header, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; HEADERS_LEN + payload.len()];
        emit_eth(&mut buf, [2; 6], [4; 6]).unwrap();
        let h = Header {
            payload_len: payload.len() as u16,
            ..*h
        };
        h.emit(&mut buf).unwrap();
        buf[HEADERS_LEN..].copy_from_slice(payload);
        buf
    }

    #[test]
    fn header_round_trip() {
        let mut h = Header::new(
            Kind::Data,
            Coord::new(1, 2, 3),
            Dest::Key(0x0123_4567_89ab_cdef),
        );
        h.flags = flags::RELIABLE | flags::BWD_FENCE | flags::ACK_VALID;
        h.service = 7;
        h.conn = 9;
        h.seq = 0xfffffff0;
        h.ack = 17;
        h.frag = 3;
        h.sack = 0xa5;
        let buf = frame(&h, b"hello");
        let v = FrameView::new_checked(&buf).unwrap();
        let p = Header::parse(&v).unwrap();
        assert_eq!(p.flags, h.flags | flags::KEY_ROUTED);
        assert_eq!(p.dst, h.dst);
        assert_eq!(
            (p.seq, p.ack, p.frag, p.sack, p.conn),
            (h.seq, h.ack, 3, 0xa5, 9)
        );
        assert_eq!(v.payload(), b"hello");
        assert_eq!(v.src_mac(), [4; 6]);
        check_untrusted(&buf);

        let h2 = Header::new(
            Kind::Nack,
            Coord::new(0, 0, 0),
            Dest::Server(Coord::new(9, 8, 7)),
        );
        let buf = frame(&h2, &[]);
        let p = Header::parse(&FrameView::new_checked(&buf).unwrap()).unwrap();
        assert_eq!(p.dst, Dest::Server(Coord::new(9, 8, 7)));
        assert_eq!(p.kind, Kind::Nack);
    }

    #[test]
    fn refuses_bad_frames() {
        let h = Header::new(Kind::Data, Coord::default(), Dest::Server(Coord::default()));
        let good = frame(&h, b"abc");
        assert!(matches!(
            FrameView::new_checked(&good[..HEADERS_LEN - 1]),
            Err(WireError::Truncated { .. })
        ));
        let mut b = good.clone();
        b[12] = 0x08;
        b[13] = 0x00;
        assert_eq!(
            FrameView::new_checked(&b).unwrap_err(),
            WireError::EtherType(0x0800)
        );
        let mut b = good.clone();
        b[offset::VERSION] = 2;
        assert_eq!(
            FrameView::new_checked(&b).unwrap_err(),
            WireError::Version(2)
        );
        let mut b = good.clone();
        b[offset::KIND] = 9;
        assert_eq!(FrameView::new_checked(&b).unwrap_err(), WireError::Kind(9));
        let mut b = good.clone();
        b[offset::FLAGS] = 0x80;
        assert!(matches!(
            FrameView::new_checked(&b),
            Err(WireError::ReservedFlags(_))
        ));
        let mut b = good.clone();
        b[offset::PAYLOAD_LEN + 1] = 4;
        assert!(matches!(
            FrameView::new_checked(&b),
            Err(WireError::PayloadLength { .. })
        ));
        let mut b = good;
        b[offset::DST + 7] = 1;
        let v = FrameView::new_checked(&b).unwrap();
        assert_eq!(Header::parse(&v).unwrap_err(), WireError::DstPadding);
    }

    #[test]
    fn aggregation_round_trip_and_errors() {
        let mut payload = [0u8; 64];
        let mut w = MessageWriter::new(&mut payload);
        assert!(w.push(1, msg_flags::BWD_FENCE, b"one"));
        assert!(w.push(2, 0, b""));
        assert!(w.push(3, msg_flags::FWD_FENCE, &[7u8; 40]));
        assert!(!w.push(4, 0, &[0u8; 10]), "must refuse what does not fit");
        let (len, count) = (w.len(), w.count());
        assert_eq!(count, 3);
        let msgs: Vec<Message<'_>> = Messages::new(&payload[..len]).map(|m| m.unwrap()).collect();
        assert_eq!(msgs.len(), 3);
        assert_eq!(
            (msgs[0].service, msgs[0].flags, msgs[0].data),
            (1, 1, &b"one"[..])
        );
        assert_eq!(msgs[2].data, &[7u8; 40][..]);
        // Truncation inside the third message: the first two survive, then one error.
        let out: Vec<_> = Messages::new(&payload[..len - 1]).collect();
        assert_eq!(out.len(), 3);
        assert!(out[2].is_err());
        let mut bad = payload;
        bad[5] = 1;
        assert_eq!(
            Messages::new(&bad[..len]).next().unwrap().unwrap_err(),
            WireError::MessageReserved(0)
        );
    }

    #[test]
    fn forward_hop_spends_ttl() {
        let mut h = Header::new(Kind::Data, Coord::default(), Dest::Server(Coord::default()));
        h.ttl = 1;
        let mut b = frame(&h, b"");
        assert!(forward_hop(&mut b));
        assert_eq!((b[offset::TTL], b[offset::HOPS]), (0, 1));
        assert!(!forward_hop(&mut b));
        assert!(!forward_hop(&mut [0u8; 3]));
    }
}

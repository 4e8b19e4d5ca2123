//! Building frames: data frames short (unreliable) and reliable, aggregated or fragmented;
//! the connection's own frames (SYNC, ACK, NACK) and retransmissions.

use super::*;

/// Frames the short (unreliable) message at the head of `q` (and, aggregating, the short
/// messages after it to the same peer) into `buf` for `link`. Nothing is kept: short frames
/// are neither numbered nor acknowledged, and belong to no connection.
pub(super) fn build_short_frame(
    local: Coord,
    cfg: &Config,
    q: &mut fair_queue::ServiceQueue,
    link: LinkId,
    buf: &mut [u8],
    stats: &mut Stats,
    declared: &mut Option<(usize, u8)>,
) -> Transmit {
    let from = q.service;
    let runs = if cfg.declare_tails && cfg.compact_runs {
        Runs::Declare
    } else {
        Runs::Write
    };
    let mut t = Transmit {
        kept: false,
        link,
        len: 0,
        kind: TxKind::Short,
        messages: 0,
        service: None,
    };
    let Some(head) = q.head().copied() else {
        return t;
    };
    let room = cfg.max_payload();
    let mut h = Header::new(Kind::Data, local, Dest::Server(head.dest));
    h.service = head.service;
    let payload = &mut buf[HEADERS_LEN..ETH_LEN + cfg.mtu];
    // A short message always fits one frame with its header (sends check it), so the head
    // is taken whole, alone or with the short messages to the same peer behind it.
    let (plen, messages, tail) = if cfg.aggregate {
        h.flags |= flags::AGGREGATED;
        let plan = q.plan_aggregate(room, |_, _| {});
        let tail = q.take_planned(&plan, &mut payload[..plan.bytes], runs);
        (plan.bytes, plan.messages as usize, tail)
    } else {
        let len = (head.len as usize).min(room);
        let tail = q.take_head(&mut payload[..len], runs);
        (len, 1, tail)
    };
    *declared = tail.map(|(at, v)| (HEADERS_LEN + at, v));
    h.payload_len = plen as u16;
    let _ = h.emit(buf);
    stats.short_frames += 1;
    stats.short_messages_sent += messages as u64;
    t.len = HEADERS_LEN + plen;
    t.messages = messages as u32;
    t.service = Some(from);
    t
}

/// Frames the reliable message at the head of `q` (and, aggregating, the reliable messages
/// after it to the same peer) into `buf` for `link`, and records the frame in the send
/// window.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_data_frame(
    local: Coord,
    cfg: &Config,
    now: Time,
    conn: &mut Connection,
    q: &mut fair_queue::ServiceQueue,
    link: LinkId,
    buf: &mut [u8],
    stats: &mut Stats,
    pool: &mut pool::BufferPool,
    keep: Option<u32>,
) -> Transmit {
    // The queue is the sending service's: reports go to it; each message names its own
    // destination service.
    let from = q.service;
    let Some(head) = q.head().copied() else {
        return Transmit {
            kept: false,
            link,
            len: 0,
            kind: TxKind::Data,
            messages: 0,
            service: None,
        };
    };
    let dest = head.dest;
    let room = cfg.max_payload();
    let mut h = Header::new(Kind::Data, local, Dest::Server(dest));
    h.service = head.service;
    // The sequence number this frame will carry.
    let seq = conn.send.next_seq();
    h.flags |= flags::RELIABLE;
    h.conn = conn.life.cid();
    h.peer_conn = conn.life.peer_cid().unwrap_or(0);
    let payload = &mut buf[HEADERS_LEN..ETH_LEN + cfg.mtu];
    let prog = q.head_progress();
    let whole_fits = prog.sent == 0 && head.len as usize + MSG_HEADER_LEN <= room;
    let at = Framing { seq, room, from };
    // A message that would travel alone (alone in its queue, or with nothing after it that
    // fits beside it) goes in a plain frame: planning a frame of one and checking its
    // message header on arrival cost a round trip more than the frame's own work
    // (docs/transport.md, "CPU cost"), and only a plain frame's message can be lent to
    // the receiver's consumer straight from the frame.
    let (plen, messages) = if cfg.aggregate && whole_fits && q.head_shares_frame(room) {
        frame_aggregated(&mut h, conn, q, at, payload)
    } else if prog.sent == 0 && head.len as usize <= room {
        frame_whole(&mut h, conn, q, &head, at, payload)
    } else {
        frame_fragment(&mut h, conn, q, &head, prog, at, payload)
    };
    let sent = SentFrame {
        link,
        plen,
        messages,
        from,
    };
    finish_data_frame(now, h, conn, sent, buf, stats, pool, keep)
}

/// Where a reliable frame being built stands: the sequence number it will carry, the
/// payload room of a frame and the queue (service) it is framed from.
#[derive(Clone, Copy)]
pub(super) struct Framing {
    seq: u64,
    room: usize,
    from: u16,
}

/// [`build_data_frame`] aggregating: the head and the messages behind it to the same peer
/// that fit, numbered in order (per entry: a group's messages take consecutive numbers);
/// the payload's length and the whole messages in it.
#[inline(always)]
fn frame_aggregated(
    h: &mut Header,
    conn: &mut Connection,
    q: &mut fair_queue::ServiceQueue,
    at: Framing,
    payload: &mut [u8],
) -> (usize, u32) {
    h.flags |= flags::AGGREGATED;
    let mut first_msn = None;
    let fence_before = conn.last_fwd;
    let plan = q.plan_aggregate(at.room, |m, k| {
        let msn = conn.next_msn;
        conn.next_msn += u64::from(k);
        first_msn.get_or_insert(msn);
        if m.fences.forward {
            // Fenced messages are never grouped: this one is `msn`.
            conn.last_fwd = Some(msn);
        }
        conn.sent
            .on_framed_run(at.from, m.tags.head(k), msn, at.seq);
    });
    // The messages wait in wire form: the run is one copy.
    q.take_planned(&plan, &mut payload[..plan.bytes], Runs::Write);
    // A group the frame took the first messages of stays queued.
    conn.queued = conn.queued.saturating_sub(plan.entries);
    if let Some(msn) = first_msn {
        h.msn = seqnum::truncate(msn);
        h.fence = fence_distance(msn, fence_before);
    }
    (plan.bytes, plan.messages)
}

/// [`build_data_frame`] for one whole message, unaggregated.
#[inline(always)]
fn frame_whole(
    h: &mut Header,
    conn: &mut Connection,
    q: &mut fair_queue::ServiceQueue,
    head: &Queued,
    at: Framing,
    payload: &mut [u8],
) -> (usize, u32) {
    let len = head.len as usize;
    q.take_head(&mut payload[..len], Runs::Write);
    conn.queued = conn.queued.saturating_sub(1);
    let msn = conn.next_msn;
    conn.next_msn += 1;
    conn.sent
        .on_framed_alone(at.from, head.tags.first(), msn, at.seq);
    h.flags |= flags::FRAG_FIRST | flags::FRAG_LAST | fence_flags(head.fences);
    h.msn = seqnum::truncate(msn);
    h.fence = fence_distance(msn, conn.last_fwd);
    if head.fences.forward {
        conn.last_fwd = Some(msn);
    }
    (len, 1)
}

/// [`build_data_frame`] for the next fragment of a message larger than one frame (its
/// number taken when its first fragment goes); counts the message when this is its last.
#[inline(always)]
fn frame_fragment(
    h: &mut Header,
    conn: &mut Connection,
    q: &mut fair_queue::ServiceQueue,
    head: &Queued,
    prog: fair_queue::HeadProgress,
    at: Framing,
    payload: &mut [u8],
) -> (usize, u32) {
    let room = at.room;
    let (msn, wait_for) = match prog.msn {
        Some(m) => (m, prog.wait_for),
        None => {
            let m = conn.next_msn;
            conn.next_msn += 1;
            let w = conn.last_fwd;
            if head.fences.forward {
                conn.last_fwd = Some(m);
            }
            q.set_head_msn(m, w);
            (m, w)
        }
    };
    let frag = prog.sent / room as u32;
    let left = (head.len - prog.sent) as usize;
    let len = left.min(room);
    let mut messages = 0;
    if prog.sent == 0 {
        h.flags |= flags::FRAG_FIRST;
    }
    if left <= room {
        h.flags |= flags::FRAG_LAST;
        messages = 1;
        conn.queued = conn.queued.saturating_sub(1);
        conn.sent
            .on_framed_alone(at.from, head.tags.first(), msn, at.seq);
    }
    h.flags |= fence_flags(head.fences);
    h.msn = seqnum::truncate(msn);
    h.frag = frag;
    h.fence = match wait_for {
        Some(w) => (msn - w) as u32,
        None => 0,
    };
    q.take_head(&mut payload[..len], Runs::Write);
    (len, messages)
}

/// What a data frame being finished carries: its link, payload length, how many whole
/// messages end in it and the queue (service) that sent them.
#[derive(Clone, Copy)]
pub(super) struct SentFrame {
    pub(super) link: LinkId,
    pub(super) plen: usize,
    pub(super) messages: u32,
    pub(super) from: u16,
}

/// Completes a data frame whose payload is written and whose header `h` has its message
/// fields: the sequence number and the piggybacked ACK, the header written, the frame
/// recorded in the send window (kept in the driver's buffer `keep`, or copied) and counted.
// Always inline: it is the tail of both ways of building a data frame, and as a call of its
// own (eight arguments) it cost about 50 instructions per frame (`bench/transport-cost.sh`,
// unaggregated).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn finish_data_frame(
    now: Time,
    mut h: Header,
    conn: &mut Connection,
    f: SentFrame,
    buf: &mut [u8],
    stats: &mut Stats,
    pool: &mut pool::BufferPool,
    keep: Option<u32>,
) -> Transmit {
    let SentFrame {
        link,
        plen,
        messages,
        from,
    } = f;
    h.payload_len = plen as u16;
    let len = HEADERS_LEN + plen;
    h.seq = seqnum::truncate(conn.send.next_seq());
    h.flags |= flags::ACK_VALID | flags::SACK_VALID;
    if conn.send.fills_cwnd() {
        h.flags |= flags::ACK_NOW;
    }
    h.ack = seqnum::truncate(conn.recv.cum_ack());
    h.sack = conn.recv.sack_bits();
    h.rwnd = conn.pace.granted;
    h.cong_echo = conn.tele.take_echo();
    conn.recv.on_ack_sent();
    // Emit cannot fail: buf was checked to hold a whole frame.
    let _ = h.emit(buf);
    let frame = match keep {
        // Kept where it was built: the driver holds the buffer until it is released.
        Some(handle) => {
            stats.kept_frames += 1;
            KeptFrame::Driver {
                handle,
                len: (len - ETH_LEN) as u32,
            }
        }
        None => {
            let mut copy = pool.take();
            copy.extend_from_slice(&buf[ETH_LEN..len]);
            KeptFrame::Owned(copy)
        }
    };
    conn.send.on_sent_frame(now, frame);
    conn.life.set_waiting(now, true, false);
    stats.data_frames += 1;
    stats.messages_sent += u64::from(messages);
    Transmit {
        kept: keep.is_some(),
        link,
        len,
        kind: TxKind::Data,
        messages,
        service: Some(from),
    }
}

pub(super) fn fence_flags(f: Fences) -> u16 {
    (if f.backward { flags::BWD_FENCE } else { 0 }) | (if f.forward { flags::FWD_FENCE } else { 0 })
}

/// The wire fence field: distance back from `msn` to the latest forward-fenced message.
pub(super) fn fence_distance(msn: u64, last_fwd: Option<u64>) -> u32 {
    match last_fwd {
        Some(j) if j < msn => u32::try_from(msn - j).unwrap_or(0),
        _ => 0,
    }
}

/// The header of a frame of the connection itself (SYNC, ACK, NACK) to `peer`: both ends'
/// connection ids and the receive room granted.
#[inline(always)]
fn connection_header(kind: Kind, local: Coord, peer: Coord, c: &Connection) -> Header {
    let mut h = Header::new(kind, local, Dest::Server(peer));
    h.conn = c.life.cid();
    h.peer_conn = c.life.peer_cid().unwrap_or(0);
    h.rwnd = c.pace.granted;
    h.cong_echo = c.tele.echo();
    h
}

/// Writes a SYNC frame to `peer` into `buf`: this connection's ids, the first grant of
/// receive room, and this server's incarnation; its length, or `None` when `buf` is too
/// short.
#[inline(always)]
pub(super) fn build_sync_frame(
    local: Coord,
    peer: Coord,
    c: &Connection,
    incarnation: u64,
    buf: &mut [u8],
) -> Option<usize> {
    // The handshake carries the first grant (`connection_header`): a sender that knew none
    // would open with a whole window, more than a small receive ring holds.
    let mut h = connection_header(Kind::Sync, local, peer, c);
    h.payload_len = SYNC_PAYLOAD as u16;
    h.emit(buf).ok()?;
    buf[HEADERS_LEN..HEADERS_LEN + 8].copy_from_slice(&incarnation.to_be_bytes());
    buf[HEADERS_LEN + 8] = 0;
    Some(HEADERS_LEN + SYNC_PAYLOAD)
}

/// Writes an ACK (or, with `nack`, a NACK) to `peer` into `buf`: the cumulative ACK, the
/// selective bitmap and the receive room granted; its length, or `None` when `buf` is too
/// short.
#[inline(always)]
pub(super) fn build_ack_frame(
    local: Coord,
    peer: Coord,
    c: &Connection,
    nack: bool,
    buf: &mut [u8],
) -> Option<usize> {
    let kind = if nack { Kind::Nack } else { Kind::Ack };
    let mut h = connection_header(kind, local, peer, c);
    h.flags = flags::ACK_VALID | flags::SACK_VALID;
    h.ack = seqnum::truncate(c.recv.cum_ack());
    h.sack = c.recv.sack_bits();
    h.emit(buf).ok()?;
    Some(HEADERS_LEN)
}

/// Copies the frame `c` has to send again, if any, into `buf` after the Ethernet header:
/// from the transport's copy, or read back from the driver through `keep` (a kept frame
/// the driver cannot give back is left for the timeout: an ACK goes instead). Its length
/// without the Ethernet header.
#[inline(always)]
pub(super) fn copy_retransmit(
    now: Time,
    c: &mut Connection,
    keep: Option<Keep<'_>>,
    buf: &mut [u8],
) -> Option<usize> {
    match c.send.next_retransmit(now) {
        Some(KeptFrame::Owned(b)) => buf.get_mut(ETH_LEN..ETH_LEN + b.len()).map(|to| {
            to.copy_from_slice(b);
            b.len()
        }),
        Some(&KeptFrame::Driver { handle, len }) => keep.and_then(|k| {
            let len = len as usize;
            let to = buf.get_mut(ETH_LEN..ETH_LEN + len)?;
            k.frames.copy_kept(handle, ETH_LEN, to).then_some(len)
        }),
        None => None,
    }
}

/// Makes the copied frame (`n` bytes after the Ethernet header) a retransmission: its
/// EtherType, today's ACK of the connection, and the RETRANSMIT flag. Its length.
#[inline(always)]
pub(super) fn mark_retransmit(c: &mut Connection, n: usize, buf: &mut [u8]) -> usize {
    buf[wire::offset::ETHERTYPE..wire::offset::ETHERTYPE + 2]
        .copy_from_slice(&wire::ETHERTYPE_DATA.to_be_bytes());
    super::tx::refresh_ack(buf, c);
    // The telemetry starts over: the links it meets now are what counts.
    buf[wire::offset::CONG] = 0;
    let fl = u16::from_be_bytes([buf[wire::offset::FLAGS], buf[wire::offset::FLAGS + 1]])
        | flags::RETRANSMIT;
    buf[wire::offset::FLAGS..wire::offset::FLAGS + 2].copy_from_slice(&fl.to_be_bytes());
    ETH_LEN + n
}

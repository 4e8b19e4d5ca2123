//! `torus-bench transport-cost`: pushes messages through a sender and a receiver joined by
//! a lossless in-memory link, with no simulated network in between, so that an instruction
//! counter (bench/transport-cost.sh runs it under callgrind) sees only the transport core.

use std::hint::black_box;
use std::time::Duration;

use torusnet_proto::time::Time;
use torusnet_proto::topology::Coord;
use torusnet_proto::transport::{
    Config, EventRef, Fences, LinkSet, Outgoing, SendError, Transport,
};

/// Options of `torus-bench transport-cost`.
#[derive(clap::Args)]
pub struct Args {
    /// Messages to push through.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Turn aggregation off (one message per frame).
    #[arg(long)]
    no_aggregation: bool,
    /// Link MTU.
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// Ping-pong instead of a stream: one message at a time, each answered by the
    /// receiver before the next goes (`--messages` round trips): the transport's share of a
    /// round trip, as `torus-bench pingpong` runs it between two servers (`--size` up to
    /// 256).
    #[arg(long)]
    pingpong: bool,
}

pub fn run(a: &Args) -> Result<(), String> {
    if a.pingpong {
        return pingpong(a);
    }
    let cfg = Config {
        aggregate: !a.no_aggregation,
        mtu: a.mtu,
        ..Config::default()
    };
    let src = Coord::new(0, 0, 0);
    let dst = Coord::new(1, 0, 0);
    let mut tx = Transport::new(src, cfg);
    let mut rx = Transport::new(dst, cfg);
    let links = |_: Coord| LinkSet::first(2);
    let mut buf = vec![0u8; 14 + a.mtu];
    let mut frame = vec![0u8; 14 + a.mtu];
    let data = vec![0x5a; a.size];
    let mut now = Time::ZERO;
    let (mut delivered, mut bytes) = (0u64, 0u64);
    let mut sent = 0u64;
    while delivered < a.messages {
        while sent < a.messages {
            // As torusd's bench service sends: straight into a frame when the message goes
            // alone at once, else queued.
            match send_now(&mut tx, now, bench_message(dst, &data, sent), &mut frame) {
                Ok(straight) => {
                    sent += 1;
                    if let Some(len) = straight {
                        rx.handle_frame(now, &frame[..len])
                            .map_err(|e| e.to_string())?;
                    }
                }
                Err(SendError::WouldBlock) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        while let Some(t) = tx.poll_transmit(now, LinkSet::first(2), &links, &mut buf, None) {
            rx.handle_frame(now, &buf[..t.len])
                .map_err(|e| e.to_string())?;
        }
        // Read by reference, as the dataplane's hosted services do: no allocation per message.
        while let Some(e) = rx.poll_event_ref() {
            if let EventRef::Message { data, .. } = e {
                delivered += 1;
                bytes += data.len() as u64;
            }
        }
        // The receiver's delayed ACKs fire as time moves on.
        now = now + Duration::from_micros(50);
        for t in [&mut tx, &mut rx] {
            if t.poll_timeout().is_some_and(|d| d <= now) {
                t.handle_timeout(now);
            }
        }
        while let Some(t) = rx.poll_transmit(now, LinkSet::first(2), &links, &mut buf, None) {
            tx.handle_frame(now, &buf[..t.len])
                .map_err(|e| e.to_string())?;
        }
    }
    let s = tx.stats();
    println!(
        "{{\"messages\":{},\"bytes\":{},\"data_frames\":{},\"retransmitted_frames\":{},\"ack_frames\":{},\"messages_per_frame\":{:.2}}}",
        black_box(delivered),
        bytes,
        s.data_frames,
        s.retransmitted_frames,
        rx.stats().ack_frames,
        s.messages_sent as f64 / s.data_frames.max(1) as f64
    );
    Ok(())
}

/// The largest message `--pingpong` sends (the answer is built in a buffer this long).
const PING_MAX: usize = 256;

/// Sends `m` as torusd's pollers send for their services: asks whether it may go straight
/// into a frame ([`Transport::may_frame_straight`]); if so, writes it into `frame` with
/// [`Transport::send_framing`] (the frame's length returned, for the caller to deliver),
/// else queues it with `send`. `WouldBlock` for a message that would go straight but cannot
/// go now: the bench service stops there until the next transmit, as this loop does.
#[inline(always)]
fn send_now(
    t: &mut Transport,
    now: Time,
    m: Outgoing<'_>,
    frame: &mut [u8],
) -> Result<Option<usize>, SendError> {
    if !t.may_frame_straight(m.data.len(), m.reliable) {
        return t.send(now, m).map(|()| None);
    }
    let links = |_: Coord| LinkSet::first(2);
    t.send_framing(now, m, LinkSet::first(2), &links, frame, None)
        .map(|straight| straight.map(|f| f.len))
}

/// [`send_now`] for a request or an answer, as the ping service sends them: one that would
/// go straight but cannot go now is queued.
#[inline(always)]
fn send_ping(
    t: &mut Transport,
    now: Time,
    m: Outgoing<'_>,
    frame: &mut [u8],
) -> Result<Option<usize>, SendError> {
    match send_now(t, now, m, frame) {
        Err(SendError::WouldBlock) => t.send(now, m).map(|()| None),
        r => r,
    }
}

/// A frame one end has built straight from a message, not yet on the wire.
struct Held {
    frame: Vec<u8>,
    len: Option<usize>,
}

/// One crossing of a ping-pong: frames go between the two ends (`from`'s first, after the
/// one it built straight, if any) until `to` has read a message, which it answers with one
/// of the same bytes when `answer` (as the ping service echoes); at most a few passes, for
/// the handshake of the first trip.
fn crossing(
    now: Time,
    (from, to): (&mut Transport, &mut Transport),
    back: Coord,
    buf: &mut [u8],
    held: &mut Held,
    answer: bool,
) -> Result<(), String> {
    let mut reply = [0u8; PING_MAX];
    if let Some(len) = held.len.take() {
        to.handle_frame(now, &held.frame[..len])
            .map_err(|e| e.to_string())?;
    }
    for _ in 0..8 {
        pass_frames(now, from, to, buf)?;
        while let Some(e) = to.poll_event_ref() {
            if let EventRef::Message { data, .. } = e {
                if answer {
                    let n = data.len().min(reply.len());
                    reply[..n].copy_from_slice(&data[..n]);
                    held.len = send_ping(
                        to,
                        now,
                        bench_message(back, &reply[..n], 0),
                        &mut held.frame,
                    )
                    .map_err(|e| e.to_string())?;
                }
                return Ok(());
            }
        }
        pass_frames(now, to, from, buf)?;
    }
    Err("a message did not arrive in eight passes".into())
}

/// Hands every frame `from` has to `to`, asking first as torusd's poller does (not at all
/// when the transport says it has nothing). Inline, as the loop was: the count is of the
/// transport, not of a call in the harness.
#[inline(always)]
fn pass_frames(
    now: Time,
    from: &mut Transport,
    to: &mut Transport,
    buf: &mut [u8],
) -> Result<(), String> {
    let links = |_: Coord| LinkSet::first(1);
    while from.may_transmit() {
        let Some(t) = from.poll_transmit(now, LinkSet::first(1), &links, buf, None) else {
            break;
        };
        to.handle_frame(now, &buf[..t.len])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A reliable, unfenced message of service 1 to `dest`: what every run here sends.
fn bench_message(dest: Coord, data: &[u8], tag: u64) -> Outgoing<'_> {
    Outgoing {
        dest,
        service: 1,
        data,
        reliable: true,
        fences: Fences::default(),
        tag,
        from: 1,
    }
}

/// What a ping-pong run put on the wire.
#[derive(Debug, PartialEq, Eq)]
struct PingCounts {
    round_trips: u64,
    data_frames: u64,
    ack_frames: u64,
    retransmitted_frames: u64,
}

/// `--pingpong`: prints the run's counts as JSON.
fn pingpong(a: &Args) -> Result<(), String> {
    let c = ping_counts(a)?;
    println!(
        "{{\"round_trips\":{},\"data_frames\":{},\"ack_frames\":{},\"retransmitted_frames\":{}}}",
        black_box(c.round_trips),
        c.data_frames,
        c.ack_frames,
        c.retransmitted_frames
    );
    Ok(())
}

/// One message in flight, answered before the next; the clock moves on by half of a round
/// trip on this machine at each crossing, so delayed ACKs ride on the answers as they do
/// between two torusd.
fn ping_counts(a: &Args) -> Result<PingCounts, String> {
    if a.size > PING_MAX || a.size == 0 {
        return Err(format!(
            "--pingpong measures small messages: --size must be 1..={PING_MAX}, not {}",
            a.size
        ));
    }
    let cfg = Config {
        aggregate: !a.no_aggregation,
        mtu: a.mtu,
        ..Config::default()
    };
    let (ca, cb) = (Coord::new(0, 0, 0), Coord::new(1, 0, 0));
    let mut x = Transport::new(ca, cfg);
    let mut y = Transport::new(cb, cfg);
    let mut buf = vec![0u8; 14 + a.mtu];
    let data = vec![0x5a; a.size];
    let half = Duration::from_micros(3);
    let mut now = Time::ZERO;
    let mut trips = 0u64;
    let mut held = Held {
        frame: vec![0u8; 14 + a.mtu],
        len: None,
    };
    while trips < a.messages {
        held.len = send_ping(
            &mut x,
            now,
            bench_message(cb, &data, trips),
            &mut held.frame,
        )
        .map_err(|e| e.to_string())?;
        for t in [&mut x, &mut y] {
            if t.poll_timeout().is_some_and(|d| d <= now) {
                t.handle_timeout(now);
            }
        }
        now = now + half;
        crossing(now, (&mut x, &mut y), ca, &mut buf, &mut held, true)
            .map_err(|e| format!("round trip {trips}, request: {e}"))?;
        now = now + half;
        crossing(now, (&mut y, &mut x), cb, &mut buf, &mut held, false)
            .map_err(|e| format!("round trip {trips}, answer: {e}"))?;
        trips += 1;
    }
    let (sx, sy) = (x.stats(), y.stats());
    Ok(PingCounts {
        round_trips: trips,
        data_frames: sx.data_frames + sy.data_frames,
        ack_frames: sx.ack_frames + sy.ack_frames,
        retransmitted_frames: sx.retransmitted_frames + sy.retransmitted_frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_pong_is_one_frame_each_way_with_the_ack_on_the_answer() {
        let a = Args {
            messages: 500,
            size: 64,
            no_aggregation: false,
            mtu: 1500,
            pingpong: true,
        };
        // The counted loop is the one torusd runs: no ACK frame of its own, nothing sent
        // twice, one data frame per crossing.
        assert_eq!(
            ping_counts(&a),
            Ok(PingCounts {
                round_trips: 500,
                data_frames: 1000,
                ack_frames: 0,
                retransmitted_frames: 0,
            })
        );
    }

    #[test]
    fn a_ping_pong_of_large_messages_is_refused_with_the_range() {
        let a = Args {
            messages: 10,
            size: 300,
            no_aggregation: false,
            mtu: 1500,
            pingpong: true,
        };
        let e = ping_counts(&a).unwrap_err();
        assert!(e.contains("1..=256") && e.contains("300"), "{e}");
    }
}

//! Settings of the transport.

use super::*;

/// Settings of the transport.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Sliding window per peer, in frames (512 by default: how it was chosen is in
    /// docs/transport.md).
    pub window: u32,
    /// Explicit ACK after this many frames with nothing to piggyback on.
    pub ack_every: u32,
    /// ... or after this long.
    pub ack_delay: Duration,
    /// Reordering tolerated before a gap is NACKed (frames).
    pub nack_threshold: u32,
    /// Repeat NACKs for gaps still open after at most this long (adaptive below it).
    pub nack_retry: Duration,
    /// Shortest NACK repeat interval.
    pub nack_retry_min: Duration,
    /// Lower bound of the coarse retransmission timeout.
    pub min_rto: Duration,
    /// Upper bound of the retransmission timeout after backoff.
    pub max_rto: Duration,
    /// Timeout before a peer's round trip has been measured (a connection that has sent
    /// little, behind deep queues, must not time out spuriously).
    pub initial_rto: Duration,
    /// Link MTU: bytes after the Ethernet header (1500, or 9000 for jumbo frames).
    pub mtu: usize,
    /// Pack several small messages into one frame.
    pub aggregate: bool,
    /// Hold a partly filled aggregated frame at most this long for more messages (zero:
    /// send as soon as a link has room, which aggregates exactly what queued meanwhile).
    pub agg_delay: Duration,
    /// Largest reliable message, in bytes.
    pub max_message: usize,
    /// Bytes each service may have queued before `send` answers would-block (each message
    /// counts with its 6-byte aggregation header).
    pub queue_bytes: usize,
    /// Most peers a server keeps connections with (bounds memory under hostile input).
    pub max_peers: usize,
    /// This dataplane's incarnation, drawn at every start: SYNCs carry it, so a peer tells
    /// a restart from a reset, and connection ids are drawn from it.
    pub incarnation: u64,
    /// A connection that waits for its peer this long without any progress (no
    /// acknowledgement, no answer to its SYNC) is broken: its messages are reported failed
    /// and its memory released. Many RTOs, so loss alone never breaks a connection.
    pub broken_after: Duration,
    /// First interval between unanswered SYNCs (then doubling).
    pub sync_retry: Duration,
    /// Idle buffers for copies of sent frames kept for reuse, shared by all peers. A
    /// window's worth means a sender in steady state allocates nothing (with 64, a
    /// 512-frame window freed and allocated again every frame past the 64th); a process
    /// running thousands of engines (the simulator) keeps fewer.
    pub spare_frames: usize,
    /// Hold a queued message whose bytes are all one value as that value and its length,
    /// writing the bytes out only into the frame (frames are the same either way). For the
    /// simulator, whose benchmark payloads are such runs: thousands of engines otherwise
    /// each copy every payload into a queue of their own. Off in a dataplane, where
    /// looking would cost a pass over every message for nothing.
    pub compact_runs: bool,
    /// With `compact_runs`: a short frame whose tail is a message held as a run leaves that
    /// run unwritten in the driver's buffer and says so
    /// ([`Transport::take_declared_tail`], right after the frame). For the simulator,
    /// which carries such tails as a count anyway: writing 8 KB only to scan it back was a
    /// tenth of its run. A driver that sets it must write or carry every declared tail.
    pub declare_tails: bool,
    /// The congestion controller: windows from the telemetry peers echo.
    pub congestion: CongestionConfig,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            window: 512,
            ack_every: 64,
            ack_delay: Duration::from_micros(200),
            nack_threshold: 3,
            nack_retry: Duration::from_millis(1),
            nack_retry_min: Duration::from_micros(20),
            min_rto: Duration::from_millis(2),
            max_rto: Duration::from_millis(200),
            initial_rto: Duration::from_millis(20),
            mtu: 1500,
            aggregate: true,
            agg_delay: Duration::ZERO,
            max_message: 64 << 20,
            queue_bytes: 1 << 20,
            max_peers: 1 << 16,
            incarnation: 0,
            broken_after: Duration::from_secs(3),
            sync_retry: Duration::from_millis(5),
            spare_frames: 512,
            compact_runs: false,
            declare_tails: false,
            congestion: CongestionConfig::default(),
        }
    }
}

impl Config {
    /// Payload bytes a frame can carry at this MTU.
    pub fn max_payload(&self) -> usize {
        self.mtu.saturating_sub(TORUS_LEN)
    }
}

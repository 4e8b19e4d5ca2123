//! The status a poller publishes: every 100 ms, a snapshot of its engine's, links' and
//! deliveries' counters, for `torusctl status`, `--json` and the Prometheus endpoint.

use std::time::Duration;

use torusnet_proto::node::Node;
use torusnet_proto::time::Time;
use torusnet_proto::topology::DirSet;

use super::delivery::Delivery;
use crate::status::{EngineSnapshot, FlowRoute, PeerRtt, RoutingStatus, TransportStatus, XskStats};
use crate::transmit::Links;

/// How often the engine's counters are published.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(100);

/// The status publisher of one poller, and the facts about its view it reports.
#[derive(Debug)]
pub(crate) struct Publisher {
    /// When the snapshot was last published (None: not yet).
    last: Option<Time>,
    /// Unix time (ms) of the poller's epoch, to report its instants.
    epoch_unix_ms: u64,
    /// Views adopted (starts at 1: the configured one).
    view_version: u64,
    view_changed_unix_ms: u64,
}

impl Publisher {
    /// A publisher for a poller whose clock starts now.
    pub(crate) fn new() -> Publisher {
        Publisher {
            last: None,
            epoch_unix_ms: unix_ms(),
            view_version: 1,
            view_changed_unix_ms: unix_ms(),
        }
    }

    /// Whether a snapshot is due at `now`.
    pub(crate) fn due(&self, now: Time) -> bool {
        self.last.is_none_or(|t| now.since(t) >= SNAPSHOT_EVERY)
    }

    /// Notes that the engine adopted a new view.
    pub(crate) fn view_adopted(&mut self) {
        self.view_version += 1;
        self.view_changed_unix_ms = unix_ms();
    }

    /// The snapshot of this poller at `now`.
    pub(crate) fn snapshot(
        &mut self,
        now: Time,
        node: &Node,
        links: &Links,
        delivery: &Delivery,
        carrier_down: DirSet,
    ) -> EngineSnapshot {
        self.last = Some(now);
        let t = node.transport_stats();
        let ns = node.stats();
        let unreachable = node
            .dims()
            .coords()
            .filter(|c| !node.routes().is_reachable(*c))
            .map(|c| c.to_array())
            .collect();
        let ports = || links.ports.iter().zip(links.link_indices());
        EngineSnapshot {
            transport: TransportStatus::from(
                t,
                node.transport().in_flight(),
                node.transport().peers() as u64,
            ),
            forwarded: ns.forwarded,
            key_delivered: ns.key_delivered,
            intercepted: ns.intercepted,
            key_no_root: ns.key_no_root,
            xdp: match &links.shared().xdp {
                Some(x) => {
                    let x = x.lock();
                    ports().map(|(p, i)| (*i, x.counters(p.dir))).collect()
                }
                None => Vec::new(),
            },
            xsk: ports()
                .map(|(p, i)| {
                    let st = p.xsk.statistics().unwrap_or_default();
                    let x = XskStats {
                        rx_dropped: st.rx_dropped,
                        rx_ring_full: st.rx_ring_full,
                        rx_fill_ring_empty: st.rx_fill_ring_empty_descs,
                        tx_invalid: st.tx_invalid_descs,
                    };
                    (*i, x)
                })
                .collect(),
            unreachable,
            view_version: self.view_version,
            umem_free: links.umem.free_chunks(),
            tx_slots_free: links.umem.free_slots(),
            tx_slots_kept: links.umem.held_slots(),
            inbox_overflow: delivery.overflow_drops,
            no_service: delivery.no_service,
            handoffs: links.handoffs.passed,
            handoff_dropped: links.handoffs.dropped,
            // The process's, not a poller's: filled in by the status.
            commands_dropped: 0,
            pollers: 1,
            rtt: node
                .transport()
                .rtts(1024)
                .into_iter()
                .map(|(p, d)| PeerRtt {
                    peer: p.to_string(),
                    srtt_us: d.as_secs_f64() * 1e6,
                })
                .collect(),
            routing: self.routing_status(node),
            view_changed_unix_ms: self.view_changed_unix_ms,
            carrier_down: carrier_down.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn routing_status(&self, node: &Node) -> RoutingStatus {
        let s = node.source_stats();
        let src = node.source_routing();
        let mode = match (src.bsr(), src.is_enabled()) {
            (None, _) => "off",
            (Some(_), false) => "next-hop",
            (Some(_), true) => "source",
        };
        let flows = src
            .bsr()
            .map(|b| {
                b.routes()
                    .take(256)
                    .map(|(dst, r)| FlowRoute {
                        dst: dst.to_string(),
                        path: r.dirs().map(|d| d.name()).collect::<Vec<_>>().join(" "),
                        avail_mbps: b
                            .paths(dst)
                            .into_iter()
                            .find(|(p, _)| *p == r)
                            .and_then(|(_, a)| a),
                        paths: b
                            .paths(dst)
                            .into_iter()
                            .map(|(p, a)| {
                                let names: Vec<&str> = p.dirs().map(|d| d.name()).collect();
                                (names.join(" "), a)
                            })
                            .collect(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        RoutingStatus {
            mode,
            services: src.services().map(<[u16]>::to_vec).unwrap_or_default(),
            routed_sent: s.routed_sent,
            forwarded: s.forwarded,
            bad_route: s.bad_route,
            path_failed: s.path_failed,
            failures_sent: s.failures_sent,
            replies_sent: s.replies_sent,
            probes: s.bsr.probes,
            replies: s.bsr.replies,
            failures: s.bsr.failures,
            switches: s.bsr.switches,
            failovers: s.bsr.failovers,
            last_failover_unix_ms: s.bsr.last_failover.map_or(0, |t| self.unix_ms_of(t)),
            flows,
        }
    }

    /// The Unix time (ms) of an engine instant.
    fn unix_ms_of(&self, t: Time) -> u64 {
        self.epoch_unix_ms + t.as_nanos() / 1_000_000
    }
}

/// The Unix time now, ms.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

//! torusd's Prometheus metrics: its status as metric families, labelled per link and per
//! peer (the endpoint itself is `torusnet_ops::metrics`). Off unless the node file sets
//! `metrics = "ADDRESS:PORT"`; see docs/operations.md for the families.

use serde_json::Value;
use torusnet_ops::metrics::{Exposition, Kind};

/// Status fields that only go up.
fn is_counter(k: &str) -> bool {
    !matches!(
        k,
        "in_flight"
            | "peers"
            | "view_version"
            | "umem_free"
            | "tx_slots_free"
            | "tx_slots_kept"
            | "pollers"
            | "uptime_s"
            | "mtu"
            | "poller"
            | "tx_budget"
            | "connections"
            | "regions"
            | "capabilities"
            | "items"
            | "bytes_held"
            | "reachable"
            | "unreachable"
            | "srtt_us"
            | "bytes"
            | "cache_items"
            | "cache_bytes"
            | "caught_up"
            | "slowest_op_us"
    ) && !k.ends_with("_now")
}

/// The families of one status (`mgmt`'s `status` answer).
pub fn render(status: &Value) -> String {
    let mut e = Exposition::new();
    let server = status["coord"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|x| x.as_u64().unwrap_or(0).to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    if status.get("waiting").is_some() {
        e.add(
            "torusnet_dataplane_up",
            Kind::Gauge,
            "1 when the dataplane runs, 0 while it waits for its coordinate",
            &[],
            0.0,
        );
        return e.render();
    }
    let base = [("server", server.as_str())];
    e.add(
        "torusnet_dataplane_up",
        Kind::Gauge,
        "1 when the dataplane runs, 0 while it waits for its coordinate",
        &base,
        1.0,
    );
    if let Some(up) = status["uptime_s"].as_f64() {
        e.add(
            "torusnet_uptime_seconds",
            Kind::Gauge,
            "seconds since this incarnation started",
            &base,
            up,
        );
    }
    add_links(&mut e, status, &server);
    add_engine(&mut e, status, &server);
    add_services(&mut e, status, &server);
    e.render()
}

/// The per-link families: counters, XDP and socket statistics, zero-copy.
fn add_links(e: &mut Exposition, status: &Value, server: &str) {
    for l in status["links"].as_array().into_iter().flatten() {
        let dir = l["dir"].as_str().unwrap_or("?");
        let ifname = l["ifname"].as_str().unwrap_or("?");
        let labels = [("server", server), ("link", dir), ("ifname", ifname)];
        e.add_json("torusnet_link", &l["counters"], &labels, &is_counter);
        e.add_json("torusnet_link_xdp", &l["xdp"], &labels, &is_counter);
        e.add_json("torusnet_link_xsk", &l["xsk"], &labels, &is_counter);
        if let Some(n) = l["redirect_errors"].as_f64() {
            e.add(
                "torusnet_link_redirect_errors_total",
                Kind::Counter,
                "frames the XDP program redirected to this link that the driver could not take",
                &labels,
                n,
            );
        }
        let zc = l["afxdp_mode"].as_str() == Some("zero-copy");
        e.add(
            "torusnet_link_zero_copy",
            Kind::Gauge,
            "1 when the link's AF_XDP socket is in zero-copy mode",
            &labels,
            f64::from(u8::from(zc)),
        );
    }
}

/// The engine's families: transport, engine counters and gauges, reachability, RTTs.
fn add_engine(e: &mut Exposition, status: &Value, server: &str) {
    let base = [("server", server)];
    let engine = &status["engine"];
    e.add_json(
        "torusnet_transport",
        &engine["transport"],
        &base,
        &is_counter,
    );
    for k in [
        "forwarded",
        "key_delivered",
        "intercepted",
        "key_no_root",
        "inbox_overflow",
        "no_service",
        "handoffs",
        "handoff_dropped",
        "commands_dropped",
    ] {
        if let Some(v) = engine[k].as_f64() {
            e.add(
                &format!("torusnet_engine_{k}_total"),
                Kind::Counter,
                &k.replace('_', " "),
                &base,
                v,
            );
        }
    }
    for (k, help) in [
        (
            "view_version",
            "version of the view in use (counts adopted views)",
        ),
        ("umem_free", "free UMEM chunks"),
        ("tx_slots_free", "free UMEM transmit slots (jumbo frames)"),
        (
            "tx_slots_kept",
            "UMEM transmit slots holding frames kept until acknowledged",
        ),
        ("pollers", "pollers running"),
    ] {
        if let Some(v) = engine[k].as_f64() {
            e.add(&format!("torusnet_{k}"), Kind::Gauge, help, &base, v);
        }
    }
    let dims: Vec<u64> = status["dims"]
        .as_str()
        .unwrap_or("")
        .split('x')
        .filter_map(|d| d.parse().ok())
        .collect();
    let servers: u64 = dims.iter().product();
    let unreachable = engine["unreachable"].as_array().map_or(0, Vec::len) as u64;
    e.add(
        "torusnet_reachable_servers",
        Kind::Gauge,
        "servers reachable in this server's view (itself included)",
        &base,
        servers.saturating_sub(unreachable) as f64,
    );
    e.add(
        "torusnet_servers",
        Kind::Gauge,
        "servers in the torus",
        &base,
        servers as f64,
    );
    for p in engine["rtt"].as_array().into_iter().flatten() {
        let peer = p["peer"].as_str().unwrap_or("?");
        if let Some(us) = p["srtt_us"].as_f64() {
            e.add(
                "torusnet_peer_srtt_seconds",
                Kind::Gauge,
                "the transport's smoothed round-trip time to a peer",
                &[("server", server), ("peer", peer)],
                us / 1e6,
            );
        }
    }
}

/// The applications' and the services' families (key-value store, IP, remote memory).
fn add_services(e: &mut Exposition, status: &Value, server: &str) {
    let base = [("server", server)];
    for a in status["apps"].as_array().into_iter().flatten() {
        let name = a["name"].as_str().unwrap_or("?");
        let labels = [("server", server), ("app", name)];
        for k in ["sent", "received", "acked", "failed", "dropped"] {
            if let Some(v) = a[k].as_f64() {
                e.add(
                    &format!("torusnet_app_{k}_total"),
                    Kind::Counter,
                    &format!("messages {k} by an attached application"),
                    &labels,
                    v,
                );
            }
        }
    }
    if let Some(kv) = status.get("kv").filter(|v| !v.is_null()) {
        e.add_json("torusnet_kv", &kv["store"], &base, &is_counter);
        for k in ["connections", "commands"] {
            if let Some(v) = kv[k].as_f64() {
                let kind = if k == "commands" {
                    Kind::Counter
                } else {
                    Kind::Gauge
                };
                let name = if kind == Kind::Counter {
                    format!("torusnet_kv_gateway_{k}_total")
                } else {
                    format!("torusnet_kv_gateway_{k}")
                };
                e.add(&name, kind, &format!("memcached gateway {k}"), &base, v);
            }
        }
    }
    if let Some(ip) = status.get("ip").filter(|v| !v.is_null()) {
        e.add_json("torusnet_ip", ip, &base, &is_counter);
    }
    if let Some(rm) = status.get("rmem").filter(|v| !v.is_null()) {
        e.add_json("torusnet_rmem", rm, &base, &is_counter);
        for (reason, n) in rm["refused"].as_object().into_iter().flatten() {
            if let Some(n) = n.as_f64() {
                e.add(
                    "torusnet_rmem_refused_by_reason_total",
                    Kind::Counter,
                    "remote-memory accesses refused here, by reason",
                    &[("server", server), ("reason", reason)],
                    n,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_becomes_labelled_families() {
        let st = serde_json::json!({
            "coord": [1, 0, 2], "dims": "3x3x3", "uptime_s": 4.5,
            "links": [{"dir": "+x", "ifname": "px", "afxdp_mode": "copy",
                       "counters": {"rx_frames": 10, "drop_transport": 1},
                       "xdp": {"redirected": 9, "transit_in": 4, "up": {"local": 2}},
                       "redirect_errors": 1, "xsk": {"rx_ring_full": 0}}],
            "engine": {"transport": {"data_frames": 5, "in_flight": 2}, "forwarded": 3,
                       "view_version": 7, "unreachable": [[2, 2, 2]],
                       "rtt": [{"peer": "0,0,0", "srtt_us": 52.0}]},
            "apps": [], "kv": null, "ip": null,
            "rmem": {"writes": 1, "refused": {"bad cookie": 2}}
        });
        let t = render(&st);
        assert!(
            t.contains(
                "torusnet_link_rx_frames_total{server=\"1,0,2\",link=\"+x\",ifname=\"px\"} 10"
            ),
            "{t}"
        );
        assert!(t.contains("torusnet_link_xdp_redirected_total{"));
        assert!(t.contains("torusnet_link_xdp_transit_in_total{"));
        assert!(t.contains("torusnet_link_xdp_up_local_total{"));
        assert!(t.contains("torusnet_link_redirect_errors_total{"));
        assert!(t.contains("torusnet_transport_in_flight{server=\"1,0,2\"} 2"));
        assert!(t.contains("torusnet_view_version{server=\"1,0,2\"} 7"));
        assert!(t.contains("torusnet_reachable_servers{server=\"1,0,2\"} 26"));
        assert!(t.contains("torusnet_peer_srtt_seconds{server=\"1,0,2\",peer=\"0,0,0\"} 0.000052"));
        assert!(t.contains(
            "torusnet_rmem_refused_by_reason_total{server=\"1,0,2\",reason=\"bad cookie\"} 2"
        ));
        let waiting = render(&serde_json::json!({"waiting": "x"}));
        assert!(waiting.contains("torusnet_dataplane_up 0"));
    }
}

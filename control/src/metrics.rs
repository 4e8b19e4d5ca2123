//! The control process's Prometheus metrics, made from its status: links (up, last hello),
//! the view (version, reachable servers, links down), the link-state database, publishing
//! to torusd, refused control frames. Off unless the node file sets `[control] metrics`.

use serde_json::Value;
use torusnet_ops::metrics::{Exposition, Kind};

/// The families of one status snapshot.
pub fn render(st: &Value) -> String {
    let mut e = Exposition::new();
    let server = st["coord"].as_str().unwrap_or("").to_string();
    let name = st["name"].as_str().unwrap_or("").to_string();
    let base = [("server", server.as_str()), ("name", name.as_str())];
    let starting = st.get("starting").is_some();
    e.add(
        "torusnet_control_up",
        Kind::Gauge,
        "1 once the control process runs its loop",
        &base,
        if starting { 0.0 } else { 1.0 },
    );
    let gauges = [
        ("view_version", "version of this server's view"),
        (
            "reachable",
            "servers reachable in this server's view (itself included)",
        ),
        ("lsdb_records", "records in the link-state database"),
        ("published_version", "last view version torusd accepted"),
        (
            "publish_latency_us",
            "how long torusd took to adopt the last view, microseconds",
        ),
    ];
    for (k, help) in gauges {
        if let Some(v) = st[k].as_f64() {
            e.add(
                &format!("torusnet_control_{k}"),
                Kind::Gauge,
                help,
                &base,
                v,
            );
        }
    }
    if let Some(v) = st["refused_frames"].as_f64() {
        e.add(
            "torusnet_control_refused_frames_total",
            Kind::Counter,
            "control frames refused (bad, unauthenticated, miswired)",
            &base,
            v,
        );
    }
    for (k, help) in [
        ("unreachable", "servers unreachable in this server's view"),
        ("down_links", "links down in this server's view"),
    ] {
        if let Some(a) = st[k].as_array() {
            e.add(
                &format!("torusnet_control_{k}"),
                Kind::Gauge,
                help,
                &base,
                a.len() as f64,
            );
        }
    }
    e.add(
        "torusnet_control_publish_error",
        Kind::Gauge,
        "1 while publishing the view to torusd fails",
        &base,
        if st["publish_error"].is_string() {
            1.0
        } else {
            0.0
        },
    );
    for l in st["links"].as_array().into_iter().flatten() {
        let dir = l["dir"].as_str().unwrap_or("?");
        let ifname = l["ifname"].as_str().unwrap_or("?");
        let state = l["state"].as_str().unwrap_or("down");
        let labels = [
            ("server", server.as_str()),
            ("link", dir),
            ("ifname", ifname),
        ];
        e.add(
            "torusnet_control_link_up",
            Kind::Gauge,
            "1 while hellos arrive on the link from the expected neighbour",
            &labels,
            if state == "up" { 1.0 } else { 0.0 },
        );
        e.add(
            "torusnet_control_link_miswired",
            Kind::Gauge,
            "1 when the link reaches a server the wiring plan does not expect",
            &labels,
            if state == "miswired" { 1.0 } else { 0.0 },
        );
        if let Some(ms) = l["last_hello_ms_ago"].as_f64() {
            e.add(
                "torusnet_control_link_last_hello_seconds",
                Kind::Gauge,
                "seconds since the last hello on the link",
                &labels,
                ms / 1e3,
            );
        }
    }
    e.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_to_families() {
        let st = serde_json::json!({"name": "n", "coord": "1,1,1", "view_version": 4, "reachable": 26,
            "unreachable": ["0,0,0"], "down_links": [], "refused_frames": 3, "publish_error": null,
            "links": [{"dir": "+x", "ifname": "px", "state": "up", "last_hello_ms_ago": 50}]});
        let t = render(&st);
        assert!(
            t.contains("torusnet_control_view_version{server=\"1,1,1\",name=\"n\"} 4"),
            "{t}"
        );
        assert!(
            t.contains("torusnet_control_link_up{server=\"1,1,1\",link=\"+x\",ifname=\"px\"} 1")
        );
        assert!(t.contains("torusnet_control_refused_frames_total{server=\"1,1,1\",name=\"n\"} 3"));
        assert!(t.contains("torusnet_control_unreachable{server=\"1,1,1\",name=\"n\"} 1"));
    }
}

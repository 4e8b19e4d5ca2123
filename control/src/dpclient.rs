//! A client of `torusd`'s management socket (one JSON object per line), and the human
//! rendering of its status.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// Sends one request and returns the answer; errors say what failed in one line.
pub fn request(socket: &Path, req: &Value, timeout: Duration) -> Result<Value, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| {
        format!(
            "cannot reach torusd at {}: {e} (is it running?)",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    writeln!(s, "{req}").map_err(|e| format!("cannot send to torusd: {e}"))?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            format!(
                "no answer from {} within {:.0} s",
                socket.display(),
                timeout.as_secs_f64()
            )
        } else {
            format!("no answer from {}: {e}", socket.display())
        }
    })?;
    if line.is_empty() {
        return Err(format!(
            "{} closed the connection without answering",
            socket.display()
        ));
    }
    let v: Value =
        serde_json::from_str(&line).map_err(|e| format!("torusd answered non-JSON: {e}"))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(format!("torusd: {e}"));
    }
    Ok(v)
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_u64().unwrap_or(0)
}

/// The status as a table for people.
pub fn render_status(v: &Value) -> String {
    let mut out = String::new();
    let coord = v["coord"].as_array().map(|a| {
        a.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    });
    out += &format!(
        "server {} at {} in a {} torus, MTU {}, {} polling, up {:.1} s\n",
        v["name"].as_str().unwrap_or("?"),
        coord.unwrap_or_default(),
        v["dims"].as_str().unwrap_or("?"),
        u(v, &["mtu"]),
        v["polling"].as_str().unwrap_or("?"),
        v["uptime_s"].as_f64().unwrap_or(0.0),
    );
    render_links(&mut out, v);
    render_transport(&mut out, v);
    render_apps(&mut out, v);
    render_kv(&mut out, v);
    render_routing(&mut out, v);
    out
}

/// The status's link tables: frames and drops, then load and carrier.
fn render_links(out: &mut String, v: &Value) {
    *out += "link  interface        xdp              af_xdp      rx frames   tx frames   forwarded  drops  xdp redirected/passed/malformed/fault\n";
    for l in v["links"].as_array().into_iter().flatten() {
        let c = &l["counters"];
        let drops: u64 = [
            "drop_malformed",
            "drop_bad_source",
            "drop_bad_mac",
            "drop_unreachable",
            "drop_ttl",
            "drop_transport",
            "drop_intercepted",
            "drop_bad_route",
            "drop_path_failed",
            "drop_stale",
            "drop_no_room",
        ]
        .iter()
        .map(|k| c[*k].as_u64().unwrap_or(0))
        .sum();
        *out += &format!(
            "{:<5} {:<16} {:<16} {:<10} {:>10} {:>11} {:>11} {:>6}  {}/{}/{}/{}\n",
            l["dir"].as_str().unwrap_or("?"),
            l["ifname"].as_str().unwrap_or("?"),
            format!(
                "{} {}",
                l["xdp_mode"].as_str().unwrap_or("?"),
                l["xdp_section"].as_str().unwrap_or("")
            ),
            l["afxdp_mode"].as_str().unwrap_or("?"),
            u(c, &["rx_frames"]),
            u(c, &["tx_frames"]),
            u(c, &["forwarded"]),
            drops,
            u(l, &["xdp", "redirected"]),
            u(l, &["xdp", "passed"]),
            u(l, &["xdp", "malformed"]),
            u(l, &["xdp", "fault_dropped"]),
        );
    }
    *out += "link  tx load  rx load  tx queue  carrier\n";
    let down: Vec<&str> = v["engine"]["carrier_down"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for l in v["links"].as_array().into_iter().flatten() {
        let c = &l["counters"];
        let dir = l["dir"].as_str().unwrap_or("?");
        *out += &format!(
            "{:<5} {:>6.1}%  {:>6.1}%  {:>8.1}  {}\n",
            dir,
            u(c, &["load_tx_permille"]) as f64 / 10.0,
            u(c, &["load_rx_permille"]) as f64 / 10.0,
            u(c, &["load_queue_milli"]) as f64 / 1000.0,
            if down.contains(&dir) { "down" } else { "up" },
        );
    }
    render_xdp_transit(out, v);
}

/// The status's table of frames the XDP program forwarded by itself, per link, and why the
/// others went up to the poller.
fn render_xdp_transit(out: &mut String, v: &Value) {
    let on = match v["xdp_transit"].as_bool() {
        Some(true) => "on",
        Some(false) => "off",
        None => return,
    };
    *out += &format!(
        "xdp transit ({on}): link  forwarded in  out  redirect errors  went up: local key intercept probe no_route link_down check headers
"
    );
    for l in v["links"].as_array().into_iter().flatten() {
        let x = &l["xdp"];
        let up = |k: &str| u(x, &["up", k]);
        *out += &format!(
            "                  {:<5} {:>12} {:>5} {:>16}  {} {} {} {} {} {} {} {}\n",
            l["dir"].as_str().unwrap_or("?"),
            u(x, &["transit_in"]),
            u(x, &["transit_out"]),
            u(l, &["redirect_errors"]),
            up("local"),
            up("key"),
            up("intercept"),
            up("probe"),
            up("no_route"),
            up("link_down"),
            up("check"),
            up("headers"),
        );
    }
}

/// The status's transport and connection lines.
fn render_transport(out: &mut String, v: &Value) {
    let t = &v["engine"]["transport"];
    *out += &format!(
        "transport: {} data frames, {} retransmitted, {} ACKs, {} NACKs, {} messages delivered, {} in flight\n",
        u(t, &["data_frames"]),
        u(t, &["retransmitted_frames"]),
        u(t, &["ack_frames"]),
        u(t, &["nack_frames"]),
        u(t, &["messages_delivered"]),
        u(t, &["in_flight"]),
    );
    *out += &format!(
        "connections: {} peers, incarnation {}, {} resets, {} broken, {} messages reported failed, {} stale frames dropped\n",
        u(t, &["peers"]),
        v["incarnation"].as_str().unwrap_or("?"),
        u(t, &["resets"]),
        u(t, &["broken"]),
        u(t, &["failed_messages"]),
        u(t, &["stale_frames"]),
    );
}

/// The status's table of attached applications (none: nothing).
fn render_apps(out: &mut String, v: &Value) {
    let apps = v["apps"].as_array().cloned().unwrap_or_default();
    if !apps.is_empty() {
        *out += "application      service  pid      sent      received  acked     failed  dropped  bad\n";
        for a in &apps {
            *out += &format!(
                "{:<16} {:<8} {:<8} {:<9} {:<9} {:<9} {:<7} {:<8} {}\n",
                a["name"].as_str().unwrap_or("?"),
                u(a, &["service"]),
                u(a, &["pid"]),
                u(a, &["sent"]),
                u(a, &["received"]),
                u(a, &["acked"]),
                u(a, &["failed"]),
                u(a, &["dropped"]),
                u(a, &["bad"]),
            );
        }
    }
}

/// The status's key-value store line, when the store is on.
fn render_kv(out: &mut String, v: &Value) {
    if v["kv"].is_object() {
        let k = &v["kv"];
        let st = &k["store"];
        *out += &format!(
            "kv: gateway {} ({} connections, {} commands); {} items, {} bytes; {} ops ({} hits, {} misses, {} writes, {} timeouts); primary {} ops; cache {} hits, {} misses, {} items; copies {} sent, {} re-replicated; caught up {}\n",
            k["gateway"].as_str().unwrap_or("off"),
            u(k, &["connections"]),
            u(k, &["commands"]),
            u(st, &["items"]),
            u(st, &["bytes"]),
            u(st, &["ops"]),
            u(st, &["hits"]),
            u(st, &["misses"]),
            u(st, &["writes"]),
            u(st, &["timeouts"]),
            u(st, &["primary_ops"]),
            u(st, &["cache_hits"]),
            u(st, &["cache_misses"]),
            u(st, &["cache_items"]),
            u(st, &["copies_sent"]),
            u(st, &["rereplicated"]),
            if u(st, &["caught_up"]) == 1 { "yes" } else { "no" },
        );
    }
}

/// The status's routing lines: the view, source routing and its flows.
fn render_routing(out: &mut String, v: &Value) {
    let e = &v["engine"];
    let unreachable = e["unreachable"].as_array().map(Vec::len).unwrap_or(0);
    *out += &format!(
        "routing: view version {}, {} forwarded, {} key-routed delivered here, {} servers unreachable\n",
        u(e, &["view_version"]),
        u(e, &["forwarded"]),
        u(e, &["key_delivered"]),
        unreachable
    );
    let r = &e["routing"];
    *out += &format!(
        "source routing: {}{}; {} flows, {} frames sent on routes, {} probes ({} answered), {} path switches ({} failovers); here: {} forwarded by route, {} probes answered, {} bad routes, {} path failures ({} reported)\n",
        r["mode"].as_str().unwrap_or("off"),
        match r["services"].as_array() {
            Some(s) if !s.is_empty() && r["mode"] == "source" => format!(
                " (services {})",
                s.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
            ),
            _ => String::new(),
        },
        r["flows"].as_array().map_or(0, Vec::len),
        u(r, &["routed_sent"]),
        u(r, &["probes"]),
        u(r, &["replies"]),
        u(r, &["switches"]),
        u(r, &["failovers"]),
        u(r, &["forwarded"]),
        u(r, &["replies_sent"]),
        u(r, &["bad_route"]),
        u(r, &["path_failed"]),
        u(r, &["failures_sent"]),
    );
    for f in r["flows"].as_array().into_iter().flatten().take(16) {
        *out += &format!(
            "  to {:<10} path {:<30} {}\n",
            f["dst"].as_str().unwrap_or("?"),
            f["path"].as_str().unwrap_or("?"),
            f["avail_mbps"]
                .as_u64()
                .map_or("not measured".to_string(), |m| format!("{m} Mb/s free")),
        );
    }
}

/// The control process's status as a table for people.
pub fn render_control(v: &Value) -> String {
    let mut out = String::new();
    out += &format!(
        "control {} (node {}) at {} in a {} torus; view version {} (published to torusd: {}), {} servers reachable",
        v["name"].as_str().unwrap_or("?"),
        u(v, &["node_id"]),
        v["coord"].as_str().unwrap_or("(no coordinate yet)"),
        v["dims"].as_str().unwrap_or("?"),
        u(v, &["view_version"]),
        v["published_version"].as_u64().map_or("no".to_string(), |p| format!("version {p}")),
        u(v, &["reachable"]),
    );
    if let Some(us) = v["publish_latency_us"].as_u64() {
        out += &format!(", last publish {us} us");
    }
    out += "\n";
    out += "link  interface        state     neighbour                         last hello\n";
    for l in v["links"].as_array().into_iter().flatten() {
        let n = &l["neighbor"];
        let who = if n.is_null() {
            "-".to_string()
        } else {
            format!(
                "node {} at {} ({})",
                u(n, &["node_id"]),
                n["coord"].as_str().unwrap_or("?"),
                n["mac"].as_str().unwrap_or("?")
            )
        };
        let hello = l["last_hello_ms_ago"]
            .as_u64()
            .map_or("never".to_string(), |m| format!("{m} ms ago"));
        out += &format!(
            "{:<5} {:<16} {:<9} {:<33} {}\n",
            l["dir"].as_str().unwrap_or("?"),
            l["ifname"].as_str().unwrap_or("?"),
            l["state"].as_str().unwrap_or("?"),
            who,
            hello
        );
        if let Some(m) = l["miswired"].as_str() {
            out += &format!("      MISWIRED: {m}\n");
        }
    }
    for p in v["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        out += &format!("{p}\n");
    }
    let un: Vec<&str> = v["unreachable"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !un.is_empty() {
        out += &format!("unreachable: {}\n", un.join(" "));
    }
    out
}

//! Human summaries of `torusctl`'s answers (the default for `ping` and `bench`, `--human`
//! for `key` and `route`), modelled on ping(8) and iperf3: a header, the totals, the
//! distribution. `--json` prints the answers as they come.

use serde_json::Value;

fn coord(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x.as_u64().map_or("?".into(), |n| n.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_else(|| v.as_str().unwrap_or("?").to_string())
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// `torusctl ping`'s answer; `Err` when the run failed.
pub fn ping(v: &Value) -> Result<String, String> {
    let count = v["count"].as_u64().unwrap_or(0);
    let received = v["received"].as_u64().unwrap_or(0);
    let lost = v["lost"].as_u64().unwrap_or(count.saturating_sub(received));
    let kind = if v["reliable"].as_bool() == Some(true) {
        "reliable"
    } else {
        "short"
    };
    let r = &v["rtt_us"];
    let mut out = format!(
        "PING {} ({}-byte {kind} messages through torusd's ping service)\n",
        coord(&v["to"]),
        v["size"].as_u64().unwrap_or(0)
    );
    let pct = if count > 0 {
        lost as f64 * 100.0 / count as f64
    } else {
        0.0
    };
    out += &format!(
        "{count} sent, {received} received, {lost} lost ({pct:.1}%), time {:.2} s\n",
        f(&v["elapsed_s"])
    );
    if received > 0 {
        out += &format!(
            "rtt min/p50/p90/p99/max/mean = {:.1}/{:.1}/{:.1}/{:.1}/{:.1}/{:.1} us",
            f(&r["min"]),
            f(&r["p50"]),
            f(&r["p90"]),
            f(&r["p99"]),
            f(&r["max"]),
            f(&r["mean"])
        );
    }
    match v["error"].as_str() {
        Some(e) => Err(format!("{out}\nping: {e}")),
        None => Ok(out.trim_end().to_string()),
    }
}

/// `torusctl bench`'s answer; `Err` when the run failed.
pub fn bench(v: &Value) -> Result<String, String> {
    if let Some(e) = v["error"].as_str() {
        return Err(format!(
            "bench to {}: {e} ({} of {} messages sent)",
            coord(&v["to"]),
            v["messages_sent"].as_u64().unwrap_or(0),
            v["messages"].as_u64().unwrap_or(0)
        ));
    }
    let rx = &v["receiver"];
    let kind = if v["reliable"].as_bool() == Some(false) {
        "short"
    } else {
        "reliable"
    };
    let fence = v["fence_every"].as_u64().unwrap_or(0);
    let mut out = format!(
        "BENCH to {}: {} {kind} messages of {} B{}\n",
        coord(&v["to"]),
        v["messages"].as_u64().unwrap_or(0),
        v["message_size"].as_u64().unwrap_or(0),
        if fence > 0 {
            format!(", a fence every {fence}")
        } else {
            String::new()
        }
    );
    out += &format!(
        "{:.1} MB in {:.2} s: goodput {:.2} Gb/s, {:.0} messages/s\n",
        f(&v["bytes"]) / 1e6,
        f(&v["elapsed_s"]),
        f(&v["goodput_gbps"]),
        f(&v["messages_per_s"])
    );
    let verified = rx["verified"].as_bool();
    let delivered = rx["delivered"].as_u64();
    out += &format!(
        "receiver: {} delivered, {}",
        delivered.map_or("?".into(), |d| d.to_string()),
        match verified {
            Some(true) => "every byte checked",
            Some(false) => "CHECK FAILED",
            None => "not checked",
        }
    );
    if verified == Some(false) {
        return Err(out);
    }
    Ok(out)
}

/// `torusctl multicast`'s answer; `Err` when a member did not complete or got other bytes.
pub fn multicast(v: &Value) -> Result<String, String> {
    let list = |k: &str| -> Vec<String> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    let mut out = format!(
        "MULTICAST {:.1} MB from {} to {} members over {} trees (depth {}, {} shared edges)\n",
        f(&v["size"]) / 1e6,
        v["root"].as_str().unwrap_or("?"),
        v["members"].as_u64().unwrap_or(0),
        v["trees"].as_u64().unwrap_or(0),
        v["tree_depth"].as_u64().unwrap_or(0),
        v["shared_edges"].as_u64().unwrap_or(0)
    );
    out += &format!(
        "{} completed in {:.2} s; per member: min {:.2} Gb/s, median {:.2} Gb/s",
        v["completed"].as_u64().unwrap_or(0),
        f(&v["elapsed_s"]),
        f(&v["min_member_gbps"]),
        f(&v["median_member_gbps"])
    );
    let lost = list("lost");
    if !lost.is_empty() {
        out += &format!(
            "\nlost (unreachable during the transfer): {}",
            lost.join(" ")
        );
    }
    let bad = list("checksum_mismatch");
    let incomplete = list("incomplete");
    if let Some(e) = v["error"].as_str() {
        out += &format!(
            "\nincomplete: {}\nmismatched: {}",
            incomplete.join(" "),
            bad.join(" ")
        );
        return Err(format!("{out}\nmulticast: {e}"));
    }
    out += "\nevery member's checksum matches the root's";
    Ok(out)
}

/// `torusctl aggregate`'s answer.
pub fn aggregate(v: &Value) -> Result<String, String> {
    let out = format!(
        "AGGREGATE ({}) rooted at {}: {} servers, {} keys, total {}, digest {}\n\
         link bytes {:.1} kB on path vs {:.1} kB sending every record to the root ({:.0}% saved); {:.2} s, {} restart(s)",
        v["combiner"].as_str().unwrap_or("?"),
        v["root"].as_str().unwrap_or("?"),
        v["servers"].as_u64().unwrap_or(0),
        v["keys"].as_u64().unwrap_or(0),
        v["total"].as_u64().unwrap_or(0),
        v["digest"].as_str().unwrap_or("?"),
        f(&v["agg_link_bytes"]) / 1e3,
        f(&v["raw_link_bytes"]) / 1e3,
        f(&v["saved"]) * 100.0,
        f(&v["elapsed_s"]),
        v["restarts"].as_u64().unwrap_or(0)
    );
    match v["error"].as_str() {
        Some(e) => Err(format!("{out}\naggregate: {e}")),
        None => Ok(out),
    }
}

/// `torusctl key --human`.
pub fn key(v: &Value, replicas: usize) -> String {
    let servers: Vec<String> = v["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(coord)
        .collect();
    let mut out = format!(
        "key {} (routing key {})\nhome {} (index {}), root {}\n",
        v["key"].as_str().unwrap_or("?"),
        v["routing_key"].as_str().unwrap_or("?"),
        coord(&v["home"]),
        v["index"].as_u64().unwrap_or(0),
        servers.first().map_or("none reachable", String::as_str)
    );
    if replicas > 1 {
        out += &format!("GetServersForKey(key, {replicas}): {}", servers.join("  "));
    }
    out.trim_end().to_string()
}

/// `torusctl route --human`.
pub fn route(v: &Value) -> String {
    let hops: Vec<&str> = v["next_hops"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match v["distance"].as_u64() {
        Some(0) => format!("{} is the destination itself", coord(&v["from"])),
        Some(d) => format!(
            "{} -> {}: {d} hop{}, next hops {}",
            coord(&v["from"]),
            coord(&v["to"]),
            if d == 1 { "" } else { "s" },
            hops.join(" ")
        ),
        None => format!("{} -> {}: unreachable", coord(&v["from"]), coord(&v["to"])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ping_reads_like_ping() {
        let v = json!({"to": [1, 0, 0], "count": 10, "size": 64, "reliable": false, "received": 9,
            "lost": 1, "elapsed_s": 0.01, "rtt_us": {"min": 20.0, "p50": 25.5, "p90": 30.0,
            "p99": 31.0, "p999": 31.0, "max": 31.0, "mean": 25.0}, "cdf_us": [1.0, 2.0]});
        let out = ping(&v).expect("ok");
        assert!(
            out.starts_with("PING 1,0,0 (64-byte short messages"),
            "{out}"
        );
        assert!(out.contains("10 sent, 9 received, 1 lost (10.0%)"));
        assert!(out.contains("= 20.0/25.5/30.0/31.0/31.0/25.0 us"));
        assert!(!out.contains("cdf"));
        assert!(
            ping(&json!({"to": [1, 0, 0], "count": 1, "received": 0, "error": "timed out"}))
                .is_err()
        );
    }

    #[test]
    fn bench_and_queries() {
        let v = json!({"to": [2, 2, 2], "reliable": true, "messages": 100, "message_size": 65536,
            "bytes": 6553600, "fence_every": 0, "elapsed_s": 0.5, "goodput_gbps": 0.1,
            "messages_per_s": 200.0, "receiver": {"verified": true, "delivered": 100}});
        let out = bench(&v).expect("ok");
        assert!(
            out.contains("goodput 0.10 Gb/s") && out.contains("every byte checked"),
            "{out}"
        );
        let k = key(
            &json!({"key": "ab", "routing_key": "cd", "home": [1, 2, 3], "index": 0,
            "servers": [[1, 2, 3], [2, 2, 3]]}),
            2,
        );
        assert!(
            k.contains("home 1,2,3") && k.contains("GetServersForKey(key, 2): 1,2,3  2,2,3"),
            "{k}"
        );
        let r = route(
            &json!({"from": [0, 0, 0], "to": [1, 1, 0], "distance": 2, "next_hops": ["+x", "+y"]}),
        );
        assert_eq!(r, "0,0,0 -> 1,1,0: 2 hops, next hops +x +y");
    }
}

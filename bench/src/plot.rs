//! SVG charts of the suite's results (plotters): throughput against message size,
//! throughput against links and hops, and latency CDFs.

use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    let mut c = v;
    for p in path {
        c = &c[*p];
    }
    c.as_f64()
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Writes throughput-vs-size.svg, throughput-vs-links-hops.svg and latency-cdf.svg into `dir`.
pub fn suite_charts(report: &Value, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let r = &report["results"];
    size_chart(r, &dir.join("throughput-vs-size.svg"))?;
    bars_chart(r, &dir.join("throughput-vs-links-hops.svg"))?;
    cdf_chart(r, &dir.join("latency-cdf.svg"))?;
    Ok(())
}

fn size_chart(r: &Value, path: &Path) -> Result<(), String> {
    let mut tor = Vec::new();
    let mut raw = Vec::new();
    for (name, v) in r.as_object().into_iter().flatten() {
        if let Some(sz) = name
            .strip_prefix("size sweep ")
            .and_then(|x| x.split(' ').next())
            .and_then(|x| x.parse::<f64>().ok())
        {
            if let (Some(t), Some(w)) = (
                num(v, &["torusnet", "goodput_gbps"]),
                num(v, &["raw_afxdp", "goodput_gbps"]),
            ) {
                tor.push((sz, t));
                raw.push((sz, w));
            }
        }
    }
    tor.sort_by(|a, b| a.0.total_cmp(&b.0));
    raw.sort_by(|a, b| a.0.total_cmp(&b.0));
    let ymax = tor.iter().chain(&raw).map(|p| p.1).fold(0.1, f64::max) * 1.15;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "Goodput vs message size (MTU 9000, one link, reliable)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((32f64..2_000_000f64).log_scale(), 0f64..ymax)
        .map_err(err)?;
    c.configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("Gb/s")
        .draw()
        .map_err(err)?;
    c.draw_series(LineSeries::new(tor.clone(), &BLUE))
        .map_err(err)?
        .label("torusnet")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    c.draw_series(tor.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))
        .map_err(err)?;
    c.draw_series(LineSeries::new(raw.clone(), &RED))
        .map_err(err)?
        .label("raw AF_XDP, same frames")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    c.draw_series(raw.iter().map(|p| Circle::new(*p, 4, RED.filled())))
        .map_err(err)?;
    c.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn bars_chart(r: &Value, path: &Path) -> Result<(), String> {
    let items: Vec<(String, f64)> = [
        ("1 link", "1 link(s), 64 KiB, MTU 9000"),
        ("2 links", "2 link(s), 64 KiB, MTU 9000"),
        ("0 hops*", "0 forwarding hop(s), 64 KiB, MTU 9000, adaptive"),
        ("1 hop*", "1 forwarding hop(s), 64 KiB, MTU 9000, adaptive"),
        ("2 hops*", "2 forwarding hop(s), 64 KiB, MTU 9000, adaptive"),
    ]
    .iter()
    .map(|(l, k)| {
        (
            l.to_string(),
            num(&r[*k], &["torusnet", "goodput_gbps"]).unwrap_or(0.0),
        )
    })
    .collect();
    let ymax = items.iter().map(|i| i.1).fold(0.1, f64::max) * 1.2;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = items.len() as u32;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "Goodput vs links and forwarding hops (64 KiB reliable, MTU 9000; * adaptive polling)",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((0u32..n).into_segmented(), 0f64..ymax)
        .map_err(err)?;
    let labels: Vec<String> = items.iter().map(|i| i.0.clone()).collect();
    c.configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("Gb/s")
        .draw()
        .map_err(err)?;
    c.draw_series(items.iter().enumerate().map(|(i, it)| {
        let i = i as u32;
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), it.1),
            ],
            BLUE.mix(0.7).filled(),
        );
        bar.set_margin(0, 0, 12, 12);
        bar
    }))
    .map_err(err)?;
    c.draw_series(items.iter().enumerate().map(|(i, it)| {
        Text::new(
            format!("{:.1}", it.1),
            (SegmentValue::CenterOf(i as u32), it.1 + ymax * 0.03),
            ("sans-serif", 14),
        )
    }))
    .map_err(err)?;
    root.present().map_err(err)
}

fn cdf_chart(r: &Value, path: &Path) -> Result<(), String> {
    let v = &r["RTT, 64 B short messages"];
    let series: Vec<(&str, RGBColor, Vec<f64>)> = [
        (
            "kernel UDP, blocking",
            "udp_blocking",
            RGBColor(150, 150, 150),
        ),
        (
            "kernel UDP, busy poll",
            "udp_busy_poll",
            RGBColor(0, 150, 0),
        ),
        ("raw AF_XDP", "raw_afxdp", RED),
        ("torusnet", "torusnet", BLUE),
    ]
    .iter()
    .map(|(l, k, col)| {
        let pts = v[*k]["cdf"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        (*l, *col, pts)
    })
    .collect();
    let xmax = series
        .iter()
        .flat_map(|s| s.2.iter().copied())
        .filter(|x| x.is_finite())
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "Ping-pong RTT CDF, 64 B, one veth pair, one core per side",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((1f64..xmax * 1.2).log_scale(), 0f64..1f64)
        .map_err(err)?;
    c.configure_mesh()
        .x_desc("round-trip time (us, log)")
        .y_desc("fraction")
        .draw()
        .map_err(err)?;
    for (label, col, pts) in series {
        let n = pts.len().max(2) as f64 - 1.0;
        let line: Vec<(f64, f64)> = pts
            .iter()
            .enumerate()
            .map(|(i, x)| (x.max(1.0), i as f64 / n))
            .collect();
        c.draw_series(LineSeries::new(line, col.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// A simple line chart of named series (x, y); `log_x` for sizes.
pub fn xy_chart(
    path: &Path,
    title: &str,
    xd: &str,
    yd: &str,
    series: &[(&str, Vec<(f64, f64)>)],
    log_x: bool,
) -> Result<(), String> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let pts = series.iter().flat_map(|s| s.1.iter().copied());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.1f64);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 >= x1 {
        x1 = x0 + 1.0;
    }
    let colors = [BLUE, RED, RGBColor(0, 150, 0)];
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    macro_rules! draw {
        ($c:expr) => {{
            let mut c = $c;
            c.configure_mesh()
                .x_desc(xd)
                .y_desc(yd)
                .draw()
                .map_err(err)?;
            for (i, (name, s)) in series.iter().enumerate() {
                let col = colors[i % colors.len()];
                c.draw_series(LineSeries::new(s.clone(), col.stroke_width(2)))
                    .map_err(err)?
                    .label(*name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col));
                c.draw_series(s.iter().map(|p| Circle::new(*p, 4, col.filled())))
                    .map_err(err)?;
            }
            c.configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE)
                .draw()
                .map_err(err)?;
        }};
    }
    let mut cb = ChartBuilder::on(&root);
    cb.caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55);
    if log_x {
        draw!(cb
            .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), 0f64..y1 * 1.2)
            .map_err(err)?);
    } else {
        draw!(cb.build_cartesian_2d(x0..x1, 0f64..y1 * 1.2).map_err(err)?);
    }
    root.present().map_err(err)
}

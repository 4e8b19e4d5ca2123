//! Multicast between applications: one sends a file to the applications of a service on a
//! group of servers; each member writes what it receives to a file.
//!
//! ```text
//! multicast send SOCKET SERVICE FILE [x,y,z ...]   # members: the servers listed (none: all)
//! multicast receive SOCKET SERVICE OUTDIR [COUNT]  # writes OUTDIR/<id> ("-": nowhere),
//!                                                  # exits after COUNT transfers
//! ```
//!
//! The sender copies the file into its pool (torusd reads it from there for as long as the
//! transfer lasts) and prints the report: one JSON line, with every member's outcome. A
//! receiver prints one JSON line per transfer that ended: its size, whether every byte came,
//! how long it took and the receiver's peak memory (its channel and one chunk at a time: the
//! file is written as the bytes arrive).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use torusnet_client::{
    rmem, AttachOptions, Client, Error, Event, MulticastOptions, MulticastReport, Wait,
};

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn send(socket: &str, service: &str, path: &str, group: &[(u16, u16, u16)]) -> Result<bool, Error> {
    let mut f = File::open(path).map_err(|e| Error::Refused(format!("{path}: {e}")))?;
    let len = f
        .metadata()
        .map_err(|e| Error::Refused(format!("{path}: {e}")))?
        .len();
    let pool = len.div_ceil(4096) * 4096 + (1 << 20);
    let c = Client::attach_with(
        socket,
        &format!("multicast-sender-{}", std::process::id()),
        AttachOptions { pool },
    )?;
    let r = c.register_region(len, rmem::READ)?;
    // Into the pool a piece at a time: the file is never held twice.
    let mut piece = vec![0u8; 8 << 20];
    let mut at = 0u64;
    while at < len {
        let n = f
            .read(&mut piece)
            .map_err(|e| Error::Refused(format!("{path}: {e}")))?;
        if n == 0 {
            break;
        }
        if !c.region_write(&r, at, &piece[..n]) {
            return Err(Error::Refused("the file does not fit the region".into()));
        }
        at += n as u64;
    }
    drop(piece);
    let t0 = Instant::now();
    let opts = MulticastOptions {
        timeout: Duration::from_secs((len / 1_000_000).clamp(60, 3600)),
        ..MulticastOptions::default()
    };
    let tag = c.multicast(group, service, &r, 0, len, opts)?;
    let report: MulticastReport = loop {
        match c.recv(Wait::Timeout(opts.timeout + Duration::from_secs(30)))? {
            Some(Event::MulticastReport(rep)) if rep.tag == tag => break rep,
            Some(_) => continue,
            None => return Err(Error::Timeout),
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let failed: Vec<String> = report
        .failed
        .iter()
        .map(|(m, why)| format!("\"{},{},{}: {}\"", m.0, m.1, m.2, why.replace('"', "'")))
        .collect();
    println!(
        "{{\"role\":\"sender\",\"bytes\":{len},\"seconds\":{secs:.3},\"ok\":{},\"completed\":{},\"failed\":[{}],\"gbps_per_member\":{:.3},\"report\":{}}}",
        report.ok,
        report.completed.len(),
        failed.join(","),
        len as f64 * 8.0 / secs / 1e9,
        report.json
    );
    Ok(report.ok)
}

fn receive(socket: &str, service: &str, dir: &str, count: usize) -> Result<bool, Error> {
    let c = Client::attach(socket, service)?;
    let mut files: HashMap<u64, (Option<File>, Instant, u64)> = HashMap::new();
    let mut ended = 0;
    let mut all_ok = true;
    while ended < count {
        match c.recv(Wait::Timeout(Duration::from_secs(3600)))? {
            Some(Event::MulticastData {
                id, offset, data, ..
            }) => {
                let entry = match files.entry(id) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        let f = match dir {
                            "-" => None,
                            _ => {
                                let path = format!("{dir}/{id:016x}");
                                let f = File::create(&path)
                                    .map_err(|e| Error::Refused(format!("{path}: {e}")))?;
                                Some(f)
                            }
                        };
                        v.insert((f, Instant::now(), 0))
                    }
                };
                if let Some(f) = &entry.0 {
                    f.write_all_at(&data, offset)
                        .map_err(|e| Error::Refused(format!("writing {id:016x}: {e}")))?;
                }
                entry.2 += data.len() as u64;
            }
            Some(Event::MulticastEnd {
                id,
                root,
                complete,
                size,
            }) => {
                ended += 1;
                let (secs, got) = match files.remove(&id) {
                    Some((f, t0, got)) => {
                        if let Some(f) = f {
                            f.sync_all()
                                .map_err(|e| Error::Refused(format!("syncing {id:016x}: {e}")))?;
                        }
                        (t0.elapsed().as_secs_f64(), got)
                    }
                    None => (0.0, 0),
                };
                all_ok &= complete && got == size;
                println!(
                    "{{\"role\":\"member\",\"id\":\"{id:016x}\",\"root\":[{},{},{}],\"size\":{size},\"received\":{got},\"complete\":{complete},\"seconds\":{secs:.3},\"peak_rss_kb\":{}}}",
                    root.0,
                    root.1,
                    root.2,
                    peak_rss_kb()
                );
            }
            Some(_) => {}
            None => return Err(Error::Timeout),
        }
    }
    Ok(all_ok)
}

fn coord(s: &str) -> Option<(u16, u16, u16)> {
    let v: Vec<u16> = s.split(',').filter_map(|p| p.trim().parse().ok()).collect();
    (v.len() == 3).then(|| (v[0], v[1], v[2]))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: multicast send SOCKET SERVICE FILE [x,y,z ...] | \
                 multicast receive SOCKET SERVICE OUTDIR [COUNT]";
    let r = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["send", socket, service, file, group @ ..] => {
            let g: Option<Vec<_>> = group.iter().map(|s| coord(s)).collect();
            match g {
                Some(g) => send(socket, service, file, &g),
                None => Err(Error::Refused(format!("members are x,y,z: {group:?}"))),
            }
        }
        ["receive", socket, service, dir, rest @ ..] => {
            let count = rest.first().and_then(|s| s.parse().ok()).unwrap_or(1);
            receive(socket, service, dir, count)
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    match r {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("multicast: {e}");
            std::process::exit(1);
        }
    }
}

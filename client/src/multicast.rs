//! Multicast from and to applications: an application multicasts bytes of its pool to a
//! group of servers, where the applications hosting the named service receive them in order
//! ([`Event::MulticastData`], then [`Event::MulticastEnd`]); the sender gets the root's
//! report, member by member ([`Event::MulticastReport`]). torusd's multicast service moves
//! the bytes over one spanning tree per link direction with bounded memory on every server.

use crate::*;

/// How a multicast is cut and how long it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MulticastOptions {
    /// Bytes per chunk (1 KiB .. 1 MiB; 0: torusd's default, 256 KiB).
    pub chunk: u32,
    /// The transfer ends by then, complete or not (whole seconds, at least one).
    pub timeout: Duration,
}

impl Default for MulticastOptions {
    fn default() -> MulticastOptions {
        MulticastOptions {
            chunk: 0,
            timeout: Duration::from_secs(600),
        }
    }
}

/// How a multicast ended, member by member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MulticastReport {
    /// The sender's name for it ([`Client::multicast`]'s return).
    pub tag: u64,
    /// Every member has every byte (checksums equal to the root's).
    pub ok: bool,
    /// Members that have every byte.
    pub completed: Vec<Coord>,
    /// Members that have not, and why (refused: no application there hosts the service;
    /// lost: unreachable; incomplete: the deadline passed; a checksum that differs).
    pub failed: Vec<(Coord, String)>,
    /// What went wrong with the transfer as a whole, if anything did.
    pub error: Option<String>,
    /// The root's whole report (JSON): per-member times and rates, the trees.
    pub json: String,
}

impl MulticastReport {
    /// Reads the root's JSON report.
    pub(crate) fn parse(tag: u64, data: &[u8]) -> MulticastReport {
        let json = String::from_utf8_lossy(data).into_owned();
        let v: Value = serde_json::from_str(&json).unwrap_or(Value::Null);
        let mut completed = Vec::new();
        let mut failed = Vec::new();
        for m in v["per_member"].as_array().into_iter().flatten() {
            let Some(c) = m["member"].as_str().and_then(parse_coord) else {
                continue;
            };
            match m["outcome"].as_str() {
                Some("complete") if m["checksum_ok"] == json!(true) => completed.push(c),
                Some("complete") => failed.push((c, "checksum differs".to_string())),
                Some(o) => {
                    let why = m["reason"].as_str().unwrap_or(o);
                    failed.push((c, format!("{o}: {why}")));
                }
                None => failed.push((c, "no outcome".to_string())),
            }
        }
        let error = match v.get("error").and_then(Value::as_str) {
            Some(e) => Some(e.to_string()),
            None if v.is_null() => Some("torusd's report could not be read".to_string()),
            None => None,
        };
        MulticastReport {
            tag,
            ok: error.is_none() && failed.is_empty(),
            completed,
            failed,
            error,
            json,
        }
    }
}

fn parse_coord(s: &str) -> Option<Coord> {
    let mut it = s.split(',').map(|p| p.trim().parse::<u16>().ok());
    let c = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(c)
}

impl Client {
    /// Multicasts `len` bytes of registered region `r` from `offset` to the applications
    /// hosting service `service` on the servers of `group` (empty: every other server).
    /// Returns the transfer's tag; its end comes as [`Event::MulticastReport`] with that
    /// tag, and until then the bytes must stay as they are (torusd reads them for as long
    /// as the transfer lasts, to repair what a member lacks). A member server where no
    /// application hosts the service refuses, and the report says so.
    pub fn multicast(
        &self,
        group: &[Coord],
        service: &str,
        r: &LocalRegion,
        offset: u64,
        len: u64,
        opts: MulticastOptions,
    ) -> Result<u64, Error> {
        let fits = offset.checked_add(len).is_some_and(|end| end <= r.len);
        if !fits || len == 0 {
            return Err(Error::Refused(format!(
                "multicast: {len} bytes at {offset} are not inside the region ({} bytes)",
                r.len
            )));
        }
        if group.len() > 1 << 16 {
            return Err(Error::Refused("multicast: more than 65536 members".into()));
        }
        if opts.chunk != 0 && !(1024..=1 << 20).contains(&opts.chunk) {
            return Err(Error::Refused(format!(
                "multicast: a chunk of {} bytes (1 KiB .. 1 MiB, or 0)",
                opts.chunk
            )));
        }
        let tag = self.next_tag(None);
        let mut members = Vec::with_capacity(group.len() * 8);
        for c in group {
            members.extend_from_slice(&pack_coord(c.0, c.1, c.2).to_le_bytes());
        }
        let e = Sqe {
            op: op::MULTICAST,
            service: channel::service_id(service),
            tag,
            aux: r.pool_offset + offset,
            aux2: len,
            buf_id: opts.chunk,
            total_len: opts.timeout.as_secs().clamp(1, u64::from(u32::MAX)) as u32,
            ..Sqe::default()
        };
        self.submit_entry(e, &members)?;
        Ok(tag)
    }
}

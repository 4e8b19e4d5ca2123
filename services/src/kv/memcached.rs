//! The memcached text protocol, sans-IO: bytes from a client become [`Request`]s, and
//! answers are formatted here. The gateway (a TCP listener in torusd) only moves bytes.
//!
//! Covered: get, gets, gat, gats, set, add, replace, append, prepend, cas, delete, incr,
//! decr, touch, flush_all, stats, version, verbosity, quit, and the meta commands mg, ms, md,
//! ma, mn (flags below). Bad input gets memcached's answers (`ERROR`, `CLIENT_ERROR ...`),
//! never a closed connection, and never a panic: a data block that is not followed by `\r\n`
//! is refused (`CLIENT_ERROR bad data chunk`) and skipped.
//!
//! Meta flags: mg `v c f k s t q O T`; ms `T F C M(E A P R S) q c k O I`; md `C q k O I`;
//! ma `N J D T M(I + D -) q v c t k O`. Base64 keys (`b`) are refused.

/// Longest key.
pub const MAX_KEY: usize = 250;
/// Longest command line (keys of a multi-get included).
pub const MAX_LINE: usize = 64 * 1024;

/// A storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreCmd {
    /// set
    Set,
    /// add
    Add,
    /// replace
    Replace,
    /// append
    Append,
    /// prepend
    Prepend,
    /// cas
    Cas,
}

/// What a meta command asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// Return the value.
    pub value: bool,
    /// Return the cas token.
    pub cas: bool,
    /// Return the client flags.
    pub flags: bool,
    /// Return the key.
    pub key: bool,
    /// Return the size.
    pub size: bool,
    /// Return the remaining lifetime.
    pub ttl: bool,
    /// Quiet: no answer on the common case.
    pub quiet: bool,
    /// Opaque token to echo.
    pub opaque: Option<String>,
    /// A new lifetime (T).
    pub set_ttl: Option<i64>,
    /// Client flags to store (F).
    pub set_flags: Option<u32>,
    /// Compare with this cas (C).
    pub compare: Option<u64>,
    /// Mode character (M).
    pub mode: Option<u8>,
    /// Auto-create with this lifetime (N).
    pub vivify: Option<i64>,
    /// Initial value (J).
    pub initial: Option<u64>,
    /// Delta (D).
    pub delta: Option<u64>,
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// get / gets (`cas`: return cas tokens).
    Get {
        /// The keys.
        keys: Vec<Vec<u8>>,
        /// gets.
        cas: bool,
    },
    /// gat / gats.
    Gat {
        /// New exptime.
        exptime: i64,
        /// The keys.
        keys: Vec<Vec<u8>>,
        /// gats.
        cas: bool,
    },
    /// set, add, replace, append, prepend, cas.
    Store {
        /// Which.
        cmd: StoreCmd,
        /// The key.
        key: Vec<u8>,
        /// Client flags.
        flags: u32,
        /// exptime as given.
        exptime: i64,
        /// The data.
        data: Vec<u8>,
        /// cas unique (cas only).
        cas: Option<u64>,
        /// No answer wanted.
        noreply: bool,
    },
    /// delete.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// No answer wanted.
        noreply: bool,
    },
    /// incr / decr.
    Arith {
        /// The key.
        key: Vec<u8>,
        /// incr.
        incr: bool,
        /// By how much.
        delta: u64,
        /// No answer wanted.
        noreply: bool,
    },
    /// touch.
    Touch {
        /// The key.
        key: Vec<u8>,
        /// exptime as given.
        exptime: i64,
        /// No answer wanted.
        noreply: bool,
    },
    /// flush_all.
    FlushAll {
        /// Seconds to wait.
        delay: i64,
        /// No answer wanted.
        noreply: bool,
    },
    /// stats.
    Stats(Option<String>),
    /// version.
    Version,
    /// verbosity.
    Verbosity {
        /// No answer wanted.
        noreply: bool,
    },
    /// quit.
    Quit,
    /// mg.
    MetaGet {
        /// The key.
        key: Vec<u8>,
        /// Its flags.
        meta: Meta,
    },
    /// ms.
    MetaSet {
        /// The key.
        key: Vec<u8>,
        /// The data.
        data: Vec<u8>,
        /// Its flags.
        meta: Meta,
    },
    /// md.
    MetaDelete {
        /// The key.
        key: Vec<u8>,
        /// Its flags.
        meta: Meta,
    },
    /// ma.
    MetaArith {
        /// The key.
        key: Vec<u8>,
        /// Its flags.
        meta: Meta,
    },
    /// mn.
    MetaNoop,
    /// A request refused as it was read: the answer to send (`ERROR\r\n`, `CLIENT_ERROR
    /// ...\r\n`, `SERVER_ERROR ...\r\n`).
    Refused(String),
}

/// An incremental parser for one connection.
#[derive(Debug)]
pub struct Parser {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already parsed (dropped at the next feed: dropping them
    /// per request would move the rest of a pipelined batch every time).
    start: usize,
    /// Bytes after `start` known to hold no line end: a line arriving a byte at a time is
    /// searched once, not once per byte (which a slow client could make quadratic).
    scanned: usize,
    /// Bytes the request at the front needs before it is worth parsing again (a storage
    /// command waiting for its data block: not re-read for every byte of it that comes).
    need: usize,
    /// Bytes of a refused data block still to skip.
    skip: usize,
    max_item: usize,
}

/// A key as memcached takes it: 1..=250 bytes, any but the separators (memcached's own
/// load generator, memaslap, puts control bytes in its keys).
fn valid_key(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= MAX_KEY && !k.iter().any(|b| matches!(b, b' ' | b'\r' | b'\n' | 0))
}

/// A command line as text without losing a byte: each byte is one char (Latin-1), so keys
/// of any bytes survive tokenizing; [`raw`] turns a token back into its bytes.
fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

/// The bytes of a token of a [`latin1`] line.
fn raw(t: &str) -> Vec<u8> {
    t.chars().map(|c| c as u32 as u8).collect()
}

/// The request of a command that is its line alone (no data block follows): `t` its
/// tokens, `cmd` the first; an answer to send back as it is for a line memcached refuses.
fn line_request(cmd: &str, t: &[&str], noreply: bool) -> Request {
    match cmd {
        "get" | "gets" => {
            let keys: Vec<Vec<u8>> = t[1..].iter().map(|k| raw(k)).collect();
            if keys.is_empty() {
                return Request::Refused("ERROR\r\n".into());
            }
            if !keys.iter().all(|k| valid_key(k)) {
                return client_error("bad command line format");
            }
            Request::Get {
                keys,
                cas: cmd == "gets",
            }
        }
        "gat" | "gats" => {
            let (Some(exptime), true) = (num::<i64>(t.get(1)), t.len() > 2) else {
                return Request::Refused("ERROR\r\n".into());
            };
            let keys: Vec<Vec<u8>> = t[2..].iter().map(|k| raw(k)).collect();
            if !keys.iter().all(|k| valid_key(k)) {
                return client_error("bad command line format");
            }
            Request::Gat {
                exptime,
                keys,
                cas: cmd == "gats",
            }
        }
        "delete" => match t.get(1) {
            Some(k) if valid_key(&raw(k)) && (t.len() == 2 || (t.len() == 3 && noreply)) => {
                Request::Delete {
                    key: raw(k),
                    noreply,
                }
            }
            // memcached once took a time argument here; refuse it clearly.
            Some(_) => client_error("bad command line format.  Usage: delete <key> [noreply]"),
            None => Request::Refused("ERROR\r\n".into()),
        },
        "incr" | "decr" => {
            let (Some(k), Some(d)) = (t.get(1), t.get(2)) else {
                return Request::Refused("ERROR\r\n".into());
            };
            if !valid_key(&raw(k)) {
                return client_error("bad command line format");
            }
            match d.parse::<u64>() {
                Ok(delta) => Request::Arith {
                    key: raw(k),
                    incr: cmd == "incr",
                    delta,
                    noreply,
                },
                Err(_) => client_error("invalid numeric delta argument"),
            }
        }
        "touch" => {
            let (Some(k), Some(e)) = (t.get(1), num::<i64>(t.get(2))) else {
                return Request::Refused("ERROR\r\n".into());
            };
            if !valid_key(&raw(k)) {
                return client_error("bad command line format");
            }
            Request::Touch {
                key: raw(k),
                exptime: e,
                noreply,
            }
        }
        "flush_all" => {
            let delay = match t.get(1) {
                Some(&"noreply") | None => 0,
                Some(d) => match d.parse::<i64>() {
                    Ok(d) => d,
                    Err(_) => return client_error("bad command line format"),
                },
            };
            Request::FlushAll { delay, noreply }
        }
        // stats takes no noreply: memcached answers it with an error.
        "stats" if noreply => Request::Refused("ERROR\r\n".into()),
        "stats" => Request::Stats(t.get(1).map(|s| s.to_string())),
        // As memcached: arguments are ignored.
        "version" => Request::Version,
        // As memcached: one or two arguments (the level is not checked; `noreply`
        // silences it), anything else is an error.
        "verbosity" if (2..=3).contains(&t.len()) => Request::Verbosity { noreply },
        "verbosity" => Request::Refused("ERROR\r\n".into()),
        "quit" => Request::Quit,
        "mn" => Request::MetaNoop,
        "mg" | "md" | "ma" => {
            let Some(k) = t.get(1) else {
                return client_error("bad command line format");
            };
            if !valid_key(&raw(k)) {
                return client_error("bad command line format");
            }
            let meta = match parse_meta(&t[2..]) {
                Ok(m) => m,
                Err(e) => return client_error(&e),
            };
            let key = raw(k);
            match cmd {
                "mg" => Request::MetaGet { key, meta },
                "md" => Request::MetaDelete { key, meta },
                _ => Request::MetaArith { key, meta },
            }
        }
        _ => Request::Refused("ERROR\r\n".into()),
    }
}

fn client_error(msg: &str) -> Request {
    Request::Refused(format!("CLIENT_ERROR {msg}\r\n"))
}

fn num<T: std::str::FromStr>(t: Option<&&str>) -> Option<T> {
    t.and_then(|s| s.parse().ok())
}

impl Parser {
    /// A parser accepting values of at most `max_item` bytes.
    pub fn new(max_item: usize) -> Parser {
        Parser {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            need: 0,
            skip: 0,
            max_item,
        }
    }

    /// Adds bytes read from the client.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let n = self.skip.min(bytes.len());
        self.skip -= n;
        self.buf.extend_from_slice(&bytes[n..]);
    }

    /// Bytes waiting for more input.
    pub fn pending(&self) -> usize {
        self.data().len()
    }

    /// The bytes not parsed yet.
    fn data(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The next complete request, if one is in.
    pub fn next_request(&mut self) -> Option<Request> {
        if self.data().len() < self.need {
            return None;
        }
        // As memcached: a line ends at \n, a \r before it is dropped.
        let from = self.scanned;
        let Some(at) = self.data()[from..].iter().position(|b| *b == b'\n') else {
            self.scanned = self.data().len();
            if self.scanned > MAX_LINE {
                self.buf.clear();
                self.start = 0;
                self.scanned = 0;
                self.need = 0;
                return Some(client_error("line too long"));
            }
            return None;
        };
        let nl = from + at;
        // Found again at once if the request must wait for its data block.
        self.scanned = nl;
        let d = self.data();
        let end = if nl > 0 && d[nl - 1] == b'\r' {
            nl - 1
        } else {
            nl
        };
        let line = latin1(&d[..end]);
        self.line(line, nl + 1)
    }

    fn consume(&mut self, n: usize) {
        self.start += n.min(self.data().len());
        self.scanned = 0;
        self.need = 0;
    }

    /// Handles a command line of `used` bytes (terminator included).
    fn line(&mut self, line: String, used: usize) -> Option<Request> {
        // memcached separates tokens by spaces only.
        let t: Vec<&str> = line.split(' ').filter(|t| !t.is_empty()).collect();
        let Some(&cmd) = t.first() else {
            self.consume(used);
            return Some(Request::Refused("ERROR\r\n".into()));
        };
        let noreply = t.last() == Some(&"noreply");
        let storage = match cmd {
            "set" => Some(StoreCmd::Set),
            "add" => Some(StoreCmd::Add),
            "replace" => Some(StoreCmd::Replace),
            "append" => Some(StoreCmd::Append),
            "prepend" => Some(StoreCmd::Prepend),
            "cas" => Some(StoreCmd::Cas),
            _ => None,
        };
        if let Some(sc) = storage {
            return self.storage(sc, &t, used, noreply);
        }
        if cmd == "ms" {
            return self.meta_set(&t, used);
        }
        self.consume(used);
        Some(line_request(cmd, &t, noreply))
    }

    /// A storage command: its data block follows the line.
    fn storage(&mut self, sc: StoreCmd, t: &[&str], used: usize, noreply: bool) -> Option<Request> {
        let want = if sc == StoreCmd::Cas { 6 } else { 5 };
        let fields_ok = t.len() == want || (t.len() == want + 1 && noreply);
        let key = t.get(1).map(|k| raw(k)).unwrap_or_default();
        let flags = num::<u32>(t.get(2));
        let exptime = num::<i64>(t.get(3));
        let bytes = num::<i64>(t.get(4));
        let cas = if sc == StoreCmd::Cas {
            num::<u64>(t.get(5))
        } else {
            Some(0)
        };
        let (true, Some(flags), Some(exptime), Some(bytes), Some(cas)) =
            (fields_ok && valid_key(&key), flags, exptime, bytes, cas)
        else {
            self.consume(used);
            return Some(client_error("bad command line format"));
        };
        if bytes < 0 {
            self.consume(used);
            return Some(client_error("bad data chunk"));
        }
        let n = bytes as usize;
        if n > self.max_item {
            // Swallow the data block (and its terminator) without buffering it.
            self.consume(used);
            self.swallow(n + 2);
            return Some(Request::Refused(
                "SERVER_ERROR object too large for cache\r\n".into(),
            ));
        }
        let d = self.data();
        if d.len() < used + n + 2 {
            self.need = used + n + 2;
            return None;
        }
        let data = d[used..used + n].to_vec();
        let ok = &d[used + n..used + n + 2] == b"\r\n";
        self.consume(used + n + 2);
        if !ok {
            return Some(client_error("bad data chunk"));
        }
        Some(Request::Store {
            cmd: sc,
            key,
            flags,
            exptime,
            data,
            cas: (sc == StoreCmd::Cas).then_some(cas),
            noreply,
        })
    }

    /// Drops the next `n` bytes, those buffered now and those still to come.
    fn swallow(&mut self, n: usize) {
        let have = self.data().len().min(n);
        self.consume(have);
        self.skip = n - have;
    }

    fn meta_set(&mut self, t: &[&str], used: usize) -> Option<Request> {
        let key = t.get(1).map(|k| raw(k)).unwrap_or_default();
        let (true, Some(n)) = (valid_key(&key), num::<usize>(t.get(2))) else {
            self.consume(used);
            return Some(client_error("bad command line format"));
        };
        let meta = match parse_meta(t.get(3..).unwrap_or(&[])) {
            Ok(m) => m,
            Err(e) => {
                // The length is known: its data block is skipped, not read as commands.
                self.consume(used);
                self.swallow(n + 2);
                return Some(client_error(&e));
            }
        };
        if n > self.max_item {
            self.consume(used);
            self.swallow(n + 2);
            return Some(Request::Refused(
                "SERVER_ERROR object too large for cache\r\n".into(),
            ));
        }
        let d = self.data();
        if d.len() < used + n + 2 {
            self.need = used + n + 2;
            return None;
        }
        let data = d[used..used + n].to_vec();
        let ok = &d[used + n..used + n + 2] == b"\r\n";
        self.consume(used + n + 2);
        if !ok {
            return Some(client_error("bad data chunk"));
        }
        Some(Request::MetaSet { key, data, meta })
    }
}

fn parse_meta(tokens: &[&str]) -> Result<Meta, String> {
    let mut m = Meta::default();
    for tok in tokens {
        // A flag is one ASCII letter; anything else (a multi-byte character) is refused
        // before it is split.
        let Some(first) = tok.chars().next().filter(char::is_ascii_alphabetic) else {
            return Err(format!("invalid flag {tok}"));
        };
        let (f, arg) = tok.split_at(first.len_utf8());
        let n = |what: &str| -> Result<u64, String> {
            arg.parse::<u64>()
                .map_err(|_| format!("bad token in command line format: {what}"))
        };
        let i = |what: &str| -> Result<i64, String> {
            arg.parse::<i64>()
                .map_err(|_| format!("bad token in command line format: {what}"))
        };
        match f {
            "v" => m.value = true,
            "c" => m.cas = true,
            "f" => m.flags = true,
            "k" => m.key = true,
            "s" => m.size = true,
            "t" => m.ttl = true,
            "q" => m.quiet = true,
            "O" => m.opaque = Some(arg.to_string()),
            "T" => m.set_ttl = Some(i("T")?),
            "F" => {
                m.set_flags = Some(u32::try_from(n("F")?).map_err(|_| "bad token: F".to_string())?)
            }
            "C" => m.compare = Some(n("C")?),
            "M" => m.mode = arg.bytes().next(),
            "N" => m.vivify = Some(i("N")?),
            "J" => m.initial = Some(n("J")?),
            "D" => m.delta = Some(n("D")?),
            // Accepted and without effect here: invalidation marks, LRU hints, no-update.
            "I" | "h" | "l" | "u" | "x" | "E" | "R" | "S" => {}
            "b" => return Err("base64 keys are not supported".into()),
            _ => return Err(format!("invalid flag {f}")),
        }
    }
    Ok(m)
}

/// The `VALUE` block of one item for get/gets.
pub fn value_block(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    match cas {
        Some(c) => out.extend_from_slice(format!(" {flags} {} {c}\r\n", data.len()).as_bytes()),
        None => out.extend_from_slice(format!(" {flags} {}\r\n", data.len()).as_bytes()),
    }
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The return flags of a meta answer: what `meta` asked for, from the item's fields.
pub fn meta_flags(meta: &Meta, key: &[u8], flags: u32, size: usize, cas: u64, ttl: i64) -> String {
    let mut s = String::new();
    if meta.cas {
        s += &format!(" c{cas}");
    }
    if meta.flags {
        s += &format!(" f{flags}");
    }
    if meta.key {
        s += &format!(" k{}", String::from_utf8_lossy(key));
    }
    if meta.size {
        s += &format!(" s{size}");
    }
    if meta.ttl {
        s += &format!(" t{ttl}");
    }
    if let Some(o) = &meta.opaque {
        s += &format!(" O{o}");
    }
    s
}

/// The fuzz body of the gateway's parser (`fuzz/`'s `memcached`, and a short run in the
/// tests): the bytes of one client connection, fed whole and in pieces of 1 to 8 bytes (the
/// first byte picks), parse without a panic, every request consumes input, and the bytes
/// held waiting for the rest of a request stay bounded by a line and a value.
pub fn check_untrusted(data: &[u8]) {
    const MAX_ITEM: usize = 1024;
    let piece = 1 + data.first().map_or(0, |b| usize::from(*b) % 8);
    for chunk in [data.len().max(1), piece] {
        let mut p = Parser::new(MAX_ITEM);
        let mut requests = 0usize;
        for c in data.chunks(chunk) {
            p.feed(c);
            while let Some(r) = p.next_request() {
                requests += 1;
                assert!(
                    requests <= data.len() + 1,
                    "a request that consumed nothing"
                );
                if let Request::Store { data: v, .. } = &r {
                    assert!(v.len() <= MAX_ITEM, "a value over the limit accepted");
                }
            }
            assert!(
                p.pending() <= MAX_LINE + MAX_ITEM + 2 + chunk,
                "{} bytes held",
                p.pending()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_fuzz_run() {
        let seeds: Vec<Vec<u8>> = [
            &b"set k 5 0 3\r\nabc\r\nget a b\r\ngets a\r\n"[..],
            b"cas k 0 0 1 99 noreply\r\nx\r\nappend k 0 0 2\r\nyz\r\n",
            b"incr n 5\r\ndecr n 2 noreply\r\ntouch k 10\r\ndelete k\r\n",
            b"mg k v f t c s k O123 q\r\nms k 3 T10 F5 I\r\nabc\r\n",
            b"md k q\r\nma n N0 J13 MI D4\r\nmn\r\nme k\r\n",
            b"stats\r\nstats reset\r\nversion\r\nverbosity 1\r\nflush_all 10\r\nquit\r\n",
            b"get \r\nset k 0 0 99999999\r\nbogus\r\n\r\n",
        ]
        .iter()
        .map(|b| b.to_vec())
        .collect();
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        torusnet_proto::fuzz::write_seeds(&ws, "memcached", &seeds);
        torusnet_proto::fuzz::run(&seeds, 100_000, 24, check_untrusted);
    }

    fn parse_all(input: &[u8]) -> Vec<Request> {
        let mut p = Parser::new(1 << 20);
        p.feed(input);
        std::iter::from_fn(|| p.next_request()).collect()
    }

    #[test]
    fn storage_and_retrieval() {
        let r = parse_all(
            b"set k 5 0 3\r\nabc\r\nget a b\r\ngets a\r\ncas k 0 0 1 99 noreply\r\nx\r\n",
        );
        assert_eq!(
            r[0],
            Request::Store {
                cmd: StoreCmd::Set,
                key: b"k".to_vec(),
                flags: 5,
                exptime: 0,
                data: b"abc".to_vec(),
                cas: None,
                noreply: false
            }
        );
        assert_eq!(
            r[1],
            Request::Get {
                keys: vec![b"a".to_vec(), b"b".to_vec()],
                cas: false
            }
        );
        assert_eq!(
            r[2],
            Request::Get {
                keys: vec![b"a".to_vec()],
                cas: true
            }
        );
        assert!(matches!(
            &r[3],
            Request::Store {
                cmd: StoreCmd::Cas,
                cas: Some(99),
                noreply: true,
                ..
            }
        ));
    }

    #[test]
    fn data_may_arrive_in_pieces() {
        let mut p = Parser::new(1 << 20);
        p.feed(b"set k 0 0 5\r\nhe");
        assert_eq!(p.next_request(), None);
        p.feed(b"llo\r");
        assert_eq!(p.next_request(), None);
        p.feed(b"\n");
        assert!(matches!(p.next_request(), Some(Request::Store { data, .. }) if data == b"hello"));
    }

    #[test]
    fn bad_input_gets_memcached_answers() {
        let r = parse_all(
            b"bogus\r\nset k 0 0 3\r\nabcd\r\nincr k x\r\nget\r\nset k 0 0 -1\r\n\r\n\r\nmg k b\r\n",
        );
        assert_eq!(r[0], Request::Refused("ERROR\r\n".into()));
        assert_eq!(
            r[1],
            Request::Refused("CLIENT_ERROR bad data chunk\r\n".into())
        );
        // The chunk's stray \n ends an empty line, as it does in memcached.
        assert_eq!(r[2], Request::Refused("ERROR\r\n".into()));
        assert!(matches!(&r[3], Request::Refused(s) if s.starts_with("CLIENT_ERROR")));
        assert_eq!(r[4], Request::Refused("ERROR\r\n".into()));
        assert_eq!(
            r[5],
            Request::Refused("CLIENT_ERROR bad data chunk\r\n".into())
        );
        assert!(r
            .iter()
            .any(|x| matches!(x, Request::Refused(s) if s.contains("base64"))));
        let long_key = format!("get {}\r\n", "k".repeat(251));
        assert!(
            matches!(&parse_all(long_key.as_bytes())[0], Request::Refused(s) if s.starts_with("CLIENT_ERROR"))
        );
    }

    #[test]
    fn oversized_values_are_refused_and_skipped() {
        let mut p = Parser::new(4);
        p.feed(b"set k 0 0 10\r\n0123");
        assert!(
            matches!(p.next_request(), Some(Request::Refused(s)) if s.starts_with("SERVER_ERROR"))
        );
        p.feed(b"456789\r\nget k\r\n");
        assert_eq!(
            p.next_request(),
            Some(Request::Get {
                keys: vec![b"k".to_vec()],
                cas: false
            })
        );
    }

    #[test]
    fn meta_commands() {
        let r = parse_all(
            b"mg k v c t O123\r\nms k 2 T10 F3 MA\r\nhi\r\nmd k q\r\nma k D5 MD N0 J7\r\nmn\r\n",
        );
        assert!(
            matches!(&r[0], Request::MetaGet { meta, .. } if meta.value && meta.cas && meta.ttl && meta.opaque.as_deref() == Some("123"))
        );
        assert!(
            matches!(&r[1], Request::MetaSet { data, meta, .. } if data == b"hi" && meta.set_ttl == Some(10) && meta.set_flags == Some(3) && meta.mode == Some(b'A'))
        );
        assert!(matches!(&r[2], Request::MetaDelete { meta, .. } if meta.quiet));
        assert!(
            matches!(&r[3], Request::MetaArith { meta, .. } if meta.delta == Some(5) && meta.mode == Some(b'D') && meta.initial == Some(7))
        );
        assert_eq!(r[4], Request::MetaNoop);
    }

    #[test]
    fn hostile_bytes_never_panic() {
        let mut rng = torusnet_proto::rng::SplitMix64::new(3);
        for _ in 0..20_000 {
            let n = rng.below(200) as usize;
            let mut b = vec![0u8; n];
            rng.fill(&mut b);
            // Sprinkle real command words and terminators to reach deeper states.
            if n > 10 {
                let words: [&[u8]; 6] = [b"set ", b"get ", b"ms ", b"\r\n", b"cas ", b"mg "];
                let w = words[rng.below(6) as usize];
                b[..w.len()].copy_from_slice(w);
            }
            let mut p = Parser::new(1 << 10);
            p.feed(&b);
            while p.next_request().is_some() {}
        }
    }

    #[test]
    fn verbosity_and_stats_take_only_their_arguments() {
        let err = Request::Refused("ERROR\r\n".into());
        assert_eq!(parse_all(b"verbosity foo bar my\r\n"), vec![err.clone()]);
        assert_eq!(
            parse_all(b"verbosity noreply\r\n"),
            vec![Request::Verbosity { noreply: true }]
        );
        assert_eq!(parse_all(b"verbosity\r\n"), vec![err.clone()]);
        assert_eq!(
            parse_all(b"verbosity 1\r\nverbosity 0 noreply\r\n"),
            vec![
                Request::Verbosity { noreply: false },
                Request::Verbosity { noreply: true }
            ]
        );
        assert_eq!(parse_all(b"version foo bar\r\n"), vec![Request::Version]);
        assert_eq!(parse_all(b"stats noreply\r\n"), vec![err]);
        assert_eq!(parse_all(b"stats\r\n"), vec![Request::Stats(None)]);
    }

    #[test]
    fn a_meta_set_with_bad_flags_skips_its_data() {
        let r = parse_all(b"ms k 3 Z9\r\nabc\r\nmn\r\n");
        assert!(matches!(&r[0], Request::Refused(e) if e.starts_with("CLIENT_ERROR")));
        assert_eq!(r[1..], [Request::MetaNoop]);
    }

    #[test]
    fn keys_keep_every_byte_memcached_keeps() {
        let mut line =
            b"set \x10\x10\xffk\xe9 0 0 1\r\nv\r\nget a\x01 \x10\x10\xffk\xe9\r\n".to_vec();
        let r = parse_all(&line);
        assert!(matches!(&r[0], Request::Store { key, .. } if key == b"\x10\x10\xffk\xe9"));
        assert_eq!(
            r[1],
            Request::Get {
                keys: vec![b"a\x01".to_vec(), b"\x10\x10\xffk\xe9".to_vec()],
                cas: false
            }
        );
        line = b"get a\x00b\r\n".to_vec();
        assert!(
            matches!(&parse_all(&line)[0], Request::Refused(e) if e.starts_with("CLIENT_ERROR"))
        );
    }
}

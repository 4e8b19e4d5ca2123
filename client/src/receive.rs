//! Completion: events read from the completion queue and the RX data ring, waits with
//! deadlines, messages arriving in segments, replies set aside for their calls.

use crate::*;

/// Receive-side state (the CQ and the RX data ring).
#[derive(Debug, Default)]
pub(crate) struct Rx {
    /// Events read but not yet returned (while `call` waited for its reply).
    pub(crate) pending: VecDeque<Event>,
    /// RPC replies waiting for their `call`.
    pub(crate) replies: HashMap<u64, Vec<u8>>,
    /// A message arriving in segments.
    partial: Option<(Cqe, Vec<u8>)>,
    /// Capabilities torusd answered with, by request tag.
    pub(crate) caps: HashMap<u64, Result<rmem::Capability, rmem::Status>>,
}

impl Client {
    /// The next event: at once ([`Wait::NoWait`]), within a time, or whenever it comes.
    pub fn recv(&self, wait: Wait) -> Result<Option<Event>, Error> {
        let deadline = match wait {
            Wait::NoWait => Some(Instant::now()),
            Wait::Timeout(d) => Some(Instant::now() + d),
            Wait::Forever => None,
        };
        loop {
            // This application's long sends end by their deadlines even when nothing
            // arrives: the wait is cut short for the next one.
            let mut due = None;
            if self.has_offers() {
                let (expired, next) = self.expired_offer();
                if expired.is_some() {
                    return Ok(expired);
                }
                due = next;
            }
            if let Some(e) = self.poll_event()? {
                if self.settle_offer(&e) {
                    return Ok(Some(e));
                }
                continue;
            }
            let until = match (deadline, due) {
                (Some(d), Some(o)) => Some(d.min(o)),
                (d, o) => d.or(o),
            };
            if !self.wait_cq(until)? && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// Waits until the CQ has an entry (true) or `deadline` passes (false): spins for a
    /// while, then sleeps on the eventfd after telling torusd to signal it.
    pub(crate) fn wait_cq(&self, deadline: Option<Instant>) -> Result<bool, Error> {
        let r = &self.region;
        let ready = || {
            r.u32(off::CQ_HEAD).load(Ordering::Acquire)
                != r.u32(off::CQ_TAIL).load(Ordering::Acquire)
        };
        let start = Instant::now();
        loop {
            if ready() {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            if now.duration_since(start) < self.spin {
                std::hint::spin_loop();
                continue;
            }
            // Announce the sleep, look once more (torusd may have produced meanwhile), wait.
            r.u32(off::APP_WAITING).store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !ready() {
                let ms = match deadline {
                    Some(d) => (d.saturating_duration_since(now).as_millis() as i32).clamp(1, 1000),
                    None => 1000,
                };
                sys::wait_readable(self.app_efd.as_raw_fd(), ms);
                sys::drain(self.app_efd.as_raw_fd());
            }
            r.u32(off::APP_WAITING).store(0, Ordering::SeqCst);
            if self.closed() {
                return Err(Error::Closed);
            }
        }
    }

    /// Whether torusd closed the attach socket (it went away, or detached us).
    pub(crate) fn closed(&self) -> bool {
        let s = self.sock.lock();
        let mut b = [0u8; 1];
        // SAFETY: peeking one byte without blocking on our socket.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }

    /// Takes one event if one is ready: queued ones first, then the CQ.
    pub(crate) fn poll_event(&self) -> Result<Option<Event>, Error> {
        let mut rx = self.rx.lock();
        if let Some(e) = rx.pending.pop_front() {
            return Ok(Some(e));
        }
        loop {
            let Some(e) = self.read_cq(&mut rx) else {
                return Ok(None);
            };
            match e {
                Parsed::Event(e) => return Ok(Some(e)),
                Parsed::Reply(call, data) => {
                    rx.replies.insert(call, data);
                }
                Parsed::Nothing => {}
            }
        }
    }

    /// Reads one CQ entry (and its bytes), if any.
    pub(crate) fn read_cq(&self, rx: &mut Rx) -> Option<Parsed> {
        let r = &self.region;
        let head = r.u32(off::CQ_HEAD).load(Ordering::Relaxed);
        let tail = r.u32(off::CQ_TAIL).load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let e = r.read_cqe(head);
        let (_, rxd_size) = r.rxd();
        let mut data = Vec::new();
        if e.data_len > 0 {
            data.resize(e.data_len as usize, 0);
            r.copy_out(r.rxd(), e.data_pos % rxd_size, &mut data);
            r.u64(off::RXD_HEAD)
                .store(e.data_pos + u64::from(e.data_len), Ordering::Release);
        }
        r.u32(off::CQ_HEAD)
            .store(head.wrapping_add(1), Ordering::Release);
        Some(self.parse(rx, e, data))
    }

    pub(crate) fn parse(&self, rx: &mut Rx, e: Cqe, data: Vec<u8>) -> Parsed {
        let peer = unpack_coord(e.peer);
        let from = Address {
            server: peer,
            service: e.src_service,
        };
        match e.kind {
            cq::MESSAGE => self.message(rx, e, data, from),
            cq::ACKED => Parsed::Event(Event::Acked {
                peer,
                count: e.count,
                last_tag: e.tag,
            }),
            cq::FAILED => {
                let reason = FailReason::from_code(e.reason);
                if reason.service_gone() {
                    self.forget_server(peer);
                }
                Parsed::Event(Event::Failed {
                    peer,
                    tag: e.tag,
                    reason,
                })
            }
            cq::PEER_RESET => {
                self.forget_server(peer);
                Parsed::Event(Event::PeerReset {
                    peer,
                    reason: FailReason::from_code(e.reason),
                })
            }
            cq::UNREACHABLE => {
                self.forget_server(peer);
                Parsed::Event(Event::Unreachable(peer))
            }
            cq::REACHABLE => Parsed::Event(Event::Reachable(peer)),
            cq::BUFFER_FILLED => {
                let id = e.tag as u32;
                if let Some(b) = self.pool.lock().buffers.get_mut(&id) {
                    b.2 = true;
                }
                Parsed::Event(Event::BufferFilled {
                    buffer: id,
                    len: e.total_len as usize,
                    from,
                })
            }
            cq::BUFFER_MISSED => Parsed::Event(Event::BufferMissed { peer, tag: e.tag }),
            cq::OVERFLOW => Parsed::Event(Event::Overflow { dropped: e.count }),
            cq::INTERCEPTED => Parsed::Event(Event::Intercepted {
                id: e.tag,
                from,
                key: (e.flags & cflag::KEYED != 0).then_some(e.count),
                data,
            }),
            cq::MCAST_DATA => Parsed::Event(Event::MulticastData {
                id: e.tag,
                root: peer,
                to: e.dst_service,
                offset: e.extra,
                size: e.extra2,
                data,
            }),
            cq::MCAST_END => Parsed::Event(Event::MulticastEnd {
                id: e.tag,
                root: peer,
                complete: e.reason == 0,
                size: e.extra2,
            }),
            cq::MCAST_REPORT => {
                Parsed::Event(Event::MulticastReport(MulticastReport::parse(e.tag, &data)))
            }
            rmem::cq::RM_DONE => Parsed::Event(Event::RemoteDone {
                op: e.tag,
                status: rmem::Status::from_code(e.reason),
                bytes: e.count,
            }),
            rmem::cq::RM_CAP => {
                let r = match rmem::Capability::decode(&data) {
                    Some(c) if e.reason == 0 => Ok(c),
                    _ => Err(rmem::Status::from_code(e.reason.max(9))),
                };
                rx.caps.insert(e.tag, r);
                Parsed::Nothing
            }
            rmem::cq::RM_TRIPWIRE => Parsed::Event(Event::Tripwire {
                id: e.tag,
                region: e.extra as u32,
                offset: e.count,
                len: u64::from(e.total_len),
                from: peer,
            }),
            rmem::cq::RM_WRITTEN => Parsed::Event(Event::Written {
                region: e.extra as u32,
                offset: e.count,
                len: u64::from(e.total_len),
                from: peer,
            }),
            _ => Parsed::Nothing,
        }
    }

    /// A message entry (or one segment of a message): the message once whole.
    fn message(&self, rx: &mut Rx, e: Cqe, data: Vec<u8>, from: Address) -> Parsed {
        // Segments of one message arrive back to back.
        let (first, mut whole) = match rx.partial.take() {
            Some((f, mut buf)) => {
                buf.extend_from_slice(&data);
                (f, buf)
            }
            None => (e, data),
        };
        if e.flags & cflag::MORE != 0 {
            rx.partial = Some((first, whole));
            return Parsed::Nothing;
        }
        let reliable = first.flags & cflag::RELIABLE != 0;
        // 0 from a torusd that predates added names: the attach name.
        let to = match first.dst_service {
            0 => self.service,
            s => s,
        };
        let key = (first.flags & cflag::KEYED != 0).then_some(first.count);
        match first.app_kind {
            kind::RPC_REQUEST | kind::RPC_REPLY if whole.len() >= 8 => {
                let mut c = [0u8; 8];
                c.copy_from_slice(&whole[..8]);
                let call = u64::from_le_bytes(c);
                whole.drain(..8);
                if first.app_kind == kind::RPC_REQUEST {
                    Parsed::Event(Event::Request {
                        from,
                        call,
                        data: whole,
                        to,
                    })
                } else {
                    Parsed::Reply(call, whole)
                }
            }
            k @ (kind::LONG_OFFER | kind::LONG_DONE) => {
                match crate::long::parse(k, from, &whole) {
                    Some(m) => Parsed::Event(crate::long::event(from, m)),
                    // Malformed: handed over as it came, not dropped unseen.
                    None => Parsed::Event(Event::Message {
                        from,
                        data: whole,
                        reliable,
                        key,
                        to,
                    }),
                }
            }
            _ => Parsed::Event(Event::Message {
                from,
                data: whole,
                reliable,
                key,
                to,
            }),
        }
    }

    /// Reads what the CQ holds into the stash until `f` finds what it waits for, or the
    /// deadline passes.
    pub(crate) fn wait_until<T>(
        &self,
        deadline: Instant,
        mut f: impl FnMut(&mut Rx) -> Option<T>,
    ) -> Result<T, Error> {
        loop {
            {
                let mut rx = self.rx.lock();
                while let Some(p) = self.read_cq(&mut rx) {
                    match p {
                        Parsed::Event(e) => rx.pending.push_back(e),
                        Parsed::Reply(c, d) => {
                            rx.replies.insert(c, d);
                        }
                        Parsed::Nothing => {}
                    }
                }
                if let Some(t) = f(&mut rx) {
                    return Ok(t);
                }
            }
            if !self.wait_cq(Some(deadline))? {
                return Err(Error::Timeout);
            }
        }
    }

    /// Reads one CQ entry into the stash (to free channel space while sending).
    pub(crate) fn stash_one(&self) -> Result<(), Error> {
        let mut rx = self.rx.lock();
        match self.read_cq(&mut rx) {
            Some(Parsed::Event(e)) => rx.pending.push_back(e),
            Some(Parsed::Reply(c, d)) => {
                rx.replies.insert(c, d);
            }
            Some(Parsed::Nothing) => {}
            None => {
                drop(rx);
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

pub(crate) enum Parsed {
    Event(Event),
    Reply(u64, Vec<u8>),
    Nothing,
}

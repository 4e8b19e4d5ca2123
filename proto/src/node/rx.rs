//! Receiving: a frame judged by its header, then delivered here, passed on or dropped.

use super::*;

/// Why a frame that failed the wire checks is dropped: its source route, or the rest.
pub(super) fn refusal(e: wire::WireError) -> DropReason {
    match e {
        wire::WireError::Route(_) => DropReason::BadRoute,
        _ => DropReason::Malformed,
    }
}

impl Node {
    /// Handles a frame received on link `link` (Ethernet header included). The frame may be
    /// changed in place (TTL, interceptors) before it is forwarded.
    pub fn handle_rx(&mut self, now: Time, link: Dir, frame: &mut [u8]) -> RxAction {
        match self.rx(now, link, frame, false) {
            Received::Action(a) => a,
            // Nothing is lent unless asked for.
            Received::Message(_) => RxAction::Consumed,
        }
    }

    /// As [`Node::handle_rx`], but a message for this server that no event is queued
    /// ahead of comes back borrowed from `frame` ([`Received::Message`]) instead of being
    /// copied into the engine's inbox: the caller hands it on as the next event it would
    /// have polled, then frees the frame. (A simulator of thousands of servers, or a driver
    /// delivering from its receive buffers, saves a copy per message.)
    pub fn handle_rx_lending<'f>(
        &mut self,
        now: Time,
        link: Dir,
        frame: &'f mut [u8],
    ) -> Received<'f> {
        let lend = self.events.is_empty();
        self.rx(now, link, frame, lend)
    }

    pub(super) fn rx<'f>(
        &mut self,
        now: Time,
        link: Dir,
        frame: &'f mut [u8],
        lend: bool,
    ) -> Received<'f> {
        self.last_now = self.last_now.max(now);
        let mut h = match FrameView::new_checked(frame).and_then(|v| Header::parse(&v)) {
            Ok(h) => h,
            Err(e) => return Received::Action(RxAction::Drop(refusal(e))),
        };
        let dest = match self.judge(h.src, h.dst, h.kind) {
            Ok(d) => d,
            Err(why) => return Received::Action(RxAction::Drop(why)),
        };
        let mut frame = frame;
        self.source_used |= h.route_len > 0 || h.kind == Kind::Probe;
        if h.route_len > 0 {
            let len = frame.len();
            match self
                .source
                .on_frame(now, &self.view, Some(link), &h, frame, len)
            {
                Fate::Arrived(at) => {
                    frame = &mut frame[at..];
                    // The header moved over the route: read it again as it now is.
                    h = match FrameView::new_checked(frame).and_then(|v| Header::parse(&v)) {
                        Ok(h) => h,
                        Err(e) => return Received::Action(RxAction::Drop(refusal(e))),
                    };
                }
                fate => return Received::Action(self.routed_on(fate, frame)),
            }
        }
        if h.kind == Kind::Probe {
            if dest == self.local {
                let payload = FrameView::new_checked(frame)
                    .map(|v| v.payload())
                    .unwrap_or(&[]);
                self.source
                    .on_probe_here(now, &self.view, Some(link), &h, payload);
                return Received::Action(RxAction::Consumed);
            }
            return Received::Action(self.pass_on(dest, frame));
        }
        if dest == self.local {
            return self.deliver(now, &h, frame, lend);
        }
        if h.has(flags::INTERCEPT) && !self.resuming {
            match self.run_interceptor(&h, frame) {
                Some(Verdict::Consume) => {
                    return Received::Action(RxAction::Drop(DropReason::Intercepted));
                }
                Some(Verdict::Hold) => {
                    self.held.push(frame.to_vec());
                    return Received::Action(RxAction::Consumed);
                }
                Some(Verdict::Forward) | None => {}
            }
        }
        Received::Action(self.pass_on(dest, frame))
    }

    /// [`Node::handle_rx`] for a holder of only the first bytes of a frame of `frame_len`
    /// bytes, `head` (at least the headers): the simulator keeps the payloads of frames in
    /// flight out of memory. `Some(action)` is what `handle_rx` decides from the headers
    /// alone (passed on, with TTL and hop count updated in `head`, or dropped); `None`
    /// when the payload is needed here (the frame is for this server, or an interceptor
    /// reads it): then call `handle_rx` with the whole frame.
    pub fn handle_rx_head(&mut self, head: &mut [u8], frame_len: usize) -> Option<RxAction> {
        // The route is part of the headers: a holder of fewer bytes cannot judge it.
        let route = usize::from(head.get(wire::offset::ROUTE_LEN).copied().unwrap_or(0));
        if head.len() < frame_len && head.len() < HEADERS_LEN + route {
            return None;
        }
        let p = match wire::Passing::parse_head(head, frame_len) {
            Ok(p) => p,
            Err(e) => return Some(RxAction::Drop(refusal(e))),
        };
        let dest = match self.judge(p.src, p.dst, p.kind) {
            Ok(d) => d,
            Err(why) => return Some(RxAction::Drop(why)),
        };
        if p.route_len > 0 {
            self.source_used = true;
            // The source router reads the whole header (checked already).
            let Ok(h) = Header::parse_head(head, frame_len) else {
                return Some(RxAction::Drop(DropReason::Malformed));
            };
            // A probe needs its link's figures, and an arriving frame its whole bytes.
            if h.kind == Kind::Probe || usize::from(h.route_next) == usize::from(h.route_len) {
                return None;
            }
            let now = self.last_now;
            let fate = self
                .source
                .on_frame(now, &self.view, None, &h, head, frame_len);
            return Some(self.routed_on(fate, head));
        }
        let intercepted = p.has(flags::INTERCEPT)
            && !self.resuming
            && self.interceptors.iter().any(|(s, _)| *s == p.service);
        if dest == self.local || intercepted {
            return None;
        }
        Some(self.pass_on(dest, head))
    }

    /// Where a received frame goes by its header: the server it is for (this one or one
    /// further on), or why it is dropped.
    #[inline]
    pub(super) fn judge(&self, src: Coord, dst: Dest, kind: Kind) -> Result<Coord, DropReason> {
        // Our own key-routed frame may come back when a key's root moved while it travelled;
        // a server-addressed frame from ourselves is bogus.
        let from_self = src == self.local && matches!(dst, Dest::Server(_));
        if !self.dims.contains(src) || from_self {
            return Err(DropReason::BadSource);
        }
        if kind == Kind::Control {
            return Err(DropReason::Malformed);
        }
        match dst {
            Dest::Server(d) if self.dims.contains(d) => Ok(d),
            Dest::Server(_) => Err(DropReason::Malformed),
            Dest::Key(k) => self.routes.key_root(k).ok_or(DropReason::Unreachable),
        }
    }

    /// What a source-routed frame that is not for this server becomes.
    pub(super) fn routed_on(&mut self, fate: Fate, frame: &mut [u8]) -> RxAction {
        match fate {
            Fate::Next(dir) => {
                if !wire::forward_hop(frame) {
                    return RxAction::Drop(DropReason::TtlExpired);
                }
                self.stats.forwarded += 1;
                RxAction::Forward(DirSet::EMPTY.with(dir))
            }
            Fate::BadRoute | Fate::Arrived(_) => RxAction::Drop(DropReason::BadRoute),
            Fate::PathFailed => RxAction::Drop(DropReason::PathFailed),
        }
    }

    /// Passes a frame for `dest` on: its next hops, TTL and hop count updated in `frame`.
    #[inline]
    pub(super) fn pass_on(&mut self, dest: Coord, frame: &mut [u8]) -> RxAction {
        let hops = self.routes.next_hops(dest);
        if hops.is_empty() {
            return RxAction::Drop(DropReason::Unreachable);
        }
        if !wire::forward_hop(frame) {
            return RxAction::Drop(DropReason::TtlExpired);
        }
        self.stats.forwarded += 1;
        RxAction::Forward(hops)
    }

    pub(super) fn deliver<'f>(
        &mut self,
        now: Time,
        h: &Header,
        frame: &'f mut [u8],
        lend: bool,
    ) -> Received<'f> {
        if let Dest::Key(k) = h.dst {
            // Key-routed frames carry short messages, delivered to the key's root.
            if h.has(flags::INTERCEPT) {
                let _ = self.run_interceptor(h, frame);
            }
            let Ok(v) = FrameView::new_checked(frame) else {
                return Received::Action(RxAction::Drop(DropReason::Malformed));
            };
            self.stats.key_delivered += 1;
            self.events.push_back(Event::Message {
                src: h.src,
                service: h.service,
                data: v.payload().to_vec(),
                reliable: false,
                key: Some(k),
            });
            return Received::Action(RxAction::Consumed);
        }
        let frame: &'f [u8] = frame;
        let Ok(view) = FrameView::new_checked(frame) else {
            return Received::Action(RxAction::Drop(DropReason::Malformed));
        };
        // Parsed once, here: the transport takes the header as it is.
        Received::Action(match self.transport.handle_parsed(now, h, view, lend) {
            Ok(Some(m)) => return Received::Message(m),
            Ok(None) => RxAction::Consumed,
            Err(RecvError::Wire(_)) => RxAction::Drop(DropReason::Malformed),
            Err(RecvError::FromSelf) => RxAction::Drop(DropReason::BadSource),
            Err(RecvError::Stale) => RxAction::Drop(DropReason::Stale),
            Err(_) => RxAction::Drop(DropReason::Transport),
        })
    }
}

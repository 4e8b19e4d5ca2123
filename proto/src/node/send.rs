//! Sending: messages to servers and to keys, framed by the transport or straight.

use super::*;

impl Node {
    /// Sends a message. Short messages to a key are routed by key at every hop; reliable
    /// ones go to the key's root and follow it if it changes on the way (`keyed`: the
    /// contract).
    pub fn send(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
    ) -> Result<(), SendError> {
        self.send_hinted(now, target, service, data, opts, None)
    }

    /// [`Node::send`], with `run` the value every byte of `data` has if the caller looked
    /// (once for many sends of the same bytes: the simulator's `send_many`): a compacting
    /// send queue ([`transport::Config::compact_runs`]) then does not look again.
    pub(crate) fn send_hinted(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
        run: Option<u8>,
    ) -> Result<(), SendError> {
        let MsgOptions {
            reliable,
            intercept,
            ..
        } = opts;
        let dest = match target {
            Target::Server(c) => c,
            Target::Key(k) if reliable => {
                let now = now.max(self.last_now);
                self.last_now = now;
                let from = opts.from.unwrap_or(service);
                let (keyed, mut p) = self.keyed_parts();
                return keyed.send(&mut p, now, k, service, from, data, opts.fences, opts.tag);
            }
            Target::Key(k) => {
                let max = self.mtu.saturating_sub(wire::TORUS_LEN);
                if data.len() > max {
                    return Err(SendError::TooLarge {
                        len: data.len(),
                        max,
                    });
                }
                if self.key_out.len() >= 4096 {
                    return Err(SendError::WouldBlock);
                }
                self.key_out.push_back(KeyMsg {
                    key: k,
                    service,
                    data: data.to_vec(),
                    intercept,
                });
                return Ok(());
            }
        };
        if dest == self.local {
            // No transport sees a message to this server, so none would refuse it and tell
            // its sender: the send does.
            if let Some(why) = reliable.then(|| self.transport.refusal(service)).flatten() {
                return Err(SendError::NotTaken(why));
            }
            self.events.push_back(Event::Message {
                src: self.local,
                service,
                data: data.to_vec(),
                reliable,
                key: None,
            });
            return Ok(());
        }
        if !self.routes.is_reachable(dest) {
            return Err(SendError::Unreachable);
        }
        let m = self.outgoing(now, dest, service, data, opts);
        self.transport.send_hinted(now, m, run)
    }

    /// The transport's form of a message to `dest`, noted as sent now (the source router
    /// learns of traffic to `dest` from it).
    #[inline]
    pub(super) fn outgoing<'a>(
        &mut self,
        now: Time,
        dest: Coord,
        service: u16,
        data: &'a [u8],
        opts: MsgOptions,
    ) -> Outgoing<'a> {
        self.last_now = self.last_now.max(now);
        let from = opts.from.unwrap_or(service);
        if self.source_used {
            self.source.touch(now, &self.view, dest, from);
        }
        Outgoing {
            dest,
            service,
            data,
            reliable: opts.reliable,
            fences: opts.fences,
            tag: opts.tag,
            from,
        }
    }

    /// Whether [`Node::send_framing`] may write a message of `len` bytes straight into a
    /// frame (see [`transport::Transport::may_frame_straight`]: a large message, or a small
    /// one when nothing waits); for any other message it is [`Node::send`], and a driver
    /// need not find it a buffer first.
    #[inline]
    pub fn frames_straight(&self, len: usize, reliable: bool) -> bool {
        self.transport.may_frame_straight(len, reliable)
    }

    /// As [`Node::send`], but a reliable message to a server that goes straight into its
    /// frame ([`Node::frames_straight`]) is written into `buf` (`mtu + 14` bytes, or empty
    /// when the driver has no buffer free) when nothing else waits to be sent, on a link in
    /// `room`: the transport's [`send_framing`](transport::Transport::send_framing), with
    /// the frame as [`Node::poll_transmit`] returns it. `Ok(None)`: taken as `send` takes it.
    /// `Err(WouldBlock)` also when such a message cannot go at once: nothing was taken, try
    /// again after the next transmit. While source routes are being written into frames, or
    /// probes or keyed messages wait, it is `send`.
    #[allow(clippy::too_many_arguments)]
    pub fn send_framing(
        &mut self,
        now: Time,
        target: Target,
        service: u16,
        data: &[u8],
        opts: MsgOptions,
        room: DirSet,
        buf: &mut [u8],
        keep: Option<transport::Keep<'_>>,
    ) -> Result<Option<Outbound>, SendError> {
        // A message to a key is never framed straight: its root may move (`keyed`).
        let dest = match target {
            Target::Server(c) => Some(c),
            Target::Key(_) => None,
        };
        // Source routes are written into frames after the transport built them, and the
        // source router's probes go before anything else: neither may be bypassed.
        let stamped = self.source_used && self.source.is_enabled();
        let probes = self.source_used && self.source.has_pending();
        let Some(dest) = dest.filter(|&d| {
            d != self.local
                && !stamped
                && !probes
                && self.key_out.is_empty()
                && self.routes.is_reachable(d)
        }) else {
            return self.send(now, target, service, data, opts).map(|()| None);
        };
        self.declared = None;
        let m = self.outgoing(now, dest, service, data, opts);
        let paths = NodePaths::new(&self.routes, self.source_used.then_some(&self.source));
        let Some(t) =
            self.transport
                .send_framing(now, m, LinkSet::from(room), &paths, buf, keep)?
        else {
            return Ok(None);
        };
        // The transport's links are the node's directions (`room` came from a DirSet).
        let dir = Dir::from_index(t.link).unwrap_or(Dir::ALL[0]);
        Ok(Some(Outbound {
            dir,
            len: t.len,
            kept: t.kept,
        }))
    }
}

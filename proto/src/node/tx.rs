//! Transmitting: the transport's frames and the queued key-routed short messages.

use super::*;

impl Node {
    /// The next frame to send, written into `buf` (which holds `mtu + 14` bytes), on one of
    /// the links in `room`.
    ///
    /// `keep` is for a driver that can keep `buf` (AF_XDP's UMEM; `None`: frames are copied
    /// as usual): [`Outbound::kept`] says the transport kept the buffer for retransmission,
    /// to be held until [`Node::take_released`] names it. Frames are not kept while source
    /// routing is on (the route is written into the frame after the transport built it).
    pub fn poll_transmit(
        &mut self,
        now: Time,
        room: DirSet,
        buf: &mut [u8],
        keep: Option<transport::Keep<'_>>,
    ) -> Option<Outbound> {
        self.last_now = self.last_now.max(now);
        self.declared = None;
        let room_links = LinkSet::from(room);
        if self.source_used {
            if let Some(t) = self
                .source
                .poll_transmit(&self.view, &self.routes, room, buf)
            {
                return Some(Outbound {
                    dir: t.0,
                    len: t.1,
                    kept: false,
                });
            }
        }
        if let Some((dir, len)) = self.poll_key(room, buf) {
            return Some(Outbound {
                dir,
                len,
                kept: false,
            });
        }
        let paths = NodePaths::new(&self.routes, self.source_used.then_some(&self.source));
        let stamped = self.source_used && self.source.is_enabled();
        let keep = keep.map(|k| transport::Keep {
            handle: k.handle.filter(|_| !stamped),
            ..k
        });
        let t = self
            .transport
            .poll_transmit(now, room_links, &paths, buf, keep)?;
        let dir = Dir::from_index(t.link)?;
        let tail = self.transport.take_declared_tail();
        let len = if stamped {
            // Stamping moves the payload: the tail is written first.
            if let Some((at, v)) = tail {
                buf[at..t.len].fill(v);
            }
            self.source.stamp(buf, t.len, dir, t.service)
        } else {
            self.declared = tail;
            t.len
        };
        Some(Outbound {
            dir,
            len,
            kept: t.kept,
        })
    }

    /// Whether [`Node::poll_transmit`] might have a frame (see
    /// [`Transport::may_transmit`](transport::Transport::may_transmit)): `false` means none,
    /// and the driver may skip the call.
    #[inline]
    pub fn may_transmit(&self) -> bool {
        self.source_used || !self.key_out.is_empty() || self.transport.may_transmit()
    }

    /// Where the frame the last `poll_transmit` call built stops being written, and the
    /// value its bytes from there to its end have
    /// ([`transport::Config::declare_tails`]; `None`: every byte written).
    pub fn take_declared_tail(&mut self) -> Option<(usize, u8)> {
        self.declared.take()
    }

    /// Moves the handles of the driver's buffers the transport no longer keeps into `out`
    /// ([`Node::poll_transmit`]).
    pub fn take_released(&mut self, out: &mut Vec<u32>) {
        self.transport.take_released(out);
    }

    pub(super) fn poll_key(&mut self, room: DirSet, buf: &mut [u8]) -> Option<(Dir, usize)> {
        for _ in 0..self.key_out.len() {
            let m = self.key_out.pop_front()?;
            let Some((root, hops)) = self.routes.route_key(m.key) else {
                // No server takes keys in this view: the message cannot go anywhere.
                self.stats.key_no_root += 1;
                continue;
            };
            if root == self.local {
                self.stats.key_delivered += 1;
                self.events.push_back(Event::Message {
                    src: self.local,
                    service: m.service,
                    data: m.data,
                    reliable: false,
                    key: Some(m.key),
                });
                continue;
            }
            let Some(dir) = hops.iter().find(|d| room.contains(*d)) else {
                self.key_out.push_back(m);
                continue;
            };
            let len = HEADERS_LEN + m.data.len();
            if buf.len() < len {
                continue;
            }
            let mut h = Header::new(Kind::Data, self.local, Dest::Key(m.key));
            h.service = m.service;
            h.payload_len = m.data.len() as u16;
            if m.intercept {
                h.flags |= flags::INTERCEPT;
            }
            if h.emit(buf).is_err() {
                continue;
            }
            buf[HEADERS_LEN..len].copy_from_slice(&m.data);
            return Some((dir, len));
        }
        None
    }
}

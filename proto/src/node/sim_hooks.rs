//! What the simulator needs of an engine beyond what a driver does: the addresses of the
//! state a receive or a send touches (to load them ahead), and which frames a receive may
//! write past the header. Crate-private: not part of the engine's API.

use super::*;

impl Node {
    /// Where the state [`Node::handle_rx_head`] reads lives: a simulator running thousands
    /// of engines loads these cache lines one event ahead, since by the time the next frame
    /// passes through a server its engine has left the cache. Addresses only, never read.
    pub(crate) fn rx_head_lines(&self) -> [*const u8; 3] {
        [
            std::ptr::from_ref(&self.local).cast(),
            std::ptr::from_ref(&self.routes).cast(),
            std::ptr::from_ref(&self.stats).cast(),
        ]
    }

    /// Where the state a send and the frame it makes read lives ([`Node::rx_head_lines`]
    /// for the send path): a simulator sending from thousands of engines in turn loads
    /// them a few sends ahead. Addresses only, never read.
    pub(crate) fn send_lines(&self) -> [*const u8; 6] {
        let t = self.transport.send_lines();
        [
            std::ptr::from_ref(&self.local).cast(),
            std::ptr::from_ref(&self.routes).cast(),
            t[0],
            t[1],
            t[2],
            t[3],
        ]
    }

    /// Whether receiving a frame that begins with `head` ([`Node::handle_rx`] and its
    /// variants) may write past its torus header: a source-routed frame's header moves over
    /// its route when it arrives, and an interceptor may rewrite the payload on its way.
    /// Any other frame has at most its TTL and hop count changed, so a driver that keeps
    /// the rest of a frame's bytes elsewhere (the simulator, runs of one value) may rely on
    /// them being as they were. `true` when `head` is too short to tell.
    pub(crate) fn rx_may_write_past_header(head: &[u8]) -> bool {
        let (Some(fl), Some(route)) = (
            head.get(wire::offset::FLAGS..wire::offset::FLAGS + 2),
            head.get(wire::offset::ROUTE_LEN),
        ) else {
            return true;
        };
        let fl = u16::from_be_bytes([fl[0], fl[1]]);
        head.len() < HEADERS_LEN
            || *route != 0
            || fl & (flags::SOURCE_ROUTED | flags::INTERCEPT) != 0
    }
}

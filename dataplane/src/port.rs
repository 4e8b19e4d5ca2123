//! One link as its poller sees it: the AF_XDP socket bound to the link's queue, the MAC
//! addresses frames on it carry, and the buffers of a multi-buffer frame being received.
//! (The XDP program attached to its interface is the server's, in `xdp_transit`.)

use torusnet_proto::topology::Dir;

use crate::xsk::{XdpDesc, XskSocket};

/// One link of a poller.
#[derive(Debug)]
pub struct Port {
    pub(crate) dir: Dir,
    pub(crate) local_mac: [u8; 6],
    pub(crate) neighbor_mac: Option<[u8; 6]>,
    pub(crate) xsk: XskSocket,
    /// Descriptors put on the TX ring since the last kick.
    pub(crate) unkicked: u32,
    /// Buffers of the multi-buffer frame being received on this link (a frame may straddle
    /// two turns; each link keeps its own).
    pub(crate) parts: Vec<XdpDesc>,
}

impl Port {
    /// A port over a bound socket.
    pub fn new(
        dir: Dir,
        local_mac: [u8; 6],
        neighbor_mac: Option<[u8; 6]>,
        xsk: XskSocket,
    ) -> Port {
        Port {
            dir,
            local_mac,
            neighbor_mac,
            xsk,
            unkicked: 0,
            parts: Vec::new(),
        }
    }

    /// Whether `frame` comes from the neighbour this link is wired to (any sender while its
    /// MAC is not known yet).
    pub(crate) fn is_from_neighbor(&self, frame: &[u8]) -> bool {
        match self.neighbor_mac {
            Some(m) => frame.len() >= 12 && frame[6..12] == m,
            None => true,
        }
    }
}

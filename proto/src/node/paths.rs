//! The links the transport may use towards a peer.

use super::*;

/// The links the transport may use: a source-routed flow's first hop, else the next hops.
pub(super) struct NodePaths<'a> {
    routes: &'a RouteTable,
    /// `None` while source routing has never been used here.
    source: Option<&'a SourceRouter>,
}

impl<'a> NodePaths<'a> {
    /// The paths by `routes`, and by `source` when source routing is in use.
    pub(super) fn new(routes: &'a RouteTable, source: Option<&'a SourceRouter>) -> Self {
        NodePaths { routes, source }
    }

    fn links(&self, peer: Coord, service: Option<u16>) -> LinkSet {
        match self.source.and_then(|s| s.route_for(peer, service)) {
            Some(r) => LinkSet::from(DirSet::EMPTY.with(r.first())),
            None => LinkSet::from(self.routes.next_hops(peer)),
        }
    }
}

impl transport::Paths for NodePaths<'_> {
    fn links_to(&self, peer: Coord) -> LinkSet {
        self.links(peer, None)
    }

    fn links_for(&self, peer: Coord, service: u16) -> LinkSet {
        self.links(peer, Some(service))
    }
}

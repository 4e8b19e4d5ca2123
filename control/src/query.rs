//! Offline answers to "where does this key live?" and "which links lead to that server?",
//! computed from dimensions and a list of failures exactly as docs/keyspace.md says, and
//! shaped as the JSON objects `torusctl key` and `torusctl route` print.

use std::collections::HashSet;
use std::str::FromStr;

use serde::Serialize;
use torusnet_proto::keyspace::{get_servers_for_key, Key, KeyPlacement};
use torusnet_proto::routing::{LinkView, RoutingError};
use torusnet_proto::topology::{Coord, Dims, Dir, TopologyError};

/// Why a query was refused; each says what was wrong in one line.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A coordinate, dimension or direction was malformed or outside the torus.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The torus is too large for routing tables.
    #[error(transparent)]
    Routing(#[from] RoutingError),
    /// A `--down-link` value was not `x,y,z:DIR`.
    #[error("malformed link {0:?}: expected x,y,z:DIR, e.g. 0,0,0:+x")]
    BadLink(String),
    /// A `--down-link` along an axis of size 1, where no link exists.
    #[error("link {0} does not exist: the torus has size 1 along that axis")]
    NoSuchLink(String),
}

/// One link of the torus, named by one of its ends: `x,y,z:DIR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkRef {
    /// The end the link is named from.
    pub at: Coord,
    /// Its direction from that end.
    pub dir: Dir,
}

impl FromStr for LinkRef {
    type Err = QueryError;
    fn from_str(s: &str) -> Result<LinkRef, QueryError> {
        let (c, d) = s
            .split_once(':')
            .ok_or_else(|| QueryError::BadLink(s.to_string()))?;
        let at = c.parse().map_err(|_| QueryError::BadLink(s.to_string()))?;
        let dir = d.parse().map_err(|_| QueryError::BadLink(s.to_string()))?;
        Ok(LinkRef { at, dir })
    }
}

/// The answer of `torusctl key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyAnswer {
    /// The 160-bit key, 40 hex digits.
    pub key: String,
    /// The routing key, 16 hex digits.
    pub routing_key: String,
    /// The home server.
    pub home: [u16; 3],
    /// The facet/order index `w mod 48`.
    pub index: u8,
    /// `GetServersForKey(key, replicas)` with every server not marked down reachable.
    pub servers: Vec<[u16; 3]>,
}

/// The answer of `torusctl route`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteAnswer {
    /// Where the route starts.
    pub from: [u16; 3],
    /// Where it ends.
    pub to: [u16; 3],
    /// Hop count over live links; `null` when unreachable.
    pub distance: Option<u32>,
    /// Directions of the next-hop set, in spec order.
    pub next_hops: Vec<String>,
}

/// `GetServersForKey` for `key` in `dims` with the servers in `down` failed.
pub fn key(dims: Dims, key: Key, replicas: usize, down: &[Coord]) -> Result<KeyAnswer, QueryError> {
    for c in down {
        dims.check(*c)?;
    }
    let down: HashSet<Coord> = down.iter().copied().collect();
    let k = key.routing_key();
    let p = KeyPlacement::new(dims, k);
    let servers = get_servers_for_key(dims, k, replicas, |c| !down.contains(&c));
    Ok(KeyAnswer {
        key: key.to_hex(),
        routing_key: format!("{k:016x}"),
        home: p.home.to_array(),
        index: p.index,
        servers: servers.into_iter().map(Coord::to_array).collect(),
    })
}

/// The distance and next-hop set from `from` to `to` with the given servers and links down.
pub fn route(
    dims: Dims,
    from: Coord,
    to: Coord,
    down: &[Coord],
    down_links: &[LinkRef],
) -> Result<RouteAnswer, QueryError> {
    dims.check(from)?;
    dims.check(to)?;
    let mut view = LinkView::all_up(dims)?;
    for c in down {
        view.set_server(dims.check(*c)?, false)?;
    }
    for l in down_links {
        dims.check(l.at)?;
        if !dims.has_links(l.dir) {
            return Err(QueryError::NoSuchLink(format!("{}:{}", l.at, l.dir)));
        }
        view.set_link(l.at, l.dir, false)?;
    }
    let (distance, hops) = view.route(from, to)?;
    Ok(RouteAnswer {
        from: from.to_array(),
        to: to.to_array(),
        distance,
        next_hops: hops.iter().map(|d| d.name().to_string()).collect(),
    })
}

//! `torusctl plan DIMS`: the cabling list of a torus (which port of which server goes to
//! which port of which neighbour) and, on request, a node file per server.

use std::fmt::Write;

use torusnet_proto::topology::{Coord, Dims, Dir};

/// Port names per direction, as in the node files (`px` = the +x port, ...).
pub const PORTS: [&str; 6] = ["px", "mx", "py", "my", "pz", "mz"];

/// Host name of server `c`.
pub fn host(prefix: &str, c: Coord) -> String {
    format!("{prefix}-{}-{}-{}", c.x, c.y, c.z)
}

/// One cable: from a server's + port to its neighbour's - port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cable {
    /// Server at the + end.
    pub a: Coord,
    /// Its port direction (+x, +y or +z).
    pub dir: Dir,
    /// The neighbour.
    pub b: Coord,
}

/// Every cable of the torus: one per server and + direction along axes of size 2 or more.
pub fn cables(dims: Dims) -> Vec<Cable> {
    let mut v = Vec::new();
    for c in dims.coords() {
        for d in [Dir::PlusX, Dir::PlusY, Dir::PlusZ] {
            if dims.has_links(d) {
                v.push(Cable {
                    a: c,
                    dir: d,
                    b: dims.neighbor(c, d),
                });
            }
        }
    }
    v
}

/// The cabling list for people.
pub fn render(dims: Dims, prefix: &str, ports: &[String; 6]) -> String {
    let cs = cables(dims);
    let mut s = String::new();
    let per = dims.link_dirs().len();
    let _ = writeln!(
        s,
        "# {dims} torus: {} servers, {} cables, {per} ports per server",
        dims.count(),
        cs.len()
    );
    let _ = writeln!(
        s,
        "# port names: {}",
        Dir::ALL
            .iter()
            .zip(ports.iter())
            .filter(|(d, _)| dims.has_links(**d))
            .map(|(d, p)| format!("{d}={p}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (i, c) in cs.iter().enumerate() {
        let _ = writeln!(
            s,
            "cable {:>4}: {:<14} port {:<6} ({})  <->  {:<14} port {:<6} ({})",
            i + 1,
            host(prefix, c.a),
            ports[usize::from(c.dir.index())],
            c.dir,
            host(prefix, c.b),
            ports[usize::from(c.dir.opposite().index())],
            c.dir.opposite()
        );
    }
    s
}

/// The node file of server `c` (both daemons read it); server (0,0,0) is the origin.
pub fn node_file(dims: Dims, c: Coord, prefix: &str, ports: &[String; 6], mtu: u32) -> String {
    let name = host(prefix, c);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Node file of {name} ({c} of a {dims} torus). Read by torusd and torusctl daemon."
    );
    let _ = writeln!(s, "name = \"{name}\"\ndims = \"{dims}\"\nmtu = {mtu}\ncores = [1]\npolling = \"busy\"\nsocket = \"/run/torusnet/{name}.sock\"");
    for d in Dir::ALL {
        if dims.has_links(d) {
            let _ = writeln!(
                s,
                "\n[[link]]\nifname = \"{}\"\ndir = \"{d}\"",
                ports[usize::from(d.index())]
            );
        }
    }
    let id = dims.index(c);
    let _ = writeln!(
        s,
        "\n[control]\nnode_id = {id}\norigin = {}\nstate_file = \"/var/lib/torusnet/{name}.coord\"\nsocket = \"/run/torusnet/{name}-control.sock\"",
        id == 0
    );
    s
}

//! Transit in the XDP program, as torusd keeps it: the one XDP program of this server and
//! what its maps say, rewritten whenever what they are made of changes: the view the engine
//! adopts (routes and live links), a link's carrier, a fault injected on a link's way out,
//! a link found loaded, the neighbours' MACs. What the program does with them is
//! `torusnet_proto::routing::transit` (docs/routing.md, "Transit in XDP").
//!
//! Every thread of torusd reaches it through `Shared::xdp` (a lock taken off the fast
//! path: on view changes, carrier changes, fault settings, every load sample).

use torusnet_proto::routing::transit::{LinkMacs, TransitMaps};
use torusnet_proto::routing::{LinkView, RouteTable};
use torusnet_proto::topology::{Coord, Dims, Dir, DirSet};

use crate::loader::{LoadError, XdpCounters, XdpProgram};

/// The XDP program and the state its transit maps are written from.
#[derive(Debug)]
pub struct XdpTransit {
    program: XdpProgram,
    /// The maps as last written.
    maps: TransitMaps,
    /// Links this server has a port on.
    ports: DirSet,
    /// Links live in the adopted view.
    live: DirSet,
    /// Links whose carrier the kernel reported lost.
    carrier_down: DirSet,
    /// Links with duplication or reordering injected on their way out (the poller applies
    /// those, so frames for them must pass through it).
    faulty: DirSet,
    /// Maps written at least once (the first write covers every route).
    written: bool,
}

impl XdpTransit {
    /// Transit for server `local` of `dims` over `program` (attached to the links in
    /// `ports`, whose MACs are `local_macs`), on or off. Nothing is forwarded in XDP until
    /// a view is adopted.
    pub fn new(
        program: XdpProgram,
        dims: Dims,
        local: Coord,
        on: bool,
        local_macs: &[(Dir, [u8; 6])],
    ) -> XdpTransit {
        let mut maps = TransitMaps::new(dims, local);
        maps.on = on;
        let mut ports = DirSet::EMPTY;
        for (d, mac) in local_macs {
            maps.macs[usize::from(d.index())].local = *mac;
            ports = ports.with(*d);
        }
        XdpTransit {
            program,
            maps,
            ports,
            live: DirSet::EMPTY,
            carrier_down: DirSet::EMPTY,
            faulty: DirSet::EMPTY,
            written: false,
        }
    }

    /// Whether frames pass through in XDP at all.
    pub fn is_on(&self) -> bool {
        self.maps.on
    }

    /// The maps as the program has them.
    pub fn maps(&self) -> &TransitMaps {
        &self.maps
    }

    /// The engine adopts `view`: routes from the same route table the engine builds, and
    /// the neighbours' MACs the control process learned (None: unchanged).
    pub fn adopt_view(
        &mut self,
        view: &LinkView,
        macs: &[Option<[u8; 6]>; 6],
    ) -> Result<(), LoadError> {
        let table = RouteTable::new(view, self.maps.local).map_err(|e| LoadError::Refused {
            ifname: "XDP program".into(),
            what: e.to_string(),
        })?;
        let changed = self.maps.set_routes(&table);
        for (m, new) in self.maps.macs.iter_mut().zip(macs) {
            if new.is_some() {
                m.neighbor = *new;
            }
        }
        self.live = view.live_dirs(self.maps.local);
        self.write(&changed)
    }

    /// The neighbours' MACs as configured (before any view).
    pub fn set_neighbor_macs(&mut self, macs: &[(Dir, Option<[u8; 6]>)]) {
        for (d, m) in macs {
            let slot: &mut LinkMacs = &mut self.maps.macs[usize::from(d.index())];
            if m.is_some() {
                slot.neighbor = *m;
            }
        }
    }

    /// The kernel reported link `dir`'s carrier lost or back.
    pub fn set_carrier(&mut self, dir: Dir, up: bool) -> Result<(), LoadError> {
        self.carrier_down = flip(self.carrier_down, dir, !up);
        self.write(&[])
    }

    /// Duplication or reordering is injected on link `dir`'s way out (or no longer).
    pub fn set_faulty(&mut self, dir: Dir, faulty: bool) -> Result<(), LoadError> {
        if self.faulty.contains(dir) == faulty {
            return Ok(());
        }
        self.faulty = flip(self.faulty, dir, faulty);
        self.write(&[])
    }

    /// Link `dir` is loaded (or no longer): frames passing through skip it while another
    /// next hop is free.
    pub fn set_congested(&mut self, dir: Dir, loaded: bool) -> Result<(), LoadError> {
        if self.maps.congested.contains(dir) == loaded {
            return Ok(());
        }
        self.maps.congested = flip(self.maps.congested, dir, loaded);
        self.write(&[])
    }

    /// Link `dir`'s load as frames' telemetry records it: written for the program when it
    /// moved by a twentieth of the capacity or more (the meters move a little every
    /// sample).
    pub fn set_level(&mut self, dir: Dir, level: u8) -> Result<(), LoadError> {
        let old = &mut self.maps.levels[usize::from(dir.index())];
        if old.abs_diff(level) < 5 && (*old > 100) == (level > 100) {
            return Ok(());
        }
        *old = level;
        self.write(&[])
    }

    /// Drops data frames arriving on link `dir` with probability `p` (tests).
    pub fn set_fault_drop(&mut self, dir: Dir, p: f64) -> Result<(), LoadError> {
        self.program.set_fault_drop(dir, p)
    }

    /// The program's counters of link `dir`.
    pub fn counters(&self, dir: Dir) -> XdpCounters {
        self.program.counters(Some(dir))
    }

    /// The program itself (tests run it).
    pub fn program(&self) -> &XdpProgram {
        &self.program
    }

    /// Writes the maps: the usable links worked out again, the routes of `changed`
    /// destinations (every one the first time).
    fn write(&mut self, changed: &[u32]) -> Result<(), LoadError> {
        let known: DirSet = Dir::ALL
            .into_iter()
            .filter(|d| self.maps.macs[usize::from(d.index())].neighbor.is_some())
            .collect();
        self.maps.usable = DirSet::from_bits(
            self.live.bits()
                & self.ports.bits()
                & known.bits()
                & !self.carrier_down.bits()
                & !self.faulty.bits(),
        );
        if self.written {
            self.program.write_transit(&self.maps, changed)
        } else {
            let all: Vec<u32> = (0..self.maps.routes.len() as u32).collect();
            self.program.write_transit(&self.maps, &all)?;
            self.written = true;
            Ok(())
        }
    }
}

fn flip(set: DirSet, dir: Dir, on: bool) -> DirSet {
    if on {
        set.with(dir)
    } else {
        set.without(dir)
    }
}

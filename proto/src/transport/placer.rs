//! Services that take their messages straight from the frame they arrived in.

use super::*;

/// A service's way to take its reliable messages straight from the frame they arrived in,
/// when they may be delivered at once (remote memory writes bytes in place this way): it
/// returns what to deliver to the service instead, if anything.
pub trait Placer: Send {
    /// Takes message `data` from `src`; `now` is the frame's arrival.
    fn place(&mut self, now: Time, src: Coord, data: &[u8]) -> Option<Vec<u8>>;
}

/// The placers of a transport, by service.
#[derive(Default)]
pub(super) struct Placers(pub(super) Vec<(u16, Box<dyn Placer>)>);

impl std::fmt::Debug for Placers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(s, _)| s))
            .finish()
    }
}

impl Placers {
    /// Whether `service` has a placer.
    #[inline(always)]
    pub(super) fn has(&self, service: u16) -> bool {
        self.0.iter().any(|(s, _)| *s == service)
    }

    /// The placer of `service`, if it has one.
    pub(super) fn get(&mut self, service: u16) -> Option<&mut Box<dyn Placer>> {
        self.0
            .iter_mut()
            .find(|(s, _)| *s == service)
            .map(|(_, p)| p)
    }
}

//! On-path services: a service's hook on its frames passing through this server.

use super::*;

/// What a service sees and may do with a frame passing through this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it go on.
    Forward,
    /// Take it: it goes no further.
    Consume,
    /// Keep it for now: the service decides later (in another thread or process). The
    /// engine sets the frame aside ([`Node::take_held`]); the driver puts it back on its way,
    /// changed or not ([`Node::resume_on_path`]), or drops it.
    Hold,
}

/// A service's hook on frames that pass through this server (CamCube lets services see and
/// change packets on path). Called for frames flagged `INTERCEPT` of that service.
pub trait Interceptor: Send {
    /// Sees the header and may change the payload in place.
    fn on_path(&mut self, header: &Header, payload: &mut [u8]) -> Verdict;
}

impl Node {
    /// Stops `service`'s on-path hook.
    pub fn stop_intercepting(&mut self, service: u16) {
        self.interceptors.retain(|(s, _)| *s != service);
    }

    /// Frames on-path hooks held ([`Verdict::Hold`]) since the last call, whole (Ethernet
    /// header included), for the driver to hand to the services that hold them.
    pub fn take_held(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.held)
    }

    /// Puts a held frame (possibly changed: [`wire::with_payload`]) back on its way: routed
    /// as when it arrived, but no on-path hook here sees it again. `Forward` names the links
    /// it goes on (its TTL and hop count updated in `frame`).
    pub fn resume_on_path(&mut self, now: Time, frame: &mut [u8]) -> RxAction {
        self.resuming = true;
        let a = self.handle_rx(now, Dir::PlusX, frame);
        self.resuming = false;
        a
    }

    pub(super) fn run_interceptor(&mut self, h: &Header, frame: &mut [u8]) -> Option<Verdict> {
        let hook = self
            .interceptors
            .iter_mut()
            .find(|(s, _)| *s == h.service)?;
        self.stats.intercepted += 1;
        let end = HEADERS_LEN + usize::from(h.payload_len);
        let payload = frame.get_mut(HEADERS_LEN..end)?;
        Some(hook.1.on_path(h, payload))
    }
}

//! On-path services: a service's hook on its frames passing through this server.

use super::*;

/// What a service sees and may do with a frame passing through this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it go on.
    Forward,
    /// Take it: it goes no further.
    Consume,
}

/// A service's hook on frames that pass through this server (CamCube lets services see and
/// change packets on path). Called for frames flagged `INTERCEPT` of that service.
pub trait Interceptor: Send {
    /// Sees the header and may change the payload in place.
    fn on_path(&mut self, header: &Header, payload: &mut [u8]) -> Verdict;
}

impl Node {
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

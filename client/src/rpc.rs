//! Request/response over messages: calls with their deadline, answers, a serving loop.

use crate::*;

impl Client {
    /// Sends a request and waits for its reply (other events meanwhile are kept for
    /// [`Client::recv`]). A request the transport reports failed ends the call at once.
    pub fn call(&self, to: Dest, request: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let mut msg = Vec::with_capacity(8 + request.len());
        msg.extend_from_slice(&call.to_le_bytes());
        msg.extend_from_slice(request);
        let deadline = Instant::now() + timeout;
        let tag = loop {
            match self.submit(
                to.clone(),
                &msg,
                SendOptions::reliable(),
                kind::RPC_REQUEST,
                None,
            ) {
                Ok(t) => break t,
                Err(Error::WouldBlock) if Instant::now() < deadline => {
                    // Make room by reading what came in.
                    self.stash_one()?;
                }
                Err(e) => return Err(e),
            }
        };
        loop {
            {
                let mut rx = self.rx.lock();
                while let Some(p) = self.read_cq(&mut rx) {
                    match p {
                        Parsed::Event(e) => rx.pending.push_back(e),
                        Parsed::Reply(c, d) => {
                            rx.replies.insert(c, d);
                        }
                        Parsed::Nothing => {}
                    }
                }
                if let Some(reply) = rx.replies.remove(&call) {
                    return Ok(reply);
                }
                let failed = rx
                    .pending
                    .iter()
                    .position(|e| matches!(e, Event::Failed { tag: t, .. } if *t == tag));
                if let Some(i) = failed {
                    if let Some(Event::Failed { peer, reason, .. }) = rx.pending.remove(i) {
                        return Err(Error::Refused(format!(
                            "the request to {peer:?} failed: {reason:?}"
                        )));
                    }
                }
            }
            if !self.wait_cq(Some(deadline))? {
                return Err(Error::Timeout);
            }
        }
    }

    /// Answers a request ([`Event::Request`]).
    pub fn respond(&self, to: Address, call: u64, response: &[u8]) -> Result<u64, Error> {
        let mut msg = Vec::with_capacity(8 + response.len());
        msg.extend_from_slice(&call.to_le_bytes());
        msg.extend_from_slice(response);
        self.submit(
            Dest::Service(to),
            &msg,
            SendOptions::reliable(),
            kind::RPC_REPLY,
            None,
        )
    }

    /// Serves requests with `handler` until `wait` passes with nothing to do; other events
    /// are returned to the caller as they come (`Ok(Some(event))`).
    pub fn serve(
        &self,
        wait: Wait,
        mut handler: impl FnMut(Address, &[u8]) -> Vec<u8>,
    ) -> Result<Option<Event>, Error> {
        loop {
            match self.recv(wait)? {
                Some(Event::Request { from, call, data }) => {
                    let out = handler(from, &data);
                    loop {
                        match self.respond(from, call, &out) {
                            Err(Error::WouldBlock) => self.stash_one()?,
                            r => {
                                r?;
                                break;
                            }
                        }
                    }
                }
                other => return Ok(other),
            }
        }
    }
}

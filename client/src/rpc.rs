//! Request/response over messages: calls with their deadline, answers, a serving loop.

use crate::*;

impl Client {
    /// Sends a request and waits for its reply (other events meanwhile are kept for
    /// [`Client::recv`]). A request the transport reports failed ends the call at once,
    /// except one to a name whose server says the service is not there (it moved): the
    /// name is resolved again and the request sent there, within the same deadline (it
    /// was never delivered, so it is not delivered twice).
    pub fn call(&self, to: Dest, request: &[u8], timeout: Duration) -> Result<Vec<u8>, Error> {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let mut msg = Vec::with_capacity(8 + request.len());
        msg.extend_from_slice(&call.to_le_bytes());
        msg.extend_from_slice(request);
        let deadline = Instant::now() + timeout;
        let mut dest = to.clone();
        let mut tries = 0;
        loop {
            tries += 1;
            match self.call_once(&dest, &msg, call, deadline) {
                Ok(reply) => return Ok(reply),
                Err(CallFailed::Local(e)) => return Err(e),
                Err(CallFailed::Sent(reason, peer)) => match &to {
                    Dest::Name(n) if reason == FailReason::NoService && tries < MAX_CALL_TRIES => {
                        dest = Dest::Service(self.relocate(n, peer, deadline)?);
                    }
                    _ => {
                        return Err(Error::Refused(format!(
                            "the request to {peer:?} failed: {reason:?}"
                        )))
                    }
                },
            }
        }
    }

    /// Where service `name` is now that `gone` said it is not there: resolved again, `gone`
    /// left out of the answer (a directory entry can outlive the service for a while), the
    /// cache updated.
    fn relocate(&self, name: &str, gone: Coord, deadline: Instant) -> Result<Address, Error> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout);
        }
        let mut at = self.resolve(name, left.min(Duration::from_secs(2)))?;
        at.retain(|a| a.server != gone);
        let first = at.first().copied();
        self.names.lock().insert(name.to_string(), at);
        first.ok_or_else(|| Error::NotFound(name.to_string()))
    }

    /// One attempt of `call`: the request submitted, then its reply or its failure.
    fn call_once(
        &self,
        to: &Dest,
        msg: &[u8],
        call: u64,
        deadline: Instant,
    ) -> Result<Vec<u8>, CallFailed> {
        let tag = loop {
            match self.submit(
                to.clone(),
                msg,
                SendOptions::reliable(),
                kind::RPC_REQUEST,
                None,
            ) {
                Ok(t) => break t,
                Err(Error::WouldBlock) if Instant::now() < deadline => {
                    // Make room by reading what came in.
                    self.stash_one().map_err(CallFailed::Local)?;
                }
                Err(e) => return Err(CallFailed::Local(e)),
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
                        return Err(CallFailed::Sent(reason, peer));
                    }
                }
            }
            if !self.wait_cq(Some(deadline)).map_err(CallFailed::Local)? {
                return Err(CallFailed::Local(Error::Timeout));
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
                Some(Event::Request {
                    from, call, data, ..
                }) => {
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

/// How many times a call to a name is sent when the servers it reaches say the service is
/// not there (directory entries of a moved service can outlive it for a while).
const MAX_CALL_TRIES: u32 = 4;

/// Why one attempt of a call ended without a reply.
enum CallFailed {
    /// The transport reported the request failed at this server.
    Sent(FailReason, Coord),
    /// It was not sent, or no answer came by the deadline.
    Local(Error),
}

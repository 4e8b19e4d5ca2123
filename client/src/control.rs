//! The attach socket's JSON requests: names, acknowledgement reports.

use crate::*;

/// The most names an application may add to its attach name.
pub const MAX_NAMES: usize = 16;

pub(crate) fn read_line(sock: &UnixStream) -> Result<Value, Error> {
    let (line, _) = sys::recv_line_with_fds(sock, 0).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Closed
        } else {
            Error::Io(e)
        }
    })?;
    let v: Value = serde_json::from_slice(&line)
        .map_err(|e| Error::Refused(format!("torusd answered non-JSON: {e}")))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(Error::Refused(e.to_string()));
    }
    Ok(v)
}

pub(crate) fn coord_of(v: &Value) -> Option<Coord> {
    let a = v.as_array()?;
    let g = |i: usize| a.get(i)?.as_u64().and_then(|n| u16::try_from(n).ok());
    Some((g(0)?, g(1)?, g(2)?))
}

impl Client {
    /// One request on the attach socket (names, acknowledgements), answered within `limit`.
    pub(crate) fn request(&self, req: Value, limit: Duration) -> Result<Value, Error> {
        let s = self.sock.lock();
        s.set_read_timeout(Some(limit))?;
        {
            use std::io::Write;
            let mut w = &*s;
            writeln!(w, "{req}").map_err(|_| Error::Closed)?;
        }
        read_line(&s).map_err(|e| match e {
            Error::Io(io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Error::Timeout
            }
            other => other,
        })
    }

    /// The servers that host service `name`, across the torus.
    pub fn resolve(&self, name: &str, timeout: Duration) -> Result<Vec<Address>, Error> {
        let v = self.request(
            json!({"cmd": "resolve", "name": name, "timeout_ms": timeout.as_millis() as u64}),
            timeout + Duration::from_secs(1),
        )?;
        let mut out = Vec::new();
        for l in v["locations"].as_array().into_iter().flatten() {
            if let (Some(server), Some(service)) = (
                coord_of(&l["server"]),
                l["service"].as_u64().and_then(|s| u16::try_from(s).ok()),
            ) {
                out.push(Address { server, service });
            }
        }
        self.names.lock().insert(name.to_string(), out.clone());
        Ok(out)
    }

    /// Forgets what `resolve` cached for `name` (its host moved). The client forgets by
    /// itself the locations on a server that reports a message to it failed because the
    /// service is not there (or the server restarted, reset or became unreachable): the
    /// next send to the name resolves it again.
    pub fn forget(&self, name: &str) {
        self.names.lock().remove(name);
    }

    /// Drops every cached location on `server` (a name left with none is resolved again
    /// when next used).
    pub(crate) fn forget_server(&self, server: Coord) {
        let mut names = self.names.lock();
        names.retain(|_, at| {
            at.retain(|a| a.server != server);
            !at.is_empty()
        });
    }

    /// Asks for a fair-queuing weight: this application's share of every link its frames
    /// share with other services' (frames per turn, and with congestion control, its share
    /// on forwarders' links too). torusd grants at most its node file's `[apps] max_weight`
    /// and answers with what it granted; it refuses when the node file sets this
    /// application's weight itself.
    pub fn request_weight(&self, weight: u32) -> Result<u32, Error> {
        let v = self.request(
            json!({"cmd": "weight", "weight": weight}),
            Duration::from_secs(5),
        )?;
        v["weight"]
            .as_u64()
            .and_then(|w| u32::try_from(w).ok())
            .ok_or_else(|| Error::Refused("torusd granted no weight".into()))
    }

    /// Adds a service name to this application: messages and requests to it arrive on this
    /// channel too ([`Event::Message`]'s `to` says which name they were for), other servers
    /// find it by [`Client::resolve`], and [`SendOptions::from`] sends as it. Returns its
    /// service id. Refused when the name's id is taken on this server, or when the
    /// application has added [`MAX_NAMES`] names already. The name goes when the
    /// application detaches.
    pub fn add_name(&self, name: &str) -> Result<u16, Error> {
        let v = self.request(
            json!({"cmd": "add_name", "name": name}),
            Duration::from_secs(10),
        )?;
        let id = v["service"]
            .as_u64()
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| Error::Refused("torusd gave the name no service id".into()))?;
        self.added.lock().push(id);
        Ok(id)
    }

    /// Intercepts (or stops) this application's service on the path: frames of it sent
    /// with [`SendOptions::on_path`] that pass through this server are held and shown to it
    /// ([`Event::Intercepted`]) for a verdict ([`Client::verdict`]), CamCube's per-hop
    /// services. Frames of services that nobody intercepts pay nothing on the way.
    pub fn intercept(&self, on: bool) -> Result<(), Error> {
        self.request(
            json!({"cmd": "intercept", "on": on}),
            Duration::from_secs(5),
        )?;
        Ok(())
    }

    /// Asks for [`Event::Acked`] reports of this application's reliable messages.
    pub fn notify_acks(&self, on: bool) -> Result<(), Error> {
        self.request(
            json!({"cmd": "notify_acks", "on": on}),
            Duration::from_secs(5),
        )?;
        Ok(())
    }
}

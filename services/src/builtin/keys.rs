//! `keys` (service 3): key-routed probes. A probe is a short message to a routing key,
//! routed by key at every hop; the server that delivers it counts it under its key, so a test
//! can check that every key landed on its root (`torusctl key`) and nowhere else.

use std::collections::HashMap;
use std::sync::mpsc::Sender;

use serde_json::{json, Value};
use torusnet_proto::node::{Event, MsgOptions, Target};
use torusnet_proto::service::{Engine, Request, Service};
use torusnet_proto::time::Time;

/// Service id of the built-in key probe.
pub const KEYS: u16 = 3;

/// What the key service is asked.
#[derive(Debug)]
pub enum KeysRequest {
    /// Send one probe per routing key; the reply says how many the engine took.
    Send(Vec<u64>, Sender<Value>),
    /// Report the probes delivered here (routing key in hex -> count); clear them if set.
    Seen(bool, Sender<Value>),
}

/// The key probe service.
#[derive(Debug, Default)]
pub struct Keys {
    seen: HashMap<u64, u64>,
}

impl Service for Keys {
    fn name(&self) -> &'static str {
        "keys"
    }

    fn ids(&self) -> &[u16] {
        &[KEYS]
    }

    fn on_event(&mut self, _now: Time, e: &Event, _node: &mut dyn Engine) {
        if let Event::Message {
            service: KEYS,
            key: Some(k),
            ..
        } = e
        {
            *self.seen.entry(*k).or_insert(0) += 1;
        }
    }

    fn on_request(
        &mut self,
        now: Time,
        request: Request,
        node: &mut dyn Engine,
    ) -> Result<(), Request> {
        match *request.downcast::<KeysRequest>()? {
            KeysRequest::Send(keys, reply) => {
                let sent = keys
                    .iter()
                    .filter(|k| {
                        node.send(
                            now,
                            Target::Key(**k),
                            KEYS,
                            &k.to_be_bytes(),
                            MsgOptions::default(),
                        )
                        .is_ok()
                    })
                    .count();
                let _ = reply.send(json!({ "sent": sent }));
            }
            KeysRequest::Seen(reset, reply) => {
                let m: serde_json::Map<String, Value> = self
                    .seen
                    .iter()
                    .map(|(k, n)| (format!("{k:016x}"), json!(n)))
                    .collect();
                if reset {
                    self.seen.clear();
                }
                let _ = reply.send(Value::Object(m));
            }
        }
        Ok(())
    }

    fn poll(&mut self, _now: Time, _node: &mut dyn Engine) -> usize {
        0
    }
}

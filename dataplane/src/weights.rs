//! Services' shares of the links: fair-queuing weights by service name.
//!
//! Every service sends through a queue of its own, and the queues take turns for a link
//! with room, as many frames a turn as their weights (CamCube's weighted fair queuing); with
//! congestion control on, the weight also multiplies the additive step of the connections
//! that carry the service's frames, so the split holds on links shared at forwarders too.
//! The operator names weights in the node file, for built-in services and for applications
//! by the names they attach with:
//!
//! ```toml
//! [weights]          # 1..=64, by service name; every other service has weight 1
//! kv = 2
//! "analytics" = 4
//!
//! [apps]
//! max_weight = 8     # the most an application not named above may ask for itself
//! ```
//!
//! An application named under `[weights]` has that weight and may not change it; any other
//! starts at 1 and may ask for up to `max_weight` (more is granted as `max_weight`).

use std::collections::BTreeMap;

use torusnet_services::builtin::{BENCH, KEYS, LOAD, PING};
use torusnet_services::names::{is_service_name, MAX_NAME};

/// The heaviest weight anyone may set: a service with it sends 64 frames a turn.
pub const MAX_WEIGHT: u32 = 64;

/// The built-in services a node file may weigh, by name.
pub const BUILTIN: [(&str, u16); 10] = [
    ("ping", PING),
    ("bench", BENCH),
    ("keys", KEYS),
    ("load", LOAD),
    ("names", torusnet_services::names::NAMES),
    ("kv", torusnet_services::kv::KV),
    ("multicast", torusnet_services::multicast::MCAST),
    ("aggregate", torusnet_services::aggregate::AGG),
    ("ip", crate::ip::IP),
    ("rmem", crate::rmem::RMEM),
];

/// The weights the operator set, and how far applications may raise their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    named: BTreeMap<String, u32>,
    max_app: u32,
}

impl Default for Weights {
    fn default() -> Weights {
        Weights {
            named: BTreeMap::new(),
            max_app: 8,
        }
    }
}

impl Weights {
    /// Checks the node file's `[weights]` table and `[apps] max_weight`; the error names
    /// the field.
    pub fn new(named: BTreeMap<String, i64>, max_app: Option<u32>) -> Result<Weights, String> {
        let mut checked = BTreeMap::new();
        for (name, &w) in &named {
            let Some(w) = u32::try_from(w)
                .ok()
                .filter(|w| (1..=MAX_WEIGHT).contains(w))
            else {
                return Err(format!("weights.{name}: {w} is outside 1..={MAX_WEIGHT}"));
            };
            if !is_service_name(name) {
                return Err(format!(
                    "weights: {name:?} is not a service name (1..={MAX_NAME} bytes, no spaces or control characters)"
                ));
            }
            checked.insert(name.clone(), w);
        }
        let max_app = max_app.unwrap_or(Weights::default().max_app);
        if !(1..=MAX_WEIGHT).contains(&max_app) {
            return Err(format!(
                "apps.max_weight: {max_app} is outside 1..={MAX_WEIGHT}"
            ));
        }
        Ok(Weights {
            named: checked,
            max_app,
        })
    }

    /// The built-in services given a weight, as (service id, weight).
    pub fn builtin(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        BUILTIN
            .iter()
            .filter_map(|&(name, id)| self.named.get(name).map(|&w| (id, w)))
    }

    /// The weight an application attaching as `name` starts with.
    pub fn at_attach(&self, name: &str) -> u32 {
        self.named.get(name).copied().unwrap_or(1)
    }

    /// The weight an application attached as `name` gets when it asks for `asked`: refused
    /// when the operator set its weight, or when `asked` is 0; at most `max_weight`.
    pub fn grant(&self, name: &str, asked: u64) -> Result<u32, String> {
        if let Some(w) = self.named.get(name) {
            return Err(format!(
                "the weight of {name:?} is set by the node file ({w}); ask its operator"
            ));
        }
        if asked == 0 {
            return Err("weight: 1 or more".into());
        }
        Ok(u32::try_from(asked).unwrap_or(u32::MAX).min(self.max_app))
    }

    /// The most an application may ask for.
    pub fn max_app(&self) -> u32 {
        self.max_app
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(pairs: &[(&str, i64)], max: Option<u32>) -> Result<Weights, String> {
        Weights::new(
            pairs.iter().map(|&(n, w)| (n.to_string(), w)).collect(),
            max,
        )
    }

    #[test]
    fn named_services_keep_their_weight_and_others_ask_within_the_limit() {
        let w = weights(&[("kv", 2), ("analytics", 4)], Some(6)).expect("valid");
        assert_eq!(
            w.builtin().collect::<Vec<_>>(),
            vec![(torusnet_services::kv::KV, 2)]
        );
        assert_eq!(w.at_attach("analytics"), 4);
        assert_eq!(w.at_attach("other"), 1);
        assert!(w.grant("analytics", 1).is_err());
        assert_eq!(w.grant("other", 3), Ok(3));
        assert_eq!(w.grant("other", 1000), Ok(6));
        assert_eq!(w.grant("other", u64::MAX), Ok(6));
        assert!(w.grant("other", 0).is_err());
    }

    #[test]
    fn bad_weights_are_refused_with_the_field() {
        let e = weights(&[("kv", 0)], None).expect_err("zero");
        assert!(e.contains("weights.kv"), "{e}");
        let e = weights(&[("kv", 65)], None).expect_err("too heavy");
        assert!(e.contains("1..=64"), "{e}");
        let e = weights(&[("a b", 2)], None).expect_err("a space");
        assert!(e.contains("service name"), "{e}");
        let e = weights(&[], Some(0)).expect_err("max 0");
        assert!(e.contains("apps.max_weight"), "{e}");
    }

    #[test]
    fn every_builtin_name_is_one_service() {
        let mut ids: Vec<u16> = BUILTIN.iter().map(|b| b.1).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), BUILTIN.len());
    }
}

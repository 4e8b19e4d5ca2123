//! End-to-end tests of torusnet live in `tests/tests/`: real `torusd` processes in network
//! namespaces (see `torusnet_dataplane::cluster`). This crate has no code of its own.

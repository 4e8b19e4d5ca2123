//! Applications in their own processes: the server side of the shared-memory channels.
//!
//! - [`listener`]: the application socket. A process connects, is checked (its peer
//!   credentials: root, torusd's own user, or a member of the configured group), names its
//!   service, and receives its channel: a memfd holding the rings (layout in
//!   `torusnet_client::channel`) and two eventfds. The connection then carries slow requests
//!   (resolve a name, acknowledgements on or off); when it closes, the application is gone.
//! - [`host`]: the channels' other end, a service hosted in the first poller. Each turn it
//!   reads what applications submitted and hands it to the engine, and writes what the
//!   engine delivered for them into their rings, without a system call unless one side
//!   sleeps.
//!
//! What an application writes into its channel is untrusted: the host copies entries out
//! before checking them, bounds every offset and length, stamps the sender's service id
//! itself, and closes a channel whose indices make no sense. One application that floods,
//! stops reading or dies never stalls torusd or the others: rings are bounded, a full one
//! answers "would block" to its application, undelivered events wait in a bounded queue
//! and beyond it are dropped and reported to that application only, and a closed socket
//! releases the channel.

pub mod host;
pub mod listener;
pub mod multicast;
pub mod rmem_ops;

//! AF_XDP sockets, written against the kernel ABI directly: one module per kernel concept.
//!
//! Why not xsk-rs (the design's first choice): torusnet's forwarding moves a frame's chunk
//! from one link's RX ring to another link's TX ring, so the chunk allocator must be one
//! free list over the whole UMEM shared by every socket of the server, owned by the poller.
//! xsk-rs hands out frame descriptors per socket and builds libbpf/libxdp from C; the ABI
//! itself is six structs and four rings, so we own it (docs/design-notes.md).

pub mod ring;
pub mod socket;
pub mod sys;
pub mod umem;

pub use socket::{CopyMode, SocketConfig, SocketInfo, XskSocket};
pub use sys::XdpDesc;
pub use umem::{Umem, CHUNK, MAX_FRAME_CHUNKS};

//! Frames the driver keeps for the transport: a driver that builds frames in memory it can
//! hold (AF_XDP's UMEM) lets the transport keep a reliable frame where it was built and
//! sent, instead of a copy, until the frame is acknowledged. A retransmission then copies it
//! back out into the new frame (rare), where every first transmission would otherwise pay a
//! copy (a jumbo frame's 9 KB). Drivers that do not keep frames (the simulator, the
//! harness) see no difference: the transport copies as before.

/// A sent frame as the sender keeps it for retransmission.
#[derive(Debug)]
pub enum KeptFrame {
    /// A copy, from the torus header on (the I/O layer adds the Ethernet addresses).
    Owned(Vec<u8>),
    /// The buffer the frame was built in, which the driver keeps until the transport
    /// releases it (`Transport::take_released`): no copy. `len` bytes from the torus header
    /// on.
    Driver {
        /// The driver's name for the buffer.
        handle: u32,
        /// Bytes from the torus header on.
        len: u32,
    },
}

/// The driver's side: reads back a frame it keeps.
pub trait KeptFrames {
    /// Copies `to.len()` bytes of kept frame `handle`, from byte `offset` of the buffer it
    /// was built in, into `to`. False when `handle` names no kept frame (nothing copied).
    fn copy_kept(&self, handle: u32, offset: usize, to: &mut [u8]) -> bool;
}

/// What a driver offers with one call to transmit: the buffer it passes may be kept (as
/// `handle`), and where frames kept before are read back from.
#[derive(Clone, Copy)]
pub struct Keep<'a> {
    /// The passed buffer's name if the transport may keep it (`None`: copy as usual).
    pub handle: Option<u32>,
    /// Frames kept earlier.
    pub frames: &'a dyn KeptFrames,
}

impl std::fmt::Debug for Keep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keep")
            .field("handle", &self.handle)
            .finish()
    }
}

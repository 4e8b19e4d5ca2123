//! What went wrong in a call.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The channel is full: receive, then try again.
    #[error("would block: the channel to torusd is full")]
    WouldBlock,
    /// Nothing came in time.
    #[error("timed out")]
    Timeout,
    /// torusd refused (the reason says why).
    #[error("torusd: {0}")]
    Refused(String),
    /// The message is too large.
    #[error("message of {0} bytes is too large")]
    TooLarge(usize),
    /// No server hosts the name.
    #[error("no server hosts service {0:?}")]
    NotFound(String),
    /// torusd went away (the channel is closed).
    #[error("torusd closed the channel")]
    Closed,
    /// The attach socket.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

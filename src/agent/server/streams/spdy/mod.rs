//! SPDY/3.1, as kubectl (through moby/spdystream) and containerd's
//! streaming server speak it: frames, header compression, sessions.

pub mod frame;
pub mod session;
pub mod zlib;

pub use frame::Headers;
pub use session::{Session, SessionError, Stream, StreamReader, StreamWriter};

//! What the relays and connection handles share about sockets: the chunk size, how a read
//! chunk is taken out of its buffer, and the abortive close.

use bytes::{Bytes, BytesMut};

/// Largest DATA payload either end sends, and the size of relay reads.
pub const MAX_CHUNK: usize = 64 * 1024;

/// Takes the bytes just read into `buf`. A small chunk is copied out, so that while it waits
/// in queues it does not keep the whole (typically 64 KiB) read allocation alive; a large one
/// is split off without a copy.
pub fn take_read(buf: &mut BytesMut) -> Bytes {
    const COPY_BELOW: usize = 16 * 1024;
    if buf.len() < COPY_BELOW {
        let chunk = Bytes::copy_from_slice(buf);
        buf.clear();
        chunk
    } else {
        buf.split().freeze()
    }
}

/// SO_LINGER 0: the close sends RST, so the far end sees a failure rather than a clean end.
/// A zero linger never blocks, unlike what tokio's deprecation of `set_linger` warns about.
#[allow(deprecated)]
pub fn reset_on_close(stream: &tokio::net::TcpStream) {
    let _ = stream.set_linger(Some(std::time::Duration::ZERO));
}

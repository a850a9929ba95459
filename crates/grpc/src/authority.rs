//! Makes gRPC-over-Unix-socket clients acceptable to `h2`.
//!
//! grpc-go (and so kube-apiserver's Konnectivity dialer) sends the percent-encoded socket
//! path as `:authority`, e.g. `%2Fetc%2Fkubernetes%2Fkonnectivity.sock`. `h2` validates the
//! authority with the `http` crate, which rejects `%`, and resets every such stream with
//! PROTOCOL_ERROR (hyperium/h2#487). The authority means nothing on a Unix socket, so this
//! reader rewrites every literal `:authority` in the client's HEADERS frames to a short valid
//! host before `h2` parses them.
//!
//! HPACK safety: the replacement is never longer than the original value, so every dynamic
//! table entry on `h2`'s side is at most as large as the client's. `h2`'s table then evicts no
//! earlier than the client's, and every index the client sends still names the same entry.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// `:authority` in the HPACK static table.
const AUTHORITY_INDEX: u64 = 1;
/// Frames larger than this are passed through untouched (h2 would refuse them anyway).
const MAX_HEADERS_FRAME: usize = 1 << 20;

#[derive(Debug, Clone, Copy)]
enum State {
    Preface,
    FrameHeader,
    Headers {
        header: [u8; FRAME_HEADER_LEN],
        len: usize,
    },
    Passthrough(usize),
}

/// Wraps the server side of an HTTP/2 connection; writes pass through unchanged.
#[derive(Debug)]
pub struct AuthorityRewrite<IO> {
    io: IO,
    state: State,
    /// Bytes read from `io` and not yet parsed.
    input: BytesMut,
    /// Parsed bytes ready for the reader.
    output: BytesMut,
}

impl<IO> AuthorityRewrite<IO> {
    pub fn new(io: IO) -> Self {
        Self {
            io,
            state: State::Preface,
            input: BytesMut::new(),
            output: BytesMut::new(),
        }
    }

    /// Bytes `input` must hold before the current state can be parsed.
    fn needed(&self) -> usize {
        match self.state {
            State::Preface => PREFACE_LEN,
            State::FrameHeader => FRAME_HEADER_LEN,
            State::Headers { len, .. } => len,
            State::Passthrough(_) => 0,
        }
    }

    /// Parses `input` once it holds exactly [`needed`](Self::needed) bytes.
    fn process(&mut self) {
        if self.input.len() < self.needed() {
            return;
        }
        match self.state {
            State::Passthrough(_) => {}
            State::Preface => {
                self.output.put(self.input.split());
                self.state = State::FrameHeader;
            }
            State::FrameHeader => {
                let mut header = [0u8; FRAME_HEADER_LEN];
                self.input.copy_to_slice(&mut header);
                let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
                self.state = if header[3] == HEADERS && len <= MAX_HEADERS_FRAME {
                    State::Headers { header, len }
                } else {
                    self.output.put_slice(&header);
                    State::Passthrough(len)
                };
            }
            State::Headers { mut header, .. } => {
                let payload = self.input.split();
                let payload = rewrite_headers_payload(header[4], &payload)
                    .unwrap_or_else(|| payload.to_vec());
                let new_len = (payload.len() as u32).to_be_bytes();
                header[..3].copy_from_slice(&new_len[1..]);
                self.output.put_slice(&header);
                self.output.put_slice(&payload);
                self.state = State::FrameHeader;
            }
        }
    }
}

/// Rewrites the HEADERS payload, or `None` to leave it as it is.
fn rewrite_headers_payload(flags: u8, payload: &[u8]) -> Option<Vec<u8>> {
    let mut start = 0;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        pad = *payload.first()? as usize;
        start = 1;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    let block = payload.get(start..end)?;
    let field = find_authority(block)?;
    // The shortest value a Huffman string of this size can decode to: 30-bit codes at most.
    let decoded_min = if field.huffman {
        (field.encoded_len * 8).saturating_sub(7) / 30
    } else {
        field.encoded_len
    };
    let replacement: &[u8] = match decoded_min {
        0 => return None,
        1..=8 => b"a",
        _ => b"localhost",
    };
    let (field_start, field_end, prefix_bits) = (field.start, field.end, field.prefix_bits);
    let mut out = Vec::with_capacity(payload.len());
    out.extend_from_slice(&payload[..start]);
    out.extend_from_slice(&block[..field_start]);
    // Same representation and name index; a raw (non-Huffman) value.
    let representation = block[field_start] & !(0xffu8 >> (8 - prefix_bits));
    encode_int(&mut out, representation, prefix_bits, AUTHORITY_INDEX);
    encode_int(&mut out, 0, 7, replacement.len() as u64);
    out.extend_from_slice(replacement);
    out.extend_from_slice(&block[field_end..]);
    out.extend_from_slice(&payload[end..]);
    Some(out)
}

/// Where a literal `:authority` field sits in a header block.
#[derive(Debug)]
struct AuthorityField {
    start: usize,
    end: usize,
    /// Width of the name-index prefix: 6 for incremental indexing, 4 otherwise.
    prefix_bits: u8,
    encoded_len: usize,
    huffman: bool,
}

/// Finds the first literal `:authority` field (name by static index 1) in a header block.
fn find_authority(block: &[u8]) -> Option<AuthorityField> {
    let mut pos = 0;
    while pos < block.len() {
        let first = block[pos];
        let field_start = pos;
        if first & 0x80 != 0 {
            // Indexed field: refers to an entry h2 already holds in rewritten form.
            decode_int(block, &mut pos, 7)?;
            continue;
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            decode_int(block, &mut pos, 5)?;
            continue;
        }
        // Literal: with incremental indexing (6-bit index), or without / never indexed (4-bit).
        let prefix_bits = if first & 0xc0 == 0x40 { 6 } else { 4 };
        let name_index = decode_int(block, &mut pos, prefix_bits)?;
        if name_index == 0 {
            skip_string(block, &mut pos)?;
        }
        let huffman = *block.get(pos)? & 0x80 != 0;
        let len = decode_int(block, &mut pos, 7)? as usize;
        let value_end = pos.checked_add(len)?;
        if value_end > block.len() {
            return None;
        }
        pos = value_end;
        if name_index == AUTHORITY_INDEX {
            return Some(AuthorityField {
                start: field_start,
                end: pos,
                prefix_bits,
                encoded_len: len,
                huffman,
            });
        }
    }
    None
}

fn skip_string(block: &[u8], pos: &mut usize) -> Option<()> {
    let len = decode_int(block, pos, 7)? as usize;
    *pos = pos.checked_add(len).filter(|end| *end <= block.len())?;
    Some(())
}

/// HPACK integer (RFC 7541 §5.1) with an N-bit prefix.
fn decode_int(block: &[u8], pos: &mut usize, prefix_bits: u8) -> Option<u64> {
    let mask = (1u16 << prefix_bits) as u8 - 1;
    let mut value = u64::from(*block.get(*pos)? & mask);
    *pos += 1;
    if value < u64::from(mask) {
        return Some(value);
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(*pos)?;
        *pos += 1;
        value = value.checked_add(u64::from(byte & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

fn encode_int(out: &mut Vec<u8>, high_bits: u8, prefix_bits: u8, value: u64) {
    let mask = ((1u16 << prefix_bits) - 1) as u64;
    if value < mask {
        out.push(high_bits | value as u8);
        return;
    }
    out.push(high_bits | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            match this.state {
                State::Passthrough(0) => this.state = State::FrameHeader,
                // Frame payloads go straight to the caller: no copy on the data path.
                State::Passthrough(left) => {
                    let room = left.min(buf.remaining());
                    // Zeroes only never-initialised memory; h2 reuses its read buffer.
                    let mut limited = ReadBuf::new(buf.initialize_unfilled_to(room));
                    ready!(Pin::new(&mut this.io).poll_read(cx, &mut limited))?;
                    let n = limited.filled().len();
                    buf.advance(n);
                    this.state = State::Passthrough(left - n);
                    return Poll::Ready(Ok(()));
                }
                // Preface, frame headers and HEADERS payloads: read exactly what parsing needs.
                _ => {
                    if this.input.len() >= this.needed() {
                        // An empty HEADERS frame needs no more bytes: reading zero bytes
                        // would look like the end of the stream.
                        this.process();
                        continue;
                    }
                    let mut chunk = [0u8; 4096];
                    let want = (this.needed() - this.input.len()).min(chunk.len());
                    let mut read = ReadBuf::new(&mut chunk[..want]);
                    ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
                    if read.filled().is_empty() {
                        // End of stream: hand over what is left and let h2 judge it,
                        // including the header of a HEADERS frame cut short.
                        if let State::Headers { header, .. } = this.state {
                            this.output.put_slice(&header);
                            this.state = State::FrameHeader;
                        }
                        let rest = this.input.split();
                        if rest.is_empty() && this.output.is_empty() {
                            return Poll::Ready(Ok(()));
                        }
                        this.output.put(rest);
                        continue;
                    }
                    this.input.extend_from_slice(read.filled());
                    this.process();
                }
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[tokio::test]
    async fn rewrites_literal_authority_and_keeps_everything_else() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        let path = b"%2Ftmp%2Fkonnectivity-server.socket";
        // :method POST (indexed 3), :authority literal with incremental indexing, raw value,
        // then a literal header with a new name.
        let mut block = vec![0x83, 0x41, path.len() as u8];
        block.extend_from_slice(path);
        block.extend_from_slice(&[0x40, 2, b'x', b'y', 1, b'z']);
        let mut input = preface.to_vec();
        input.extend(frame(0x4, 0, 0, &[]));
        input.extend(frame(HEADERS, 0x4, 1, &block));
        input.extend(frame(0x0, 0, 1, &[7u8; 40_000]));
        let mut reader = AuthorityRewrite::new(&input[..]);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();

        let mut expected_block = vec![0x83, 0x41, 9];
        expected_block.extend_from_slice(b"localhost");
        expected_block.extend_from_slice(&[0x40, 2, b'x', b'y', 1, b'z']);
        let mut expected = preface.to_vec();
        expected.extend(frame(0x4, 0, 0, &[]));
        expected.extend(frame(HEADERS, 0x4, 1, &expected_block));
        expected.extend(frame(0x0, 0, 1, &[7u8; 40_000]));
        assert_eq!(out, expected);
    }

    #[tokio::test]
    async fn garbage_passes_through_unchanged() {
        let input: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let mut reader = AuthorityRewrite::new(&input[..]);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), input.len());
    }

    #[test]
    fn hpack_integers_round_trip() {
        for value in [0u64, 1, 14, 15, 16, 62, 63, 64, 127, 128, 300, 1 << 20] {
            for bits in [4u8, 5, 6, 7] {
                let mut out = Vec::new();
                encode_int(&mut out, 0, bits, value);
                let mut pos = 0;
                assert_eq!(decode_int(&out, &mut pos, bits), Some(value));
                assert_eq!(pos, out.len());
            }
        }
    }
}

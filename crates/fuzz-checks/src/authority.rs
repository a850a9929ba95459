//! The HTTP/2 `:authority` rewrite in front of `h2`: [`tether_grpc::AuthorityRewrite`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tether_grpc::AuthorityRewrite;
use tokio::io::{AsyncRead, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;

/// The first byte picks the transport's chunk size and the reader's buffer size; the rest is
/// what a client sends (its first 24 bytes stand for the preface).
///
/// Invariants: the output never is longer than the input; chunking does not change it; the
/// rewrite is idempotent; every complete frame keeps its type, flags and stream, frames other
/// than HEADERS keep their payload byte for byte, and a HEADERS payload never grows.
pub fn check(data: &[u8]) {
    let Some((&sizes, input)) = data.split_first() else {
        return;
    };
    let output = rewrite(input, input.len().max(1), 16 * 1024);
    assert!(
        output.len() <= input.len(),
        "the rewrite lengthened the stream"
    );
    let chunk = usize::from(sizes & 0x0f) + 1;
    let buffer = usize::from(sizes >> 4) * 7 + 1;
    assert_eq!(
        rewrite(input, chunk, buffer),
        output,
        "chunks of {chunk} and reads of {buffer} changed the output"
    );
    assert_eq!(
        rewrite(&output, output.len().max(1), 16 * 1024),
        output,
        "rewriting twice changed the output"
    );
    compare_frames(input, &output);
}

/// Reads everything through the rewrite, the transport delivering at most `chunk` bytes
/// and the caller asking for at most `buffer` bytes per read.
fn rewrite(input: &[u8], chunk: usize, buffer: usize) -> Vec<u8> {
    let mut reader = AuthorityRewrite::new(Chunked { rest: input, chunk });
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    let mut buf = vec![0u8; buffer];
    // Each read returns at least one byte or ends the stream, so this loop is bounded.
    for _ in 0..=input.len() * 2 + 4 {
        let mut read = ReadBuf::new(&mut buf);
        match Pin::new(&mut reader).poll_read(&mut cx, &mut read) {
            Poll::Ready(Ok(())) if read.filled().is_empty() => return out,
            Poll::Ready(Ok(())) => out.extend_from_slice(read.filled()),
            Poll::Ready(Err(e)) => panic!("in-memory reads cannot fail: {e}"),
            Poll::Pending => panic!("in-memory reads are never pending"),
        }
    }
    panic!(
        "the rewrite did not reach the end of a {}-byte input",
        input.len()
    );
}

/// Walks the frames of both streams side by side.
fn compare_frames(input: &[u8], output: &[u8]) {
    if input.len() < PREFACE_LEN {
        assert_eq!(input, output, "a partial preface was changed");
        return;
    }
    assert_eq!(
        input[..PREFACE_LEN],
        output[..PREFACE_LEN],
        "the preface changed"
    );
    let (mut i, mut o) = (PREFACE_LEN, PREFACE_LEN);
    while let Some((header, payload)) = frame_at(input, i) {
        let Some((out_header, out_payload)) = frame_at(output, o) else {
            panic!("a complete input frame at {i} has no complete output frame");
        };
        assert_eq!(
            header[3..],
            out_header[3..],
            "type, flags or stream changed"
        );
        if header[3] == HEADERS {
            assert!(out_payload.len() <= payload.len(), "a HEADERS payload grew");
        } else {
            assert_eq!(payload, out_payload, "a non-HEADERS payload changed");
        }
        i += FRAME_HEADER_LEN + payload.len();
        o += FRAME_HEADER_LEN + out_payload.len();
    }
    assert_eq!(input[i..], output[o..], "a trailing partial frame changed");
}

/// The complete frame at `at`, if there is one.
fn frame_at(stream: &[u8], at: usize) -> Option<(&[u8], &[u8])> {
    let header = stream.get(at..at + FRAME_HEADER_LEN)?;
    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let start = at + FRAME_HEADER_LEN;
    let payload = stream.get(start..start + len)?;
    Some((header, payload))
}

/// An in-memory transport that delivers at most `chunk` bytes per read.
struct Chunked<'a> {
    rest: &'a [u8],
    chunk: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self.rest.len().min(self.chunk).min(buf.remaining());
        let (head, tail) = self.rest.split_at(n);
        buf.put_slice(head);
        self.rest = tail;
        Poll::Ready(Ok(()))
    }
}

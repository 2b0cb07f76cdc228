//! A gRPC server on a unix socket answers clients whose `:authority` is the socket path.
//!
//! h2, under hyper and tonic, builds each request's URI from its pseudo-headers and resets the
//! stream with `PROTOCOL_ERROR` when `:authority` is not a valid URI authority; it has no
//! option to relax that (hyperium/h2#487 has been open since 2020). Over a unix socket the
//! authority names nothing, and clients disagree on what to send: tonic, grpc-go and kubelets
//! since 1.26 send `localhost`; grpc-java, grpcurl and kubelets before 1.26 the socket path;
//! grpc-core (Python grpcio >= 1.57) the path percent-encoded.
//!
//! [`ServerConn`] sits between an accepted socket and h2 and reads the client's side of the
//! connection frame by frame, decoding every header block with its own HPACK decoder, which
//! follows the client's dynamic table. While every `:authority` is one h2 accepts, the bytes go
//! on unchanged. From the first header block with an `:authority` h2 would refuse, every block
//! is encoded afresh, that authority replaced by `localhost`, each field a literal that neither
//! uses nor changes h2's dynamic table (which from then on is never referred to). Other frames
//! and everything the server writes pass through as they are. Input that does not parse as
//! HTTP/2 goes on unchanged while nothing was rewritten, so h2 judges it as before; once
//! rewriting, the connection fails instead, as h2's table no longer matches the client's.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What replaces an `:authority` h2 would refuse.
const LOCALHOST: &[u8] = b"localhost";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEAD: usize = 9;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// Header blocks longer than this are not rewritten (far above h2's header list limit).
const MAX_BLOCK: usize = 1 << 20;
/// HPACK's default dynamic table size: tonic's h2 server does not advertise another one.
const TABLE_SIZE: usize = 4096;

/// An accepted unix-socket connection as h2 should see it: see the module documentation.
pub struct ServerConn<T> {
    inner: T,
    rewriter: Rewriter,
    /// Rewritten bytes not yet read by h2, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    scratch: Box<[u8]>,
}

impl<T> ServerConn<T> {
    /// Wraps an accepted connection.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; 8192].into_boxed_slice(),
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ServerConn<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.mode == Mode::Passthrough {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut scratch))?;
            if scratch.filled().is_empty() {
                // The end: bytes held back belong to a frame that never completed.
                return Poll::Ready(Ok(()));
            }
            this.rewriter
                .push(scratch.filled(), &mut this.out)
                .map_err(|Desync| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        "malformed HTTP/2 header block after an :authority was rewritten",
                    )
                })?;
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ServerConn<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for ServerConn<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Matching the client preface; holds how many bytes of it matched.
    Preface(usize),
    /// Parsing frames, passing them on unchanged.
    Verbatim,
    /// Parsing frames, encoding every header block afresh.
    Rewrite,
    /// Not HTTP/2 as expected, nothing rewritten yet: bytes pass unparsed.
    Passthrough,
}

/// Rewriting after h2's and the client's dynamic tables parted is impossible.
#[derive(Debug, PartialEq, Eq)]
struct Desync;

/// A header block being collected, from its HEADERS frame to END_HEADERS.
struct Block {
    stream: u32,
    /// The HEADERS frame's END_STREAM and PRIORITY flags; END_HEADERS once a frame set it.
    flags: u8,
    /// The HEADERS frame's priority fields, when PRIORITY is set.
    priority: Vec<u8>,
    fragment: Vec<u8>,
}

/// The client-to-server direction, without IO: bytes in, bytes for h2 out.
struct Rewriter {
    mode: Mode,
    decoder: Decoder<'static>,
    /// Payload bytes of the current frame (not part of a header block) still to pass on.
    passing: usize,
    /// The frame being read: its head, and for HEADERS or CONTINUATION its payload.
    frame: Vec<u8>,
    /// The complete frames of the open header block, as received.
    raw: Vec<u8>,
    block: Option<Block>,
}

impl Rewriter {
    fn new() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Self {
            mode: Mode::Preface(0),
            decoder,
            passing: 0,
            frame: Vec::new(),
            raw: Vec::new(),
            block: None,
        }
    }

    /// Takes the next bytes from the client, appends what h2 should read to `out`.
    fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), Desync> {
        loop {
            match self.mode {
                Mode::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                Mode::Preface(matched) => {
                    let n = input.len().min(PREFACE.len() - matched);
                    if input[..n] != PREFACE[matched..matched + n] {
                        self.mode = Mode::Passthrough;
                        continue;
                    }
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.mode = if matched + n == PREFACE.len() {
                        Mode::Verbatim
                    } else {
                        Mode::Preface(matched + n)
                    };
                }
                Mode::Verbatim | Mode::Rewrite => {}
            }
            if input.is_empty() {
                return Ok(());
            }
            if self.passing > 0 {
                let n = input.len().min(self.passing);
                out.extend_from_slice(&input[..n]);
                input = &input[n..];
                self.passing -= n;
                continue;
            }
            if self.frame.len() < FRAME_HEAD {
                input = fill(&mut self.frame, FRAME_HEAD, input);
                if self.frame.len() < FRAME_HEAD {
                    return Ok(());
                }
            }
            let head = &self.frame[..FRAME_HEAD];
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let kind = head[3];
            if !matches!(kind, HEADERS | CONTINUATION | PUSH_PROMISE) {
                if self.block.is_some() {
                    // Only CONTINUATION may follow a HEADERS without END_HEADERS.
                    self.give_up(out)?;
                    continue;
                }
                out.append(&mut self.frame);
                self.passing = len;
                continue;
            }
            if self.raw.len() + FRAME_HEAD + len > MAX_BLOCK {
                self.give_up(out)?;
                continue;
            }
            input = fill(&mut self.frame, FRAME_HEAD + len, input);
            if self.frame.len() < FRAME_HEAD + len {
                return Ok(());
            }
            if self.take_frame().is_none() {
                self.give_up(out)?;
                continue;
            }
            self.raw.append(&mut self.frame);
            if self
                .block
                .as_ref()
                .is_some_and(|b| b.flags & END_HEADERS != 0)
            {
                self.finish_block(out)?;
            }
        }
    }

    /// Adds the complete HEADERS or CONTINUATION frame in `self.frame` to the open block;
    /// `None` for a frame out of place or malformed. The block's END_HEADERS flag records
    /// whether this frame ended it.
    fn take_frame(&mut self) -> Option<()> {
        let (head, payload) = self.frame.split_at(FRAME_HEAD);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        match (kind, &mut self.block) {
            (HEADERS, None) => {
                let mut payload = payload;
                if flags & PADDED != 0 {
                    let (&pad, rest) = payload.split_first()?;
                    payload = rest.get(..rest.len().checked_sub(usize::from(pad))?)?;
                }
                let mut priority = Vec::new();
                if flags & PRIORITY != 0 {
                    let (fields, rest) = payload.split_at_checked(5)?;
                    priority.extend_from_slice(fields);
                    payload = rest;
                }
                self.block = Some(Block {
                    stream,
                    flags: flags & (END_STREAM | PRIORITY | END_HEADERS),
                    priority,
                    fragment: payload.to_vec(),
                });
                Some(())
            }
            (CONTINUATION, Some(block)) if block.stream == stream => {
                block.fragment.extend_from_slice(payload);
                block.flags |= flags & END_HEADERS;
                Some(())
            }
            _ => None,
        }
    }

    /// Decodes the complete block; passes it on as received or encoded afresh.
    fn finish_block(&mut self, out: &mut Vec<u8>) -> Result<(), Desync> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let mut fields = Vec::new();
        let mut refused = false;
        let decoded = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            let value = if &name[..] == b":authority"
                && http::uri::Authority::try_from(&value[..]).is_err()
            {
                refused = true;
                LOCALHOST.to_vec()
            } else {
                value.into_owned()
            };
            fields.push((name.into_owned(), value));
        });
        if decoded.is_err() {
            // h2 would refuse this block too (COMPRESSION_ERROR): let it, while it can.
            return self.give_up(out);
        }
        if self.mode == Mode::Verbatim && !refused {
            out.append(&mut self.raw);
            return Ok(());
        }
        self.mode = Mode::Rewrite;
        self.raw.clear();
        let mut encoded = Vec::new();
        for (name, value) in &fields {
            // Literal header field without indexing, new name (RFC 7541 section 6.2.2).
            encoded.push(0x00);
            for s in [name, value] {
                encoded.extend_from_slice(&loona_hpack::encoder::encode_integer(s.len(), 7));
                encoded.extend_from_slice(s);
            }
        }
        write_block(out, &block, &encoded);
        Ok(())
    }

    /// Input that is not HTTP/2 as expected: on unchanged while that is still safe.
    fn give_up(&mut self, out: &mut Vec<u8>) -> Result<(), Desync> {
        if self.mode == Mode::Rewrite {
            return Err(Desync);
        }
        out.append(&mut self.raw);
        out.append(&mut self.frame);
        self.block = None;
        self.mode = Mode::Passthrough;
        Ok(())
    }
}

/// Moves bytes from `input` into `buf` until it holds `want`; returns the rest of `input`.
fn fill<'a>(buf: &mut Vec<u8>, want: usize, input: &'a [u8]) -> &'a [u8] {
    let n = input.len().min(want.saturating_sub(buf.len()));
    buf.extend_from_slice(&input[..n]);
    &input[n..]
}

/// Writes `encoded` as the header block of `block`: a HEADERS frame, CONTINUATIONs as needed.
fn write_block(out: &mut Vec<u8>, block: &Block, encoded: &[u8]) {
    let first = (MAX_FRAME - block.priority.len()).min(encoded.len());
    let (head, mut rest) = encoded.split_at(first);
    let mut flags = block.flags & (END_STREAM | PRIORITY);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame_head(
        out,
        block.priority.len() + head.len(),
        HEADERS,
        flags,
        block.stream,
    );
    out.extend_from_slice(&block.priority);
    out.extend_from_slice(head);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        frame_head(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

fn frame_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
mod tests;

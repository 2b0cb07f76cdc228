//! A raw HTTP/2 client for unary gRPC calls over a unix socket (feature `h2`), whose header
//! fields the test writes as HPACK representations of its choice.
//!
//! Real gRPC clients differ in the `:authority` they send over a unix socket: tonic and
//! kubelets since 1.26 send `localhost`, grpc-java, grpcurl and kubelets before 1.26 the socket
//! path, grpc-core (Python grpcio >= 1.57) the percent-encoded path. No HTTP/2 client library
//! lets a test send an authority that is not a valid URI authority, so this one writes the
//! frames itself. It speaks only what a unary call needs: one request at a time, responses
//! smaller than the initial flow-control window.

use std::{io, path::Path};

use loona_hpack::Decoder;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// One HPACK field representation (RFC 7541 section 6), strings sent raw (no Huffman code).
#[derive(Clone, Copy, Debug)]
pub enum Field<'a> {
    /// Literal without indexing, literal name: the table is left alone.
    Literal(&'a str, &'a str),
    /// Literal with incremental indexing, literal name: added to the dynamic table.
    Indexing(&'a str, &'a str),
    /// Indexed field: an entry of the static (1..=61) or dynamic (62..) table.
    Indexed(usize),
}

/// The header fields of a gRPC request for `method` (`/package.Service/Method`), each a
/// literal without indexing, with `authority` as `:authority`.
pub fn grpc_request<'a>(authority: &'a str, method: &'a str) -> Vec<Field<'a>> {
    vec![
        Field::Literal(":method", "POST"),
        Field::Literal(":scheme", "http"),
        Field::Literal(":path", method),
        Field::Literal(":authority", authority),
        Field::Literal("content-type", "application/grpc"),
        Field::Literal("te", "trailers"),
    ]
}

/// Encodes `fields` as one header block.
pub fn encode(fields: &[Field<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in fields {
        match *field {
            Field::Literal(name, value) => {
                out.push(0x00);
                string(&mut out, name);
                string(&mut out, value);
            }
            Field::Indexing(name, value) => {
                out.push(0x40);
                string(&mut out, name);
                string(&mut out, value);
            }
            Field::Indexed(index) => integer(&mut out, 0x80, 7, index),
        }
    }
    out
}

fn string(out: &mut Vec<u8>, s: &str) {
    integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn integer(out: &mut Vec<u8>, flags: u8, prefix: u8, mut value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value % 0x80) as u8 | 0x80);
        value /= 0x80;
    }
    out.push(value as u8);
}

/// How a call ended.
#[derive(Debug)]
pub enum Outcome {
    /// The server answered: response headers, the body, the trailers.
    Reply(Reply),
    /// The server reset the stream with this HTTP/2 error code (1: PROTOCOL_ERROR).
    Reset(u32),
    /// The server closed the connection with this HTTP/2 error code.
    GoAway(u32),
}

/// A response.
#[derive(Debug, Default)]
pub struct Reply {
    /// The response header fields, pseudo-headers included.
    pub headers: Vec<(String, String)>,
    /// The body: gRPC length-prefixed messages.
    pub body: Vec<u8>,
    /// The trailer fields (empty for a trailers-only response).
    pub trailers: Vec<(String, String)>,
}

impl Reply {
    /// `grpc-status`, from the trailers or, in a trailers-only response, the headers.
    pub fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .iter()
            .chain(&self.headers)
            .find(|(n, _)| n == "grpc-status")
            .map(|(_, v)| v.as_str())
    }

    /// The first gRPC message of the body, without its 5-byte prefix.
    pub fn message(&self) -> Option<&[u8]> {
        let len = u32::from_be_bytes(self.body.get(1..5)?.try_into().ok()?) as usize;
        self.body.get(5..5 + len)
    }
}

/// One HTTP/2 connection to a unix socket.
pub struct Conn {
    io: UnixStream,
    decoder: Decoder<'static>,
}

impl Conn {
    /// Connects, sends the preface and empty settings.
    pub async fn connect(path: &Path) -> io::Result<Self> {
        let mut io = UnixStream::connect(path).await?;
        let mut hello = PREFACE.to_vec();
        frame(&mut hello, SETTINGS, 0, 0, &[]);
        io.write_all(&hello).await?;
        Ok(Self {
            io,
            decoder: Decoder::new(),
        })
    }

    /// Sends a request with `fields` and one message `message` on stream `stream` (odd,
    /// higher than the last), and reads until that stream ends.
    pub async fn unary(
        &mut self,
        stream: u32,
        fields: &[Field<'_>],
        message: &[u8],
    ) -> io::Result<Outcome> {
        let mut out = Vec::new();
        frame(&mut out, HEADERS, END_HEADERS, stream, &encode(fields));
        let mut body = vec![0];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        frame(&mut out, DATA, END_STREAM, stream, &body);
        self.io.write_all(&out).await?;

        let mut reply = Reply::default();
        let mut got_headers = false;
        loop {
            let (kind, flags, id, payload) = self.read_frame().await?;
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    let mut ack = Vec::new();
                    frame(&mut ack, SETTINGS, ACK, 0, &[]);
                    self.io.write_all(&ack).await?;
                }
                PING if flags & ACK == 0 => {
                    let mut pong = Vec::new();
                    frame(&mut pong, PING, ACK, 0, &payload);
                    self.io.write_all(&pong).await?;
                }
                GOAWAY => {
                    let code = payload.get(4..8).map_or(0, be32);
                    return Ok(Outcome::GoAway(code));
                }
                RST_STREAM if id == stream => {
                    return Ok(Outcome::Reset(payload.get(..4).map_or(0, be32)));
                }
                HEADERS => {
                    let fields = self.header_block(flags, payload).await?;
                    if id != stream {
                        continue;
                    }
                    if got_headers {
                        reply.trailers = fields;
                    } else {
                        reply.headers = fields;
                        got_headers = true;
                    }
                    if flags & END_STREAM != 0 {
                        return Ok(Outcome::Reply(reply));
                    }
                }
                DATA if id == stream => {
                    reply.body.extend_from_slice(unpad(flags, &payload)?);
                    if flags & END_STREAM != 0 {
                        return Ok(Outcome::Reply(reply));
                    }
                }
                _ => {}
            }
        }
    }

    /// Decodes a header block that starts with a HEADERS frame of `flags` and `payload`,
    /// reading its CONTINUATION frames.
    async fn header_block(
        &mut self,
        flags: u8,
        payload: Vec<u8>,
    ) -> io::Result<Vec<(String, String)>> {
        let mut fragment = unpad(flags, &payload)?;
        if flags & PRIORITY != 0 {
            fragment = fragment.get(5..).ok_or_else(|| bad("short PRIORITY"))?;
        }
        let mut block = fragment.to_vec();
        let mut end = flags & END_HEADERS != 0;
        while !end {
            let (kind, flags, _, payload) = self.read_frame().await?;
            if kind != CONTINUATION {
                return Err(bad("header block interrupted"));
            }
            block.extend_from_slice(&payload);
            end = flags & END_HEADERS != 0;
        }
        let fields = self
            .decoder
            .decode(&block)
            .map_err(|e| bad(&format!("HPACK: {e}")))?;
        Ok(fields
            .into_iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(&n).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect())
    }

    async fn read_frame(&mut self) -> io::Result<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.io.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let id = be32(&head[5..9]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.io.read_exact(&mut payload).await?;
        Ok((head[3], head[4], id, payload))
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn unpad(flags: u8, payload: &[u8]) -> io::Result<&[u8]> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let pad = *payload.first().ok_or_else(|| bad("short PADDED"))? as usize;
    payload
        .get(1..payload.len().saturating_sub(pad))
        .ok_or_else(|| bad("padding longer than the frame"))
}

fn be32(b: &[u8]) -> u32 {
    b.iter().take(4).fold(0, |acc, &x| acc << 8 | u32::from(x))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_follow_rfc7541_c1() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        integer(&mut out, 0, 5, 10);
        assert_eq!(out, [0x0a]);
        out.clear();
        integer(&mut out, 0, 5, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
    }

    #[test]
    fn encoded_blocks_decode_back() {
        let block = encode(&[
            Field::Indexing("x-a", "1"),
            Field::Literal(":authority", "/run/x.sock"),
            Field::Indexed(62),
            Field::Indexed(2),
        ]);
        let fields = Decoder::new().decode(&block).unwrap();
        let fields: Vec<(&[u8], &[u8])> = fields.iter().map(|(n, v)| (&n[..], &v[..])).collect();
        assert_eq!(
            fields,
            [
                (&b"x-a"[..], &b"1"[..]),
                (b":authority", b"/run/x.sock"),
                (b"x-a", b"1"),
                (b":method", b"GET"),
            ]
        );
    }
}

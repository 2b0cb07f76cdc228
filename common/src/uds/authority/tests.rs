use super::*;

mod fuzz;

/// The two header blocks Python grpcio 1.85.3 sent on one connection for two calls to
/// `unix:///tmp/capt/kubelet.sock`: literals entered in the dynamic table, then references to
/// them. The authority is `tmp%2Fcapt%2Fkubelet.sock`.
const GRPCIO_FIRST: &str = "40053a706174682c2f763162657461312e446576696365506c7567696e2f4765744\
46576696365506c7567696e4f7074696f6e73400a3a617574686f7269747919746d70253246636170742532466b75\
62656c65742e736f636b8386400c636f6e74656e742d74797065106170706c69636174696f6e2f6772706340027465\
08747261696c6572734014677270632d6163636570742d656e636f64696e67176964656e746974792c206465666c61\
74652c20677a6970400c677270632d74696d656f7574043339366d400a757365722d6167656e7430677270632d7079\
74686f6e2f312e38352e3320677270632d632f35382e302e3020286c696e75783b2063687474703229";
const GRPCIO_SECOND: &str = "c4c38386c2c1c0400c677270632d74696d656f7574043430316dbf";
/// RFC 7541 C.4: three requests, Huffman-coded, `:authority: www.example.com` indexed.
const RFC_C4: [&str; 3] = [
    "828684418cf1e3c2e5f23a6ba0ab90f4ff",
    "828684be5886a8eb10649cbf",
    "828785bf400a637573746f6d2d6b65798925a849e95bb8e8b4bf",
];
const CHUNKS: [usize; 5] = [1, 7, 9, 100, usize::MAX];

type Fields = Vec<(String, String)>;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame_head(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out
}

/// A client's side of a connection: the preface, empty settings, then `frames`.
fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    for f in frames {
        out.extend_from_slice(f);
    }
    out
}

/// Requests: each header block in one HEADERS frame, then a DATA frame ending the stream.
fn requests(blocks: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        let stream = 2 * n as u32 + 1;
        frames.push(frame(HEADERS, END_HEADERS, stream, block));
        frames.push(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0]));
    }
    frames
}

/// What h2 reads when the client writes `input` in pieces of `chunk` bytes.
fn rewrite(input: &[u8], chunk: usize) -> Result<Vec<u8>, Desync> {
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    for piece in input.chunks(chunk.min(input.len()).max(1)) {
        rewriter.push(piece, &mut out)?;
    }
    Ok(out)
}

/// The frames after the preface: (type, flags, stream, payload).
fn frames(bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut rest = bytes.strip_prefix(PREFACE).expect("preface");
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
        out.push((rest[3], rest[4], stream, rest[9..9 + len].to_vec()));
        rest = &rest[9 + len..];
    }
    out
}

/// The header lists a fresh HPACK decoder (h2's) reads from `bytes`.
fn header_lists(bytes: &[u8]) -> Vec<Fields> {
    let mut decoder = Decoder::new();
    let mut lists = Vec::new();
    let mut block = Vec::new();
    for (kind, flags, _, payload) in frames(bytes) {
        let mut fragment = &payload[..];
        if kind == HEADERS {
            if flags & PADDED != 0 {
                let pad = usize::from(fragment[0]);
                fragment = &fragment[1..fragment.len() - pad];
            }
            if flags & PRIORITY != 0 {
                fragment = &fragment[5..];
            }
        } else if kind != CONTINUATION {
            continue;
        }
        block.extend_from_slice(fragment);
        if flags & END_HEADERS != 0 {
            let fields = decoder.decode(&block).expect("h2 decodes the block");
            lists.push(
                fields
                    .into_iter()
                    .map(|(n, v)| {
                        let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
                        (s(n), s(v))
                    })
                    .collect(),
            );
            block.clear();
        }
    }
    lists
}

fn authority(fields: &Fields) -> &str {
    &fields.iter().find(|(n, _)| n == ":authority").unwrap().1
}

/// Every chunking gives h2 `expected`, or the input unchanged when it is `None`.
fn check(input: &[u8], expected: Option<&[Fields]>) {
    for chunk in CHUNKS {
        let out = rewrite(input, chunk).unwrap();
        match expected {
            None => assert_eq!(out, input, "chunks of {chunk}"),
            Some(lists) => assert_eq!(header_lists(&out), lists, "chunks of {chunk}"),
        }
    }
}

#[test]
fn valid_authorities_pass_byte_for_byte() {
    let blocks: Vec<_> = RFC_C4.iter().map(|b| hex(b)).collect();
    let input = connection(&requests(&blocks));
    check(&input, None);
    // A table size update at the start of a block is followed, not refused.
    let mut resized = vec![0x20];
    resized.extend(hex(RFC_C4[0]));
    check(&connection(&requests(&[resized])), None);
}

#[test]
fn grpcio_requests_reach_h2_with_localhost() {
    let input = connection(&requests(&[hex(GRPCIO_FIRST), hex(GRPCIO_SECOND)]));
    let clients = header_lists(&input);
    assert_eq!(authority(&clients[0]), "tmp%2Fcapt%2Fkubelet.sock");
    let mut expected = clients.clone();
    for fields in &mut expected {
        for (n, v) in fields.iter_mut() {
            if n == ":authority" {
                *v = "localhost".into();
            }
        }
    }
    assert_eq!(expected[1].len(), 9);
    check(&input, Some(&expected));
    // Frames other than HEADERS pass unchanged, in order.
    let out = rewrite(&input, usize::MAX).unwrap();
    let kinds: Vec<_> = frames(&out).iter().map(|f| (f.0, f.1, f.2)).collect();
    assert_eq!(
        kinds,
        [
            (0x4, 0, 0),
            (HEADERS, END_HEADERS, 1),
            (0x0, END_STREAM, 1),
            (HEADERS, END_HEADERS, 3),
            (0x0, END_STREAM, 3)
        ]
    );
}

#[test]
fn valid_blocks_then_a_path_then_references_to_both() {
    // C.4's first two blocks go on unchanged; grpcio's then change the client's table (and
    // C.4's third block refers to an index that is now grpcio's entry).
    let blocks = [
        hex(RFC_C4[0]),
        hex(RFC_C4[1]),
        hex(GRPCIO_FIRST),
        hex(GRPCIO_SECOND),
        hex(RFC_C4[2]),
        hex("be"), // the newest entry of the client's table, whatever it is
    ];
    let input = connection(&requests(&blocks));
    let clients = header_lists(&input);
    assert_eq!(authority(&clients[1]), "www.example.com");
    let mut expected = clients.clone();
    for fields in &mut expected {
        for (n, v) in fields.iter_mut() {
            if n == ":authority" && v.contains('%') {
                *v = "localhost".into();
            }
        }
    }
    assert_eq!(authority(&expected[1]), "www.example.com");
    assert_eq!(authority(&expected[3]), "localhost");
    check(&input, Some(&expected));
    let out = rewrite(&input, usize::MAX).unwrap();
    assert!(out.starts_with(&connection(&requests(&blocks[..2]))));
    assert_ne!(out, input);
}

#[test]
fn split_padded_prioritized_block_keeps_priority_and_end_stream() {
    let block = hex(GRPCIO_FIRST);
    let (a, b) = block.split_at(100);
    let mut first = vec![3]; // pad length
    first.extend_from_slice(&[0x80, 0, 0, 0, 15]); // exclusive, depends on 0, weight 16
    first.extend_from_slice(a);
    first.extend_from_slice(&[0; 3]);
    let input = connection(&[
        frame(HEADERS, END_STREAM | PADDED | PRIORITY, 1, &first),
        frame(CONTINUATION, 0, 1, &b[..50]),
        frame(CONTINUATION, END_HEADERS, 1, &b[50..]),
    ]);
    for chunk in CHUNKS {
        let out = rewrite(&input, chunk).unwrap();
        let f = frames(&out);
        assert_eq!(f.len(), 2, "settings and one HEADERS frame");
        let (kind, flags, stream, payload) = &f[1];
        assert_eq!(
            (*kind, *flags, *stream),
            (HEADERS, END_STREAM | PRIORITY | END_HEADERS, 1)
        );
        assert_eq!(payload[..5], [0x80, 0, 0, 0, 15]);
        let lists = header_lists(&out);
        assert_eq!(authority(&lists[0]), "localhost");
        assert_eq!(lists[0].len(), 9);
    }
}

#[test]
fn a_long_block_is_written_as_frames_of_16k() {
    let value = "v".repeat(40_000);
    let mut block = Vec::new();
    for (name, value) in [(":authority", "/run/x.sock"), ("x-long", &value)] {
        block.push(0x00);
        for s in [name, value] {
            block.extend(loona_hpack::encoder::encode_integer(s.len(), 7));
            block.extend_from_slice(s.as_bytes());
        }
    }
    let (a, b) = block.split_at(MAX_FRAME);
    let (b, c) = b.split_at(MAX_FRAME);
    let input = connection(&[
        frame(HEADERS, 0, 1, a),
        frame(CONTINUATION, 0, 1, b),
        frame(CONTINUATION, END_HEADERS, 1, c),
    ]);
    let out = rewrite(&input, 1000).unwrap();
    let f = frames(&out);
    let shape: Vec<_> = f.iter().map(|(k, fl, _, p)| (*k, *fl, p.len())).collect();
    let written = (1 + 1 + 10 + 1 + 9) + (1 + 1 + 6 + 4 + 40_000);
    assert_eq!(
        shape,
        [
            (0x4, 0, 0),
            (HEADERS, 0, MAX_FRAME),
            (CONTINUATION, 0, MAX_FRAME),
            (CONTINUATION, END_HEADERS, written - 2 * MAX_FRAME)
        ]
    );
    let lists = header_lists(&out);
    assert_eq!(
        lists[0],
        [
            (":authority".to_string(), "localhost".to_string()),
            ("x-long".to_string(), value)
        ]
    );
}

#[test]
fn not_http2_passes_unchanged() {
    check(b"GET / HTTP/1.1\r\nHost: /run/x.sock\r\n\r\n", None);
    check(b"PRI * HTTP/2.0\r\n\r\nXX", None);
}

#[test]
fn malformed_input_before_any_rewrite_passes_unchanged() {
    let grpcio = frame(HEADERS, END_HEADERS, 3, &hex(GRPCIO_FIRST));
    let cases = [
        // CONTINUATION without HEADERS.
        vec![frame(CONTINUATION, END_HEADERS, 1, &hex(RFC_C4[0]))],
        // A DATA frame inside a header block.
        vec![frame(HEADERS, 0, 1, &hex(RFC_C4[0])), frame(0x0, 0, 1, &[])],
        // An index past the end of the tables.
        vec![frame(HEADERS, END_HEADERS, 1, &[0xff, 0x00])],
        // A table size over the 4096 bytes h2 allows.
        vec![frame(HEADERS, END_HEADERS, 1, &[0x3f, 0xe2, 0x1f, 0x82])],
        // Padding longer than the frame.
        vec![frame(HEADERS, END_HEADERS | PADDED, 1, &[9, 0x82])],
        // A client's PUSH_PROMISE.
        vec![frame(PUSH_PROMISE, END_HEADERS, 1, &[0, 0, 0, 2, 0x82])],
    ];
    for mut frames in cases {
        // What follows is not rewritten either: h2 judges the connection as before.
        frames.push(grpcio.clone());
        check(&connection(&frames), None);
    }
}

#[test]
fn malformed_input_after_a_rewrite_fails_the_connection() {
    let grpcio = frame(HEADERS, END_HEADERS, 1, &hex(GRPCIO_FIRST));
    let cases = [
        frame(CONTINUATION, END_HEADERS, 3, &hex(RFC_C4[0])),
        frame(HEADERS, END_HEADERS, 3, &[0xff, 0x00]),
    ];
    for bad in cases {
        let input = connection(&[grpcio.clone(), bad]);
        for chunk in CHUNKS {
            assert_eq!(rewrite(&input, chunk), Err(Desync), "chunks of {chunk}");
        }
    }
}

#[tokio::test]
async fn server_conn_reads_rewritten_and_writes_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (client, server) = tokio::io::duplex(64);
    let mut conn = ServerConn::new(server);
    let input = connection(&requests(&[hex(GRPCIO_FIRST)]));
    let expected = rewrite(&input, usize::MAX).unwrap();
    let writer = tokio::spawn(async move {
        let mut client = client;
        client.write_all(&input).await.unwrap();
        let mut answer = [0; 5];
        client.read_exact(&mut answer).await.unwrap();
        answer
    });
    let mut got = vec![0; expected.len()];
    conn.read_exact(&mut got).await.unwrap();
    assert_eq!(got, expected);
    conn.write_all(b"hello").await.unwrap();
    assert_eq!(&writer.await.unwrap(), b"hello");
}

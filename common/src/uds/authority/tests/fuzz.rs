//! Property runs of the `:authority` rewriter over client connections: valid frame sequences
//! built here (HEADERS split into CONTINUATIONs, padding, priority, the client's dynamic table
//! used and referred to, authorities h2 accepts and refuses, other frames between), the same
//! and the captured connections with bytes mutated, and arbitrary bytes; each split at random
//! points across reads.
//!
//! For every input: no panic; the same output whatever the reads (or the same error after the
//! same bytes); the bytes held back never more than the input and one header block; the output
//! no larger than the input times the largest HPACK entry; and what h2 reads is the input with
//! only the refused `:authority` values replaced. Either it is the input, byte for byte (held
//! back: the frame not yet complete), or the same frames in the same order with every header
//! block decoding, for h2, to the client's fields with refused authorities made `localhost`.
//! An error comes only once something was rewritten, and nothing it could not parse was
//! passed on before it. For the valid sequences, the fields h2 reads are the ones generated.

use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use rdma_streams_testkit::fuzz;

use super::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Authorities h2 accepts and ones it refuses (the socket paths and spellings clients send).
const AUTHORITIES: &[&str] = &[
    "localhost",
    "www.example.com",
    "example.com:8080",
    "[::1]:50051",
    "10.0.0.1",
    "/run/rdma/kubelet.sock",
    "tmp%2Fcapt%2Fkubelet.sock",
    "unix:/var/lib/kubelet/device-plugins/kubelet.sock",
    "a b",
    "",
    "x@y@z",
];

const NAMES: &[&str] = &[
    "content-type",
    "te",
    "user-agent",
    "grpc-timeout",
    "x-custom",
    ":path",
    ":method",
];

/// Bytes worth splicing into a connection: frame heads (HEADERS, CONTINUATION, DATA, with and
/// without END_HEADERS), HPACK representations and the strings the rewriter looks for.
const TOKENS: &[&str] = &[
    "\0\0\0\u{1}\u{4}\0\0\0\u{1}",
    "\0\0\u{5}\u{1}\0\0\0\0\u{3}",
    "\0\0\0\u{9}\u{4}\0\0\0\u{1}",
    "\0\0\u{2}\u{9}\0\0\0\0\u{5}",
    "\0\0\u{1}\0\u{1}\0\0\0\u{1}",
    "\0\0\0\u{4}\0\0\0\0\0",
    "\u{7f}\u{7f}\u{7f}",
    "\0\u{a}:authority\u{b}/run/x.sock",
    "@\u{a}:authority\u{9}localhost",
    ":authority",
    "\u{3f}\u{7f}",
    "\u{20}",
    "\0",
    "\u{8}",
    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
];

/// One header field of a generated block and how it is encoded.
#[derive(Debug, Clone)]
enum Field {
    /// Literal, new name: without indexing (0x00), never indexed (0x10) or entered in the
    /// dynamic table (0x40).
    Literal(u8, String, String),
    /// A reference to the `n`th field entered so far (modulo their number; a literal when none).
    Indexed(usize),
}

/// One unit of a generated connection.
#[derive(Debug, Clone)]
enum Unit {
    /// A request's header block: a table size update first, the fields, where the block is
    /// cut into CONTINUATIONs, padding and priority on the HEADERS frame, END_STREAM.
    Block {
        resize: bool,
        fields: Vec<Field>,
        cuts: Vec<usize>,
        pad: Option<u8>,
        priority: bool,
        end_stream: bool,
    },
    /// Any other frame: type, flags, payload.
    Other(u8, u8, Vec<u8>),
}

fn field() -> impl Strategy<Value = Field> {
    let value = prop_oneof![
        3 => "[ -~]{0,24}",
        1 => "[a-z]{100,300}",
    ];
    prop_oneof![
        3 => (select(vec![0x00u8, 0x10, 0x40]), select(AUTHORITIES))
            .prop_map(|(kind, a)| Field::Literal(kind, ":authority".into(), a.into())),
        4 => (select(vec![0x00u8, 0x10, 0x40]), select(NAMES), value)
            .prop_map(|(kind, n, v)| Field::Literal(kind, n.into(), v)),
        3 => any::<usize>().prop_map(Field::Indexed),
    ]
}

fn unit() -> impl Strategy<Value = Unit> {
    prop_oneof![
        3 => (
            any::<bool>(),
            vec(field(), 0..8),
            vec(any::<usize>(), 0..3),
            proptest::option::of(0u8..12),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(resize, fields, cuts, pad, priority, end_stream)| Unit::Block {
                resize,
                fields,
                cuts,
                pad,
                priority,
                end_stream,
            }),
        2 => (
            select(vec![0x0u8, 0x3, 0x4, 0x6, 0x8, 0xa, 0xfa]),
            any::<u8>(),
            vec(any::<u8>(), 0..40),
        )
            .prop_map(|(kind, flags, payload)| Unit::Other(kind, flags, payload)),
    ]
}

/// The bytes of `units` after the preface, and the header lists h2 should read from them.
fn build(units: &[Unit]) -> (Vec<u8>, Vec<Fields>) {
    // The client's dynamic table as entered, newest last; never evicted (kept under 4096).
    let mut table: Vec<(String, String)> = Vec::new();
    let mut size = 0;
    let mut frames = Vec::new();
    let mut lists = Vec::new();
    let mut stream = 1;
    for unit in units {
        let (resize, fields, cuts, pad, priority, end_stream) = match unit {
            Unit::Other(kind, flags, payload) => {
                // Not a frame kind of a header block: those are the blocks' own.
                frames.push(frame(*kind, *flags, 0, payload));
                continue;
            }
            Unit::Block {
                resize,
                fields,
                cuts,
                pad,
                priority,
                end_stream,
            } => (resize, fields, cuts, pad, priority, end_stream),
        };
        let mut block = Vec::new();
        // A size update ends no block (loona-hpack and h2 refuse one alone).
        if *resize && !fields.is_empty() {
            block.extend_from_slice(&[0x3f, 0xe1, 0x1f]); // the size it has: 4096
        }
        let mut list = Vec::new();
        for f in fields {
            let (kind, name, value) = match f {
                Field::Indexed(n) if !table.is_empty() => {
                    let at = n % table.len();
                    // Index 62 is the newest entry.
                    let mut index = loona_hpack::encoder::encode_integer(62 + at, 7);
                    index[0] |= 0x80;
                    block.extend_from_slice(&index);
                    let (name, value) = table[table.len() - 1 - at].clone();
                    list.push((name, value));
                    continue;
                }
                Field::Indexed(_) => (0x00, "x-none".to_owned(), String::new()),
                Field::Literal(kind, name, value) => (*kind, name.clone(), value.clone()),
            };
            let entry = name.len() + value.len() + 32;
            let kind = if kind == 0x40 && size + entry > TABLE_SIZE {
                0x00
            } else {
                kind
            };
            if kind == 0x40 {
                table.push((name.clone(), value.clone()));
                size += entry;
            }
            block.push(kind);
            for s in [&name, &value] {
                block.extend(loona_hpack::encoder::encode_integer(s.len(), 7));
                block.extend_from_slice(s.as_bytes());
            }
            list.push((name, value));
        }
        for (name, value) in &mut list {
            if name == ":authority" && http::uri::Authority::try_from(value.as_str()).is_err() {
                *value = "localhost".into();
            }
        }
        lists.push(list);

        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (block.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([block.len()]) {
            pieces.push(&block[from..cut]);
            from = cut;
        }
        let last = pieces.len() - 1;
        for (i, piece) in pieces.into_iter().enumerate() {
            let ends = if i == last { END_HEADERS } else { 0 };
            if i > 0 {
                frames.push(frame(CONTINUATION, ends, stream, piece));
                continue;
            }
            let mut payload = Vec::new();
            let mut flags = ends;
            if *end_stream {
                flags |= END_STREAM;
            }
            if let Some(pad) = pad {
                flags |= PADDED;
                payload.push(*pad);
            }
            if *priority {
                flags |= PRIORITY;
                payload.extend_from_slice(&[0, 0, 0, 0, 15]);
            }
            payload.extend_from_slice(piece);
            payload.extend(std::iter::repeat_n(0, usize::from(pad.unwrap_or(0))));
            frames.push(frame(HEADERS, flags, stream, &payload));
        }
        stream += 2;
    }
    (connection(&frames), lists)
}

/// The captured and hand-made connections of the unit tests, to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let rfc: Vec<_> = RFC_C4.iter().map(|b| hex(b)).collect();
    let grpcio = [hex(GRPCIO_FIRST), hex(GRPCIO_SECOND)];
    let mixed = [
        rfc[0].clone(),
        grpcio[0].clone(),
        grpcio[1].clone(),
        rfc[2].clone(),
    ];
    let block = hex(GRPCIO_FIRST);
    let (a, b) = block.split_at(100);
    let mut first = vec![3];
    first.extend_from_slice(&[0x80, 0, 0, 0, 15]);
    first.extend_from_slice(a);
    first.extend_from_slice(&[0; 3]);
    vec![
        connection(&requests(&rfc)),
        connection(&requests(&grpcio)),
        connection(&requests(&mixed)),
        connection(&[
            frame(HEADERS, END_STREAM | PADDED | PRIORITY, 1, &first),
            frame(CONTINUATION, 0, 1, &b[..50]),
            frame(CONTINUATION, END_HEADERS, 1, &b[50..]),
            frame(0x0, END_STREAM, 1, b"data"),
        ]),
    ]
}

/// `input` cut at `cuts` (taken modulo its length), as the reads h2's side would see.
fn pieces(input: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut from = 0;
    for cut in cuts.into_iter().chain([input.len()]) {
        out.push(input[from..cut].to_vec());
        from = cut;
    }
    out
}

/// What the rewriter gives for `reads`: the bytes for h2, the error if any (pushing stops at
/// it, as the connection does). Checks the bound on what it holds back after each read.
fn run_reads(reads: &[Vec<u8>]) -> Result<(Vec<u8>, Result<(), Desync>), TestCaseError> {
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    let mut taken = 0;
    for read in reads {
        taken += read.len();
        let result = rewriter.push(read, &mut out);
        let held = rewriter.frame.len() + rewriter.raw.len();
        prop_assert!(held <= taken, "holds {held} bytes of {taken} read");
        prop_assert!(
            held <= MAX_BLOCK + FRAME_HEAD,
            "holds {held} bytes, more than a header block"
        );
        if result.is_err() {
            return Ok((out, result));
        }
    }
    Ok((out, Ok(())))
}

/// Splits `bytes` after the preface into frames: (type, flags, stream, payload, whole frame);
/// a last frame not complete is returned apart.
#[allow(
    clippy::type_complexity,
    reason = "a test helper's tuple, read where it is used"
)]
fn split_frames(bytes: &[u8]) -> (Vec<(u8, u8, u32, &[u8], &[u8])>, &[u8]) {
    let mut rest = &bytes[PREFACE.len().min(bytes.len())..];
    let mut out = Vec::new();
    while rest.len() >= FRAME_HEAD {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        if rest.len() < FRAME_HEAD + len {
            break;
        }
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        let (whole, tail) = rest.split_at(FRAME_HEAD + len);
        out.push((rest[3], rest[4], stream, &whole[FRAME_HEAD..], whole));
        rest = tail;
    }
    (out, rest)
}

/// A header block's fragment in a HEADERS frame's payload, and the priority fields.
fn fragment(flags: u8, payload: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut payload = payload;
    if flags & PADDED != 0 {
        let (&pad, rest) = payload.split_first()?;
        payload = rest.get(..rest.len().checked_sub(usize::from(pad))?)?;
    }
    if flags & PRIORITY != 0 {
        let (fields, rest) = payload.split_at_checked(5)?;
        return Some((rest, fields));
    }
    Some((payload, &[]))
}

/// A frame or a header block (HEADERS and its CONTINUATIONs).
#[derive(Debug)]
enum Piece<'a> {
    Frame(&'a [u8]),
    Block {
        stream: u32,
        end_stream: bool,
        priority: &'a [u8],
        fragment: Vec<u8>,
    },
}

/// A connection's pieces up to the first header block out of place or malformed (then
/// `malformed`), and the bytes of a last frame not complete.
struct Parsed<'a> {
    pieces: Vec<Piece<'a>>,
    malformed: bool,
    partial: &'a [u8],
}

fn parse(bytes: &[u8]) -> Parsed<'_> {
    let (frames, partial) = split_frames(bytes);
    let mut parsed = Parsed {
        pieces: Vec::new(),
        malformed: true,
        partial,
    };
    let mut open: Option<Piece<'_>> = None;
    for (kind, flags, stream, payload, whole) in frames {
        match (kind, &mut open) {
            (HEADERS, None) => {
                let Some((fragment, priority)) = fragment(flags, payload) else {
                    return parsed;
                };
                open = Some(Piece::Block {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    fragment: fragment.to_vec(),
                });
            }
            (
                CONTINUATION,
                Some(Piece::Block {
                    stream: s,
                    fragment,
                    ..
                }),
            ) if *s == stream => fragment.extend_from_slice(payload),
            (HEADERS | CONTINUATION | PUSH_PROMISE, _) | (_, Some(_)) => return parsed,
            (_, None) => {
                parsed.pieces.push(Piece::Frame(whole));
                continue;
            }
        }
        if flags & END_HEADERS != 0 {
            parsed.pieces.extend(open.take());
        }
    }
    // A block not ended is held back, as a frame not complete is.
    parsed.malformed = false;
    parsed
}

fn decode(decoder: &mut Decoder<'_>, fragment: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    decoder.decode(fragment).ok()
}

/// The output's properties against the input (module docs).
fn check_output(
    input: &[u8],
    out: &[u8],
    result: &Result<(), Desync>,
) -> Result<(), TestCaseError> {
    // Each field at most a 4 KiB table entry from one byte, re-encoded with a few bytes of
    // lengths, in frames of 16 KiB with 9-byte heads.
    prop_assert!(out.len() <= input.len() * (TABLE_SIZE + 64) + FRAME_HEAD);
    if input.starts_with(out) {
        // Nothing rewritten (a prefix: the rest is a frame not yet complete).
        prop_assert!(result.is_ok(), "an error though nothing was rewritten");
        return Ok(());
    }
    prop_assert!(out.starts_with(PREFACE) && input.starts_with(PREFACE));
    let sent = parse(input);
    let read = parse(out);
    prop_assert!(!read.malformed, "h2 reads a malformed connection");
    // The client's table, and h2's.
    let (mut client, mut h2) = (Decoder::new(), Decoder::new());
    let mut sent_pieces = sent.pieces.into_iter();
    for piece in &read.pieces {
        let Some(original) = sent_pieces.next() else {
            return Err(TestCaseError::fail(
                "a piece h2 reads that the client never sent",
            ));
        };
        match (piece, original) {
            (Piece::Frame(a), Piece::Frame(b)) => prop_assert_eq!(*a, b),
            (
                Piece::Block {
                    stream,
                    end_stream,
                    priority,
                    fragment,
                },
                Piece::Block {
                    stream: s,
                    end_stream: e,
                    priority: p,
                    fragment: f,
                },
            ) => {
                prop_assert_eq!((stream, end_stream, priority), (&s, &e, &p));
                let Some(mut expected) = decode(&mut client, &f) else {
                    return Err(TestCaseError::fail("passed on a block it could not decode"));
                };
                for (name, value) in &mut expected {
                    if name == b":authority" && http::uri::Authority::try_from(&value[..]).is_err()
                    {
                        *value = LOCALHOST.to_vec();
                    }
                }
                prop_assert_eq!(decode(&mut h2, fragment), Some(expected));
            }
            (a, b) => return Err(TestCaseError::fail(format!("{a:?} in place of {b:?}"))),
        }
    }
    // A frame not complete is only the start of one passed through as it comes.
    if !read.partial.is_empty() {
        prop_assert!(result.is_ok());
        prop_assert!(read.partial.len() >= FRAME_HEAD);
        prop_assert!(!matches!(
            read.partial[3],
            HEADERS | CONTINUATION | PUSH_PROMISE
        ));
        let original = match sent_pieces.next() {
            Some(Piece::Frame(b)) => b,
            Some(other) => return Err(TestCaseError::fail(format!("part of {other:?}"))),
            None => sent.partial,
        };
        prop_assert!(original.starts_with(read.partial));
    }
    Ok(())
}

/// The whole run for one input and one way to read it.
fn check(input: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, Result<(), Desync>), TestCaseError> {
    let whole = run_reads(&[input.to_vec()])?;
    let split = run_reads(&pieces(input, cuts))?;
    prop_assert_eq!(&split, &whole, "reads at {:?}", cuts);
    check_output(input, &whole.0, &whole.1)?;
    Ok(whole)
}

#[test]
fn valid_connections_reach_h2_with_only_refused_authorities_replaced() {
    fuzz::run(
        "authority rewriter, valid connections",
        2_000,
        LIMIT,
        || (vec(unit(), 0..10), vec(any::<usize>(), 0..6)),
        |(units, cuts)| {
            let (input, lists) = build(&units);
            let (out, result) = check(&input, &cuts)?;
            prop_assert_eq!(result, Ok(()));
            prop_assert_eq!(header_lists(&out), lists);
            // Frames other than header blocks, in order, as sent.
            let others = |bytes: &[u8]| -> Vec<Vec<u8>> {
                split_frames(bytes)
                    .0
                    .into_iter()
                    .filter(|f| !matches!(f.0, HEADERS | CONTINUATION))
                    .map(|f| f.4.to_vec())
                    .collect()
            };
            prop_assert_eq!(others(&out), others(&input));
            if !lists_refuse(&input) {
                prop_assert_eq!(out, input, "nothing to rewrite: byte for byte");
            }
            Ok(())
        },
    );
}

/// Whether a client's header block (in its own table's terms) holds an `:authority` h2 refuses.
fn lists_refuse(input: &[u8]) -> bool {
    let mut decoder = Decoder::new();
    parse(input).pieces.iter().any(|p| match p {
        Piece::Block { fragment, .. } => decode(&mut decoder, fragment).is_some_and(|fields| {
            fields
                .iter()
                .any(|(n, v)| n == b":authority" && http::uri::Authority::try_from(&v[..]).is_err())
        }),
        Piece::Frame(_) => false,
    })
}

#[test]
fn mutated_connections_are_rewritten_or_refused_never_forwarded_unparsed() {
    fuzz::run(
        "authority rewriter, mutated connections",
        3_000,
        LIMIT,
        || {
            let generated = vec(unit(), 1..8).prop_map(|units| build(&units).0);
            let captured = fuzz::mutated(seeds(), TOKENS);
            (
                prop_oneof![
                    captured,
                    generated.prop_flat_map(|bytes| fuzz::mutated(vec![bytes], TOKENS)),
                ],
                vec(any::<usize>(), 0..8),
            )
        },
        |(input, cuts)| check(&input, &cuts).map(drop),
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    fuzz::run(
        "authority rewriter, arbitrary bytes",
        3_000,
        LIMIT,
        || {
            let after_preface = vec(any::<u8>(), 0..600).prop_map(|tail| {
                let mut input = PREFACE.to_vec();
                input.extend(tail);
                input
            });
            (
                prop_oneof![vec(any::<u8>(), 0..600), after_preface],
                vec(any::<usize>(), 0..8),
            )
        },
        |(input, cuts)| check(&input, &cuts).map(drop),
    );
}

#[test]
fn a_block_past_the_limit_is_held_no_further() {
    // A header block of 2 MiB in 16 KiB frames: passed on unparsed before any rewrite, a
    // failed connection after one; never held whole.
    let mut frames = Vec::new();
    let chunk = vec![0u8; MAX_FRAME];
    frames.push(frame(HEADERS, 0, 1, &chunk));
    for _ in 0..(2 << 20) / MAX_FRAME {
        frames.push(frame(CONTINUATION, 0, 1, &chunk));
    }
    let plain = connection(&frames);
    let reads = pieces(&plain, &[1000, 70_000, 1 << 20]);
    let (out, result) = run_reads(&reads).unwrap();
    assert_eq!((out.len(), result), (plain.len(), Ok(())));
    assert_eq!(out, plain);

    let mut after = vec![frame(HEADERS, END_HEADERS, 1, &hex(GRPCIO_FIRST))];
    after.extend(frames.iter().map(|f| {
        let mut f = f.clone();
        f[8] = 3; // stream 3
        f
    }));
    let input = connection(&after);
    let (_, result) = run_reads(&pieces(&input, &[1000, 70_000, 1 << 20])).unwrap();
    assert_eq!(result, Err(Desync));

    // A frame head announcing 16 MiB, and a few bytes of it.
    let mut huge = connection(&[]);
    huge.extend_from_slice(&[0xff, 0xff, 0xff, HEADERS, 0, 0, 0, 0, 1, 0x82, 0x86]);
    let (out, result) = run_reads(&[huge.clone()]).unwrap();
    assert_eq!((out, result), (huge, Ok(())));
}

//! curl fetching from `python3 -m http.server`, both under the shim with the default provider
//! (the real librdmacm; no RDMA device here): byte-identical, NO_DEVICE on both sides, silent.

mod common;

use std::ffi::OsString;
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

#[test]
fn curl_and_http_server_under_the_shim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let work = dir.path();
    let data: Vec<u8> = {
        // 20 MiB of pseudo-random bytes (xorshift: fast, incompressible enough).
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..20 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[3]
            })
            .collect()
    };
    std::fs::create_dir(work.join("www")).expect("mkdir");
    std::fs::write(work.join("www/blob.bin"), &data).expect("write blob");
    let script = format!(
        "{WAIT_PORT}
cd \"$W/www\"
STREAMSHIM_STATS=\"$W/srv-%p.json\" LD_PRELOAD=\"$SHIM\" \"$PY\" -m http.server --bind 127.0.0.1 8080 \
  >\"$W/srv.out\" 2>\"$W/srv.err\" &
srv=$!
wait_port 8080
STREAMSHIM_STATS=\"$W/cli-%p.json\" LD_PRELOAD=\"$SHIM\" curl -sS -o \"$W/got.bin\" \
  http://127.0.0.1:8080/blob.bin 2>\"$W/cli.err\"
kill -INT $srv
wait $srv
"
    );
    netns(
        &script,
        &[("W", OsString::from(work))],
        Duration::from_secs(60),
    );
    let got = std::fs::read(work.join("got.bin")).expect("curl output");
    assert_eq!(got.len(), data.len());
    assert_eq!(
        Sha256::digest(&got),
        Sha256::digest(&data),
        "sha256 differs"
    );

    let cli = one_stats(work, "cli-");
    assert_counts(&cli, "client", "NO_DEVICE", 1);
    assert_no_counts(&cli, "server");
    let srv = one_stats(work, "srv-");
    assert_counts(&srv, "server", "NO_DEVICE", 1);
    assert_no_counts(&srv, "client");

    // Silent by default: curl's stderr is empty; the server's holds only its access log.
    let cli_err = std::fs::read_to_string(work.join("cli.err")).expect("cli.err");
    assert_eq!(cli_err, "", "curl stderr");
    let srv_err = std::fs::read_to_string(work.join("srv.err")).expect("srv.err");
    for line in srv_err.lines() {
        assert!(
            line.contains("\"GET /blob.bin HTTP/1.1\" 200"),
            "unexpected server stderr line {line:?}\n{srv_err}"
        );
    }
    assert!(!srv_err.contains("streamshim"), "{srv_err}");
}

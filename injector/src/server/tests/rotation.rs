//! Certificate rotation without a restart: the kubelet `..data` swap (twice in a row), broken
//! pairs keeping the last good one, and files rewritten in place.

use std::time::Duration;

use http::StatusCode;

use super::{
    FixedPatch, fixtures,
    support::{Pki, Proto, serial_hex, start, within},
};
use crate::server::CertReloader;

#[tokio::test]
async fn kubelet_symlink_swaps_are_served_at_the_next_handshake() {
    within(async {
        let mut server = start(FixedPatch::new(), |_| {}).await;
        let client = server.client();
        assert_eq!(client.served_serial().await, serial_hex(1001));

        // Two swaps in a row: file-watch based reloaders typically miss the second one.
        for serial in [1002, 1003] {
            let leaf = server.pki.leaf(serial);
            server.secret.swap(&leaf.cert_pem, &leaf.key_pem);
            assert_eq!(
                client.served_serial().await,
                serial_hex(serial),
                "after swap to {serial}"
            );
            let reply = client
                .post(Proto::Http2, "/mutate", fixtures::POD_CREATE_CONTROLLER)
                .await;
            assert_eq!(reply.status, StatusCode::OK);
        }
        let state = server.tls.state();
        assert_eq!(state.reloads, 2);
        assert_eq!(state.failures, 0);
        assert_eq!(state.serial.as_deref(), Some(serial_hex(1003).as_str()));
        assert!(state.loaded);
        server.shutdown.cancel();
    })
    .await;
}

#[tokio::test]
async fn broken_pairs_keep_the_last_good_one() {
    within(async {
        let mut server = start(FixedPatch::new(), |_| {}).await;
        let client = server.client();
        let good = server.pki.leaf(2001);
        server.secret.swap(&good.cert_pem, &good.key_pem);
        assert_eq!(client.served_serial().await, serial_hex(2001));

        // Not PEM.
        server.secret.swap("garbage\n", &good.key_pem);
        assert_eq!(client.served_serial().await, serial_hex(2001));
        assert_eq!(server.tls.state().failures, 1);
        // Counted once, not at every handshake.
        assert_eq!(client.served_serial().await, serial_hex(2001));
        assert_eq!(server.tls.state().failures, 1);

        // A certificate with another certificate's key.
        let other = server.pki.leaf(2002);
        server.secret.swap(&other.cert_pem, &good.key_pem);
        assert_eq!(client.served_serial().await, serial_hex(2001));
        assert_eq!(server.tls.state().failures, 2);

        // An empty key file, as a half-finished write would leave it.
        server.secret.swap(&other.cert_pem, "");
        assert_eq!(client.served_serial().await, serial_hex(2001));
        assert_eq!(server.tls.state().failures, 3);

        // Requests keep working throughout, and the next good pair is picked up.
        let reply = client
            .post(Proto::Http1, "/mutate", fixtures::POD_CREATE_CONTROLLER)
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        let next = server.pki.leaf(2003);
        server.secret.swap(&next.cert_pem, &next.key_pem);
        assert_eq!(client.served_serial().await, serial_hex(2003));
        let state = server.tls.state();
        assert_eq!((state.reloads, state.failures), (2, 3));
        server.shutdown.cancel();
    })
    .await;
}

#[tokio::test]
async fn vanished_files_keep_the_loaded_pair() {
    within(async {
        let server = start(FixedPatch::new(), |_| {}).await;
        let client = server.client();
        std::fs::remove_file(server.secret.path().join("..data")).expect("remove ..data");
        assert_eq!(client.served_serial().await, serial_hex(1001));
        assert_eq!(server.tls.state().failures, 0);
        server.shutdown.cancel();
    })
    .await;
}

#[test]
fn plain_files_rewritten_in_place_are_reloaded() {
    let pki = Pki::new("root");
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = pki.leaf(3001);
    std::fs::write(&cert, &first.cert_pem).expect("write");
    std::fs::write(&key, &first.key_pem).expect("write");
    let reloader = CertReloader::load(&cert, &key).expect("loads");
    assert_eq!(reloader.state().serial, Some(serial_hex(3001)));

    // The certificate lands before its key: a mismatch, rejected, the old pair stays.
    let second = pki.leaf(3002);
    std::thread::sleep(Duration::from_millis(10));
    std::fs::write(&cert, &second.cert_pem).expect("write");
    assert_eq!(reloader.state().serial, Some(serial_hex(3001)));
    assert_eq!(reloader.state().failures, 1);
    // Then the key: the pair is complete and loads.
    std::fs::write(&key, &second.key_pem).expect("write");
    let state = reloader.state();
    assert_eq!(state.serial, Some(serial_hex(3002)));
    assert_eq!((state.reloads, state.failures), (1, 1));
    assert!(state.not_after.is_some());
}

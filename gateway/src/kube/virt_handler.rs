//! The local virt-handler's addresses, read inside its network namespace and handed to the
//! node publisher, which writes them as [`super::VIRT_HANDLER_ADDRESSES_ANNOTATION`]. A peer
//! gateway maps a migration's `targetNodeAddress` to this node with them when it did not learn
//! the target node from the VMI (a VMI status without `targetNode`).
//!
//! The namespace is located again at every refresh (virt-handler restarts with a new pod IP);
//! while it cannot be read, the last addresses read stay published.

use std::{net::IpAddr, sync::Arc, time::Duration};

use rdma_streams_common::report::Report;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::capture::addresses::{AddressError, addresses_in};
use crate::capture::netns::NetnsLocator;

/// How often the addresses are read again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// Reads the addresses every `refresh` ([`REFRESH`] in the gateway) and sends them when they
/// change, until `shutdown`.
pub async fn watch_addresses(
    locator: Arc<dyn NetnsLocator>,
    tx: watch::Sender<Vec<IpAddr>>,
    refresh: Duration,
    shutdown: CancellationToken,
) {
    let mut last_error: Option<String> = None;
    loop {
        let locator = locator.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<Vec<IpAddr>, AddressError> {
            addresses_in(&locator.locate()?)
        })
        .await;
        match read {
            Ok(Ok(addrs)) => {
                last_error = None;
                if *tx.borrow() != addrs {
                    info!(addresses = ?addrs, "virt-handler addresses");
                    tx.send_replace(addrs);
                }
            }
            Ok(Err(error)) => {
                // Once per distinct error; the last addresses stay published.
                let text = Report(&error).to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    warn!(error = %text, "cannot read the virt-handler addresses; keeping the last ones");
                    last_error = Some(text);
                }
            }
            Err(error) => warn!(error = %Report(&error), "virt-handler address task failed"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(refresh) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, time::Instant};

    use super::*;
    use crate::capture::{
        addresses::reachable,
        netns::{NetnsError, PathLocator},
    };
    use crate::testing::TestNetns as Namespace;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn only_addresses_other_nodes_can_reach() {
        for bad in [
            "127.0.0.1",
            "::1",
            "0.0.0.0",
            "::",
            "169.254.3.4",
            "fe80::1",
            "ff02::1",
        ] {
            assert!(!reachable(ip(bad)), "{bad}");
        }
        for good in ["10.244.1.5", "192.168.50.12", "fd00::5", "2001:db8::1"] {
            assert!(reachable(ip(good)), "{good}");
        }
    }

    #[test]
    fn reads_the_addresses_inside_the_namespace() {
        let ns = Namespace::start();
        // The IPv6 address may take a moment to be listed after `ip addr add`.
        let deadline = Instant::now() + Duration::from_secs(5);
        let want = vec![ip("10.9.0.5"), ip("fd00:9::5")];
        let mut got = addresses_in(&ns.path()).unwrap();
        while got != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            got = addresses_in(&ns.path()).unwrap();
        }
        assert_eq!(got, want);
    }

    #[test]
    fn a_missing_namespace_is_an_error() {
        assert!(matches!(
            addresses_in(Path::new("/nonexistent/ns/net")),
            Err(AddressError::Netns(NetnsError::Open { .. }))
        ));
    }

    #[test]
    fn watch_sends_the_addresses_and_keeps_them_when_the_namespace_goes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let refresh = Duration::from_millis(100);
        runtime.block_on(async {
            let ns = Namespace::start();
            let (tx, mut rx) = watch::channel(Vec::new());
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(watch_addresses(
                Arc::new(PathLocator(ns.path())),
                tx,
                refresh,
                shutdown.clone(),
            ));
            tokio::time::timeout(Duration::from_secs(10), rx.changed())
                .await
                .expect("addresses within a refresh")
                .unwrap();
            assert!(rx.borrow_and_update().contains(&ip("10.9.0.5")));
            drop(ns);
            // Two refreshes without the namespace: nothing sent, the last addresses stay.
            tokio::time::sleep(refresh * 3).await;
            assert!(!rx.has_changed().unwrap());
            assert!(rx.borrow().contains(&ip("10.9.0.5")));
            shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("ends on shutdown")
                .unwrap();
        });
    }
}

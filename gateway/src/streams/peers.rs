//! Where the peer gateway of a target address is.

use std::{collections::HashMap, net::IpAddr, net::SocketAddr, str::FromStr};

/// Maps a target virt-handler's migration address to the RDMA stream address (`--listen`) of
/// the gateway on the same node. The kube side implements it from node annotations;
/// [`StaticPeers`] serves the CLI (`--peer`) and tests.
pub trait PeerLookup: Send + Sync + 'static {
    /// The peer gateway for `target`, or `None` (the connection then goes over TCP, reason
    /// `NO_PEER`).
    fn lookup(&self, target: IpAddr) -> Option<SocketAddr>;
}

/// A fixed map.
#[derive(Debug, Clone, Default)]
pub struct StaticPeers(HashMap<IpAddr, SocketAddr>);

impl StaticPeers {
    pub fn new(entries: impl IntoIterator<Item = PeerEntry>) -> StaticPeers {
        StaticPeers(entries.into_iter().map(|e| (e.target, e.gateway)).collect())
    }
}

impl PeerLookup for StaticPeers {
    fn lookup(&self, target: IpAddr) -> Option<SocketAddr> {
        self.0.get(&target).copied()
    }
}

/// One `--peer TARGET_IP=GATEWAY_IP:PORT` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerEntry {
    pub target: IpAddr,
    pub gateway: SocketAddr,
}

impl FromStr for PeerEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<PeerEntry, String> {
        let (target, gateway) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected TARGET_IP=GATEWAY_IP:PORT"))?;
        Ok(PeerEntry {
            target: target
                .trim()
                .parse()
                .map_err(|e| format!("{target:?}: {e}"))?,
            gateway: gateway
                .trim()
                .parse()
                .map_err(|e| format!("{gateway:?}: {e}"))?,
        })
    }
}

/// Asks each directory in turn (explicit `--peer` entries first, then the cluster's).
pub struct ChainedPeers(pub Vec<std::sync::Arc<dyn PeerLookup>>);

impl PeerLookup for ChainedPeers {
    fn lookup(&self, target: IpAddr) -> Option<SocketAddr> {
        self.0.iter().find_map(|d| d.lookup(target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_looks_up() {
        let e: PeerEntry = "10.2.0.2=198.18.0.2:7471".parse().unwrap();
        let peers = StaticPeers::new([e]);
        assert_eq!(
            peers.lookup("10.2.0.2".parse().unwrap()),
            Some("198.18.0.2:7471".parse().unwrap())
        );
        assert_eq!(peers.lookup("10.2.0.3".parse().unwrap()), None);
        assert!("10.2.0.2".parse::<PeerEntry>().is_err());
        assert!("x=198.18.0.2:1".parse::<PeerEntry>().is_err());
    }
}

//! Why a captured connection went over TCP instead of an RDMA stream.

use std::fmt;

/// The reason a connection was relayed over TCP (metric label `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// No peer gateway is known for the target address.
    NoPeer,
    /// librdmacm or libibverbs (`--provider`) could not be loaded.
    NoProvider,
    /// The libraries load but no RDMA device is usable (probed once at start: none, iWARP
    /// only, or registered memory not fork-safe), or none is on the route to the peer.
    NoDevice,
    /// The peer refused the stream: its gateway answered no (unknown migration, destination
    /// unreachable or not on its node, too many challenges pending, an older gateway), its
    /// engine did (pinned memory, resources), or nothing of ours listens at its address.
    PeerRefused,
    /// The stream was not established, with the peer's answer, within `--stream-timeout-ms`.
    Timeout,
    /// Any other failure before the stream carried a byte (a local verbs or CM error, the
    /// engine could not start, an accept that is not a gateway's).
    RdmaError,
    /// No peer key: this gateway has none (no `--peer-keys-file`, or the file has not
    /// appeared yet), or the peer said it has none. Streams are opened and accepted only
    /// between gateways that authenticate each other.
    NoPeerKey,
    /// The gateways did not authenticate each other: the peer refused our proof (no key in
    /// common, or the challenge expired), or its accept did not prove it holds one of our keys.
    PeerAuthFailed,
}

impl Fallback {
    /// Every reason, for pre-registering metric labels.
    pub const ALL: [Fallback; 8] = [
        Fallback::NoPeer,
        Fallback::NoProvider,
        Fallback::NoDevice,
        Fallback::PeerRefused,
        Fallback::Timeout,
        Fallback::RdmaError,
        Fallback::NoPeerKey,
        Fallback::PeerAuthFailed,
    ];

    /// Stable upper-case name, in the style of the shim's `Reason`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Fallback::NoPeer => "NO_PEER",
            Fallback::NoProvider => "NO_PROVIDER",
            Fallback::NoDevice => "NO_DEVICE",
            Fallback::PeerRefused => "PEER_REFUSED",
            Fallback::Timeout => "TIMEOUT",
            Fallback::RdmaError => "RDMA_ERROR",
            Fallback::NoPeerKey => "NO_PEER_KEY",
            Fallback::PeerAuthFailed => "PEER_AUTH_FAILED",
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

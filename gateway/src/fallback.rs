//! Why a captured connection went over TCP instead of an RDMA stream.

use std::fmt;

/// The reason a connection was relayed over TCP (metric label `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// No peer gateway is known for the target address.
    NoPeer,
    /// The rsocket provider library could not be loaded.
    NoProvider,
    /// The provider is loaded but no RDMA device is usable (`rsocket()` failed).
    NoDevice,
    /// The peer gateway refused the stream (nothing listening, or it answered "no").
    PeerRefused,
    /// The stream was not connected and confirmed within the connect timeout.
    Timeout,
    /// Any other rsocket failure before the first byte.
    RdmaError,
}

impl Fallback {
    /// Every reason, for pre-registering metric labels.
    pub const ALL: [Fallback; 6] = [
        Fallback::NoPeer,
        Fallback::NoProvider,
        Fallback::NoDevice,
        Fallback::PeerRefused,
        Fallback::Timeout,
        Fallback::RdmaError,
    ];

    /// Stable upper-case name, in the style of `transport::reason::Reason`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Fallback::NoPeer => "NO_PEER",
            Fallback::NoProvider => "NO_PROVIDER",
            Fallback::NoDevice => "NO_DEVICE",
            Fallback::PeerRefused => "PEER_REFUSED",
            Fallback::Timeout => "TIMEOUT",
            Fallback::RdmaError => "RDMA_ERROR",
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

//! Fault injection: the `FAKE_RSOCKET_FAULTS` comma list.

use std::time::Duration;

/// Faults the fake provider injects, parsed once per process from `FAKE_RSOCKET_FAULTS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Faults {
    /// `nodev`: `rsocket()` fails with `ENODEV`, as librdmacm does without an RDMA device.
    pub nodev: bool,
    /// `enomem`: `rsocket()` fails with `ENOMEM` (memlock limit too low to register buffers).
    pub enomem: bool,
    /// `refuse`: `rconnect()` fails with `ECONNREFUSED` (no rsocket listener at the peer).
    pub refuse: bool,
    /// `slow_connect=MS`: `rconnect()` sleeps this long first (address and route resolution).
    pub slow_connect: Option<Duration>,
    /// `hang_connect`: `rconnect()` never completes. Blocking: waits for the
    /// `FAKE_RSOCKET_HANG_MS` cap, then `ETIMEDOUT`; non-blocking: `EINPROGRESS` and the socket
    /// never becomes writable.
    pub hang_connect: bool,
    /// `eagain_storm=N`: the first N data calls (`rrecv`, `rsend` and their variants) on each
    /// r-fd fail with `EAGAIN`, even on blocking sockets: a hostile provider.
    pub eagain_storm: u64,
    /// `reset_after=BYTES`: once a connection has carried BYTES (both directions added up), it
    /// is reset (`SO_LINGER` 0 and close underneath); later calls fail with `ECONNRESET`.
    pub reset_after: Option<u64>,
    /// `poll_never_wakes`: `rpoll`/`rselect` never report readiness for r-fds, only timeouts
    /// (ordinary fds in the same call still wake it).
    pub poll_never_wakes: bool,
    /// `slow_send=MS@K`: the K-th send call (counting from 1) on each r-fd sleeps MS first: a
    /// process stalled at one step of a protocol (for the shim's handshake: a client's second
    /// send is its CONFIRM, an accepted socket's first its ACCEPT).
    pub slow_send: Option<(Duration, u64)>,
}

impl Faults {
    /// Parses a comma list such as `nodev,slow_connect=50,reset_after=4096`.
    ///
    /// Unknown names and malformed values are ignored without a word: a test double loaded
    /// into arbitrary programs must not print.
    pub fn parse(spec: &str) -> Faults {
        let mut faults = Faults::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = match item.split_once('=') {
                Some((name, value)) => (name.trim(), Some(value.trim())),
                None => (item, None),
            };
            let number = value.and_then(|v| v.parse::<u64>().ok());
            match (name, number) {
                ("nodev", _) => faults.nodev = true,
                ("enomem", _) => faults.enomem = true,
                ("refuse", _) => faults.refuse = true,
                ("slow_connect", Some(ms)) => faults.slow_connect = Some(Duration::from_millis(ms)),
                ("hang_connect", _) => faults.hang_connect = true,
                ("eagain_storm", Some(n)) => faults.eagain_storm = n,
                ("reset_after", Some(bytes)) => faults.reset_after = Some(bytes),
                ("poll_never_wakes", _) => faults.poll_never_wakes = true,
                ("slow_send", _) => {
                    if let Some((ms, k)) = value.and_then(|v| v.split_once('@'))
                        && let (Ok(ms), Ok(k)) = (ms.trim().parse::<u64>(), k.trim().parse::<u64>())
                        && k > 0
                    {
                        faults.slow_send = Some((Duration::from_millis(ms), k));
                    }
                }
                _ => {}
            }
        }
        faults
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_means_no_faults() {
        assert_eq!(Faults::parse(""), Faults::default());
        assert_eq!(Faults::parse(" , ,"), Faults::default());
    }

    #[test]
    fn every_fault_parses() {
        let f = Faults::parse(
            "nodev, enomem,refuse,slow_connect=50,hang_connect,eagain_storm=7,reset_after=4096,poll_never_wakes,slow_send=600@2",
        );
        assert!(f.nodev && f.enomem && f.refuse && f.hang_connect && f.poll_never_wakes);
        assert_eq!(f.slow_send, Some((Duration::from_millis(600), 2)));
        assert_eq!(f.slow_connect, Some(Duration::from_millis(50)));
        assert_eq!(f.eagain_storm, 7);
        assert_eq!(f.reset_after, Some(4096));
    }

    #[test]
    fn unknown_and_malformed_entries_are_ignored() {
        let f = Faults::parse(
            "bogus,slow_connect=soon,eagain_storm,reset_after=-1,refuse,slow_send=600,slow_send=600@0,slow_send=x@1",
        );
        assert_eq!(
            f,
            Faults {
                refuse: true,
                ..Faults::default()
            }
        );
    }
}

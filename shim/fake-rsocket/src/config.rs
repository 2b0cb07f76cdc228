//! Settings read once per process from the environment.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::faults::Faults;

/// Comma list of faults to inject (see [`Faults::parse`]).
pub const ENV_FAULTS: &str = "FAKE_RSOCKET_FAULTS";
/// Kernel TCP port = rsocket port + this offset (modulo 65536).
pub const ENV_PORT_OFFSET: &str = "FAKE_RSOCKET_PORT_OFFSET";
/// How long a blocking `rconnect` under `hang_connect` waits before `ETIMEDOUT`, in ms.
pub const ENV_HANG_MS: &str = "FAKE_RSOCKET_HANG_MS";
/// Directory where `<pid>.json` counters are written on every `rclose` and at exit.
pub const ENV_STATS_DIR: &str = "FAKE_RSOCKET_STATS_DIR";

/// Default of [`ENV_PORT_OFFSET`].
pub const DEFAULT_PORT_OFFSET: u16 = 20_000;
/// Default of [`ENV_HANG_MS`].
pub const DEFAULT_HANG_MS: u64 = 30_000;

/// Everything the environment configures.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) port_offset: u16,
    pub(crate) hang: Duration,
    pub(crate) stats_dir: Option<PathBuf>,
    pub(crate) faults: Faults,
}

impl Config {
    /// Builds the settings from a variable lookup; bad values fall back to the defaults
    /// silently (the library must never print into the program it is loaded in).
    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let port_offset = get(ENV_PORT_OFFSET)
            .and_then(|v| v.trim().parse::<u16>().ok())
            .unwrap_or(DEFAULT_PORT_OFFSET);
        let hang_ms = get(ENV_HANG_MS)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_HANG_MS);
        let stats_dir = get(ENV_STATS_DIR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let faults = get(ENV_FAULTS)
            .map(|v| Faults::parse(&v))
            .unwrap_or_default();
        Config {
            port_offset,
            hang: Duration::from_millis(hang_ms),
            stats_dir,
            faults,
        }
    }
}

/// The process-wide settings, read from the environment on first use.
pub(crate) fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config::from_lookup(|name| std::env::var(name).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_unset_or_invalid() {
        let c = Config::from_lookup(|_| None);
        assert_eq!(c.port_offset, DEFAULT_PORT_OFFSET);
        assert_eq!(c.hang, Duration::from_millis(DEFAULT_HANG_MS));
        assert!(c.stats_dir.is_none());
        assert_eq!(c.faults, Faults::default());

        let c = Config::from_lookup(|name| match name {
            ENV_PORT_OFFSET => Some("70000".into()),
            ENV_HANG_MS => Some("soon".into()),
            ENV_STATS_DIR => Some(String::new()),
            _ => None,
        });
        assert_eq!(c.port_offset, DEFAULT_PORT_OFFSET);
        assert_eq!(c.hang, Duration::from_millis(DEFAULT_HANG_MS));
        assert!(c.stats_dir.is_none());
    }

    #[test]
    fn values_are_read() {
        let c = Config::from_lookup(|name| match name {
            ENV_PORT_OFFSET => Some("1000".into()),
            ENV_HANG_MS => Some("250".into()),
            ENV_STATS_DIR => Some("/tmp/x".into()),
            ENV_FAULTS => Some("nodev".into()),
            _ => None,
        });
        assert_eq!(c.port_offset, 1000);
        assert_eq!(c.hang, Duration::from_millis(250));
        assert_eq!(c.stats_dir, Some(PathBuf::from("/tmp/x")));
        assert!(c.faults.nodev);
    }
}

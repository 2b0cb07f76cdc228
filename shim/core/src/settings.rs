//! The shim's settings: every `STREAMSHIM_*` variable, read in one place.
//!
//! [`Settings::from_env`] reads them all once, at the per-process decision (the first INET
//! stream socket, never in the constructor); the rest of the shim takes its values from the
//! [`Settings`] it returns. A value that is not valid is kept as its one-line error, which the
//! decision prints once where it uses the value (and then uses the default), so what the
//! process prints, and when, does not depend on where a variable is read.
//!
//! The environment table of `docs/shim.md` is checked against this type by a test: the same
//! variables, and each default the table states is the value the type takes when the variable
//! is unset. `rdma-streams-common`'s `names::contract` lists the same names for the injector.

use std::ffi::OsString;
use std::time::Duration;

use rdma_streams_transport::rdma::DEFAULT_PROVIDER;

use crate::log::Level;
use crate::policy::PolicySource;
use crate::services::{self, ServiceCidrs};
use crate::stats::StatsSink;
use crate::{direct, negotiation, ring};

/// The kill switch (`1`/`true`/`yes`/`on`).
pub const DISABLE_ENV: &str = "STREAMSHIM_DISABLE";
/// The data mode ([`Mode`]).
pub const MODE_ENV: &str = "STREAMSHIM_MODE";
/// The policy file ([`crate::policy`]).
pub const POLICY_ENV: &str = "STREAMSHIM_POLICY";
/// Where librdmacm is loaded from (a soname or a path); libibverbs is the one it loads.
pub const PROVIDER_ENV: &str = "STREAMSHIM_PROVIDER";
/// Where the process's stats go ([`crate::stats`]).
pub const STATS_ENV: &str = "STREAMSHIM_STATS";
/// The stderr log level ([`crate::log`]).
pub const LOG_ENV: &str = "STREAMSHIM_LOG";
/// The negotiation bound, in milliseconds ([`crate::negotiation`]).
pub const NEGOTIATE_ENV: &str = "STREAMSHIM_NEGOTIATE_MS";
/// Each upgraded connection's ring per direction, in KiB ([`crate::ring`]).
pub const RING_ENV: &str = "STREAMSHIM_RING_KIB";
/// Direct reads from the receive ring ([`crate::direct`]).
pub const DIRECT_READ_ENV: &str = "STREAMSHIM_DIRECT_READ";
/// Direct writes into the send ring ([`crate::direct`]).
pub const DIRECT_WRITE_ENV: &str = "STREAMSHIM_DIRECT_WRITE";
/// Spare connections: a client's next RDMA connect to a peer made ahead (`upgrade::spare`).
pub const SPARE_ENV: &str = "STREAMSHIM_SPARE";
/// Reused connections: a finished connection's queue pair carries the next one between the
/// same two processes (`rdma_streams_transport::engine`'s `park`).
pub const REUSE_ENV: &str = "STREAMSHIM_REUSE";
/// The cluster's virtual IPs, never negotiated with ([`crate::services`]).
pub const SERVICE_CIDRS_ENV: &str = "STREAMSHIM_SERVICE_CIDRS";

/// `STREAMSHIM_MODE`, trimmed and lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Empty, unset or `proxy`: the app's fd becomes a socketpair the engine drives.
    Proxy,
    /// `direct`: reserved for a later version (the decision says so and uses proxy).
    Direct,
    /// Anything else (the decision says so and passes through).
    Other(String),
}

impl Mode {
    fn parse(value: &str) -> Mode {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "proxy" => Mode::Proxy,
            "direct" => Mode::Direct,
            other => Mode::Other(other.to_owned()),
        }
    }
}

/// Every `STREAMSHIM_*` value of the process, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `STREAMSHIM_DISABLE`: pass everything through.
    pub disable: bool,
    /// `STREAMSHIM_MODE`.
    pub mode: Mode,
    /// `STREAMSHIM_POLICY`: the policy file, loaded at the decision.
    pub policy: PolicySource,
    /// `STREAMSHIM_PROVIDER`: the librdmacm to load ([`DEFAULT_PROVIDER`] when unset or blank).
    pub provider: String,
    /// `STREAMSHIM_STATS`: where the stats go (None: nowhere).
    pub stats: Option<StatsSink>,
    /// `STREAMSHIM_LOG`.
    pub log: Level,
    /// `STREAMSHIM_NEGOTIATE_MS` (unparsable values give the default, large ones are clamped).
    pub negotiate_timeout: Duration,
    /// `STREAMSHIM_RING_KIB` in bytes, or the one-line error for a value that is not a ring
    /// size.
    pub ring_bytes: Result<usize, String>,
    /// `STREAMSHIM_DIRECT_READ`, or the one-line error for a value neither 0 nor 1.
    pub direct_read: Result<bool, String>,
    /// `STREAMSHIM_DIRECT_WRITE`, or the one-line error for a value neither 0 nor 1.
    pub direct_write: Result<bool, String>,
    /// `STREAMSHIM_SPARE`, or the one-line error for a value neither 0 nor 1.
    pub spare: Result<bool, String>,
    /// `STREAMSHIM_REUSE`, or the one-line error for a value neither 0 nor 1.
    pub reuse: Result<bool, String>,
    /// `STREAMSHIM_SERVICE_CIDRS`, or the one-line error for a value that is not a list of
    /// CIDRs.
    pub service_cidrs: Result<ServiceCidrs, String>,
}

impl Settings {
    /// Reads every variable from the process's environment.
    pub fn from_env() -> Settings {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// Reads every variable through `var` (the environment, or a test's map). Values that are
    /// compared as words (`STREAMSHIM_DISABLE`, `STREAMSHIM_MODE`, `STREAMSHIM_PROVIDER`,
    /// `STREAMSHIM_LOG`) count as unset when they are not UTF-8.
    pub fn from_lookup(mut var: impl FnMut(&str) -> Option<OsString>) -> Settings {
        let mut text = |name: &str| var(name).and_then(|v| v.into_string().ok());
        let disable = text(DISABLE_ENV).is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        });
        let mode = Mode::parse(&text(MODE_ENV).unwrap_or_default());
        let provider = provider_name(text(PROVIDER_ENV).as_deref()).to_owned();
        let log = Level::parse(&text(LOG_ENV).unwrap_or_default());
        let policy = PolicySource::from_value(var(POLICY_ENV).as_deref());
        let stats = StatsSink::from_value(var(STATS_ENV).as_deref());
        let negotiate_timeout =
            negotiation::negotiate_timeout_from_value(var(NEGOTIATE_ENV).as_deref());
        let ring_bytes = ring::ring_bytes_from_value(var(RING_ENV).as_deref());
        let direct_read =
            direct::switch_from_value(DIRECT_READ_ENV, var(DIRECT_READ_ENV).as_deref());
        let direct_write =
            direct::switch_from_value(DIRECT_WRITE_ENV, var(DIRECT_WRITE_ENV).as_deref());
        let spare = direct::switch_from_value(SPARE_ENV, var(SPARE_ENV).as_deref());
        let reuse = direct::switch_from_value(REUSE_ENV, var(REUSE_ENV).as_deref());
        let service_cidrs = services::from_value(var(SERVICE_CIDRS_ENV).as_deref());
        Settings {
            disable,
            mode,
            policy,
            provider,
            stats,
            log,
            negotiate_timeout,
            ring_bytes,
            direct_read,
            direct_write,
            spare,
            reuse,
            service_cidrs,
        }
    }

    /// Whether the RDMA libraries are the system's ([`DEFAULT_PROVIDER`]).
    pub fn default_provider(&self) -> bool {
        self.provider == DEFAULT_PROVIDER
    }
}

/// The librdmacm to load for a `STREAMSHIM_PROVIDER` value: the value trimmed, or
/// [`DEFAULT_PROVIDER`] when it is unset or blank.
pub fn provider_name(value: Option<&str>) -> &str {
    match value {
        Some(v) if !v.trim().is_empty() => v.trim(),
        _ => DEFAULT_PROVIDER,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;

    /// The settings of an environment with only `name` set (to `value`; None: nothing set).
    fn with(name: &str, value: Option<&str>) -> Settings {
        Settings::from_lookup(|n| {
            if n == name {
                value.map(OsString::from)
            } else {
                None
            }
        })
    }

    /// The variables [`Settings::from_lookup`] asks for.
    fn read_names() -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let _ = Settings::from_lookup(|n| {
            names.insert(n.to_owned());
            None
        });
        names
    }

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// `STREAMSHIM_*` names quoted in `text` (between `quote` characters).
    fn quoted_names(text: &str, quote: char) -> BTreeSet<String> {
        text.split(quote)
            .skip(1)
            .step_by(2)
            .filter(|s| {
                s.strip_prefix("STREAMSHIM_").is_some_and(|rest| {
                    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
                })
            })
            .map(str::to_owned)
            .collect()
    }

    /// The rows `| \`STREAMSHIM_X\` | default | meaning |` of docs/shim.md's environment table.
    fn doc_table() -> Vec<(String, String)> {
        let text = std::fs::read_to_string(root().join("docs/shim.md")).unwrap();
        let section = text
            .split("\n## Environment\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/shim.md has an Environment section");
        section
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                name.starts_with("STREAMSHIM_").then(|| {
                    (
                        name.to_owned(),
                        cells.get(2).copied().unwrap_or("").to_owned(),
                    )
                })
            })
            .collect()
    }

    #[test]
    fn the_docs_table_lists_every_variable_the_settings_read_and_no_other() {
        let table: BTreeSet<String> = doc_table().into_iter().map(|(n, _)| n).collect();
        assert_eq!(table, read_names());
    }

    #[test]
    fn each_default_the_docs_state_is_what_an_unset_variable_gives() {
        let unset = with("", None);
        let mut checked = 0;
        for (name, default) in doc_table() {
            // `value` (a literal) is a default to check; `unset` and the like say there is none.
            let Some(value) = default.strip_prefix('`').and_then(|d| d.strip_suffix('`')) else {
                assert!(default.starts_with("unset"), "{name}: default {default:?}");
                continue;
            };
            assert_eq!(
                with(&name, Some(value)),
                unset,
                "{name}={value} is not the default"
            );
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} defaults checked");
    }

    #[test]
    fn the_contract_lists_every_variable_the_settings_read() {
        let contract =
            std::fs::read_to_string(root().join("common/src/names/contract.rs")).unwrap();
        assert_eq!(quoted_names(&contract, '"'), read_names());
    }

    #[test]
    fn unset_gives_the_defaults() {
        let s = with("", None);
        assert!(!s.disable);
        assert_eq!(s.mode, Mode::Proxy);
        assert_eq!(s.policy, PolicySource::Default);
        assert!(s.default_provider());
        assert_eq!(s.stats, None);
        assert_eq!(s.log, Level::Off);
        assert_eq!(s.negotiate_timeout, negotiation::DEFAULT_NEGOTIATE_TIMEOUT);
        assert_eq!(s.ring_bytes, Ok(ring::DEFAULT_RING_KIB * 1024));
        assert_eq!(s.direct_read, Ok(true));
        assert_eq!(s.direct_write, Ok(true));
        assert_eq!(s.spare, Ok(true));
        assert_eq!(s.reuse, Ok(true));
    }

    #[test]
    fn values_are_parsed_as_each_variable_says() {
        assert!(with(DISABLE_ENV, Some(" Yes ")).disable);
        assert!(!with(DISABLE_ENV, Some("0")).disable);
        assert_eq!(with(MODE_ENV, Some(" PROXY ")).mode, Mode::Proxy);
        assert_eq!(with(MODE_ENV, Some("Direct")).mode, Mode::Direct);
        assert_eq!(
            with(MODE_ENV, Some("Fast")).mode,
            Mode::Other(String::from("fast"))
        );
        assert_eq!(
            with(POLICY_ENV, Some("/p.yaml")).policy,
            PolicySource::File(PathBuf::from("/p.yaml"))
        );
        let bundled = with(PROVIDER_ENV, Some(" /x/librdmacm.so.1 "));
        assert_eq!(bundled.provider, "/x/librdmacm.so.1");
        assert!(!bundled.default_provider());
        assert!(with(PROVIDER_ENV, Some(DEFAULT_PROVIDER)).default_provider());
        assert_eq!(with(LOG_ENV, Some("debug")).log, Level::Debug);
        assert_eq!(
            with(NEGOTIATE_ENV, Some("500")).negotiate_timeout,
            Duration::from_millis(500)
        );
        assert_eq!(with(RING_ENV, Some("256")).ring_bytes, Ok(256 * 1024));
        assert!(with(RING_ENV, Some("1m")).ring_bytes.is_err());
        assert_eq!(with(DIRECT_READ_ENV, Some("0")).direct_read, Ok(false));
        assert!(with(DIRECT_WRITE_ENV, Some("2")).direct_write.is_err());
        assert_eq!(with(SPARE_ENV, Some("0")).spare, Ok(false));
        assert!(with(SPARE_ENV, Some("yes")).spare.is_err());
        assert_eq!(with(REUSE_ENV, Some("0")).reuse, Ok(false));
        assert!(with(REUSE_ENV, Some("no")).reuse.is_err());
        let services = with(SERVICE_CIDRS_ENV, Some("10.96.0.0/12"))
            .service_cidrs
            .unwrap();
        assert!(services.contains("10.96.0.10".parse().unwrap()));
        assert!(
            with(SERVICE_CIDRS_ENV, Some("10.96.0.0"))
                .service_cidrs
                .is_ok()
        );
        assert!(
            with(SERVICE_CIDRS_ENV, Some("10.96/12"))
                .service_cidrs
                .is_err()
        );
        assert!(with(STATS_ENV, Some("/tmp/s-%p.json")).stats.is_some());
    }

    #[test]
    fn words_that_are_not_utf8_count_as_unset() {
        use std::os::unix::ffi::OsStringExt;
        let bad = || Some(OsString::from_vec(vec![0xff, b'1']));
        let s = Settings::from_lookup(|n| {
            [DISABLE_ENV, MODE_ENV, PROVIDER_ENV, LOG_ENV]
                .contains(&n)
                .then(bad)
                .flatten()
        });
        assert_eq!(s, with("", None));
    }

    #[test]
    fn provider_name_defaults() {
        assert_eq!(provider_name(None), DEFAULT_PROVIDER);
        assert_eq!(provider_name(Some(" ")), DEFAULT_PROVIDER);
        assert_eq!(
            provider_name(Some("/x/librdmacm.so.1")),
            "/x/librdmacm.so.1"
        );
    }
}

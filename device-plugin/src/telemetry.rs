//! Logging setup: `tracing` to stderr, as text or JSON, filtered by `--log-level`.

use tracing_subscriber::{EnvFilter, fmt};

/// Log output format (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber. `filter` is an `EnvFilter` directive (`info`,
/// `rdma_device_plugin=debug,info`, ...); a bad directive falls back to `info`.
pub fn init(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

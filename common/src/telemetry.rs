//! Logging setup: `tracing` to stderr, as text or JSON, filtered by `--log-level`.

use tracing_subscriber::{EnvFilter, fmt};

/// Log output format (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// stderr that never fails: a closed or full log pipe must not take the plugin down
/// (tracing-subscriber reports write errors with `eprintln!`, which panics on a broken pipe).
pub struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Installs the global subscriber. `filter` is an `EnvFilter` directive (`info`,
/// `crate_name=debug,info`, ...); a bad directive falls back to `info`.
pub fn init(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

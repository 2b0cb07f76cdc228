//! Exports a [`WatchedFile`](crate::watched_file::WatchedFile)'s counters to Prometheus, read
//! at scrape time.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::counter::ConstCounter,
};

use crate::watched_file::ReloadStats;

/// `<prefix>_config_reloads_total` and `<prefix>_config_reload_failures_total`.
#[derive(Debug)]
pub struct ReloadStatsCollector {
    reloads: String,
    failures: String,
    stats: Arc<ReloadStats>,
}

impl ReloadStatsCollector {
    pub fn new(prefix: &str, stats: Arc<ReloadStats>) -> Self {
        Self {
            reloads: format!("{prefix}_config_reloads"),
            failures: format!("{prefix}_config_reload_failures"),
            stats,
        }
    }
}

impl Collector for ReloadStatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (name, help, value) in [
            (
                &self.reloads,
                "Config changes applied",
                self.stats.reloads(),
            ),
            (
                &self.failures,
                "Config changes rejected (the last good config stays)",
                self.stats.reload_failures(),
            ),
        ] {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

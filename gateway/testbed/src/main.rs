//! `rdma-gateway-testbed`: the migration gateway (`rdma-migration-gateway`, every flag and
//! environment variable the same) plus `--test-events-socket PATH`, which feeds it migration
//! events from a unix socket ([`test_events`]). For the gateway's integration tests, its
//! benchmark and the Soft-RoCE scenarios, which run without a Kubernetes API; never shipped
//! (the image carries `rdma-migration-gateway`, which has no such flag).

use std::{path::PathBuf, process::ExitCode};

use clap::Parser;
use rdma_migration_gateway::{cli, events::EventSource};
use rdma_streams_common::report;

mod test_events;

#[derive(Debug, Parser)]
#[command(
    name = "rdma-gateway-testbed",
    version,
    about = "The migration gateway, fed migration events from a unix socket (tests only)"
)]
struct Testbed {
    #[command(flatten)]
    gateway: cli::Args,

    /// Read migration events from this unix socket (see `test_events`); `--kube auto` then
    /// stays off.
    #[arg(long, env = "RDMA_GW_TEST_EVENTS_SOCKET")]
    test_events_socket: Option<PathBuf>,
}

impl Testbed {
    fn run(self) -> Result<(), cli::RunError> {
        let sources = self
            .test_events_socket
            .map(|path| {
                EventSource::new("test events", move |events, shutdown| async move {
                    test_events::serve(&path, events, shutdown).await
                })
            })
            .into_iter()
            .collect();
        self.gateway.run_with(sources)
    }
}

fn main() -> ExitCode {
    report::exit("rdma-gateway-testbed", Testbed::parse().run())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_flags_and_the_socket_parse_together() {
        let args = Testbed::try_parse_from([
            "rdma-gateway-testbed",
            "--test-events-socket",
            "/t.sock",
            "--kube",
            "auto",
            "--listen",
            "10.0.0.5:7000",
        ])
        .unwrap();
        assert_eq!(args.test_events_socket, Some("/t.sock".into()));
        // Fed by the socket, the gateway does not watch the cluster even inside a pod.
        let plan = args.gateway.plan(true, true);
        assert!(!plan.kube);
        assert_eq!(plan.listen, ([10, 0, 0, 5], 7000).into());
    }
}

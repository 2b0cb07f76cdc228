//! Migration events from a unix socket (`--test-events-socket PATH`), for the integration
//! tests and benchmarks, which run without a Kubernetes API: an
//! [`rdma_migration_gateway::events::EventSource`] of the test bed. In a cluster the kube
//! watchers feed the same channel.
//!
//! One JSON object per line; each gets a line `ok` back once the core has handled it (for a
//! source `started`: capture installed or failed, as the node hook server waits), or
//! `error: ...`:
//!
//! ```text
//! {"started":{"uid":"u1","vmi":"default/vm1","role":"source","target":"10.2.0.2","ports":[49152]}}
//! {"ended":{"uid":"u1","aborted":true}}
//! ```
//!
//! Optional: `"id"` in `started` (the migration's id, `migrationUid` in a cluster) and
//! `"migration"` in `ended` (end the VMI's migration only if it is that one).

use std::{net::IpAddr, path::Path};

use rdma_streams_common::report::Report;
use serde::Deserialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixListener,
    sync::mpsc,
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use rdma_migration_gateway::events::{EventDelivery, Migration, MigrationEvent, Role};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Wire {
    Started(WireMigration),
    Ended {
        uid: String,
        aborted: bool,
        #[serde(default)]
        migration: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
struct WireMigration {
    uid: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    vmi: String,
    role: WireRole,
    target: IpAddr,
    ports: Vec<u16>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum WireRole {
    Source,
    Target,
}

/// Parses one line into an event.
pub fn parse(line: &str) -> Result<MigrationEvent, serde_json::Error> {
    Ok(match serde_json::from_str::<Wire>(line)? {
        Wire::Started(m) => MigrationEvent::Started(Migration {
            uid: m.uid,
            id: m.id,
            vmi: m.vmi,
            role: match m.role {
                WireRole::Source => Role::Source,
                WireRole::Target => Role::Target,
            },
            target: m.target,
            ports: m.ports,
            started: None,
        }),
        Wire::Ended {
            uid,
            aborted,
            migration,
        } => MigrationEvent::Ended {
            uid,
            aborted,
            migration,
        },
    })
}

/// Serves the socket until `shutdown` (open connections are closed then).
pub async fn serve(
    path: &Path,
    events: mpsc::Sender<EventDelivery>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    info!(path = %path.display(), "TEST HOOK: accepting migration events on a unix socket");
    let mut conns = JoinSet::new();
    loop {
        let (conn, _) = tokio::select! {
            c = listener.accept() => c?,
            _ = shutdown.cancelled() => break,
            Some(_) = conns.join_next() => continue,
        };
        let events = events.clone();
        conns.spawn(async move {
            let (read, mut write) = conn.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                let reply = match parse(&line) {
                    Ok(event) => {
                        let (delivery, handled) = EventDelivery::acknowledged(event);
                        match events.send(delivery).await {
                            Ok(()) => match handled.await {
                                Ok(_) => "ok\n".to_string(),
                                Err(_) => "error: gateway stopping\n".to_string(),
                            },
                            Err(_) => "error: gateway stopping\n".to_string(),
                        }
                    }
                    Err(error) => {
                        warn!(error = %Report(&error), "bad test event");
                        format!("error: {}\n", Report(&error))
                    }
                };
                if write.write_all(reply.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds() {
        let e = parse(r#"{"started":{"uid":"u1","vmi":"ns/vm","role":"source","target":"10.2.0.2","ports":[1,2]}}"#).unwrap();
        assert_eq!(
            e,
            MigrationEvent::Started(Migration {
                uid: "u1".into(),
                id: String::new(),
                vmi: "ns/vm".into(),
                role: Role::Source,
                target: "10.2.0.2".parse().unwrap(),
                ports: vec![1, 2],
                started: None,
            })
        );
        assert_eq!(
            parse(r#"{"ended":{"uid":"u1","aborted":true}}"#).unwrap(),
            MigrationEvent::Ended {
                uid: "u1".into(),
                aborted: true,
                migration: None,
            }
        );
        // The optional migration id, and an end that names it.
        match parse(
            r#"{"started":{"uid":"u1","id":"m2","role":"target","target":"fd00::2","ports":[3]}}"#,
        ) {
            Ok(MigrationEvent::Started(m)) => assert_eq!(m.id, "m2"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(r#"{"ended":{"uid":"u1","aborted":false,"migration":"m2"}}"#).unwrap(),
            MigrationEvent::Ended {
                uid: "u1".into(),
                aborted: false,
                migration: Some("m2".into()),
            }
        );
        assert!(parse("{}").is_err());
    }
}

//! The KubeVirt node hook server (`--node-hooks-socket PATH`): virt-handler's
//! `NodeHookService/ExecuteNodeHook` calls, on a unix socket, as a trigger for
//! [`MigrationEvent::Started`] that comes *before* QEMU's first connect.
//!
//! **Per call.** [`super::hooks::event_for_hook`] turns the call into at most one `Started`
//! (`PreMigrationSource` on the source, `PreMigrationTarget` on the target; every other hook
//! point means nothing). If there is one, it goes to the core as an acknowledged
//! [`EventDelivery`] and the answer waits until the core has handled it (capture rules installed,
//! or the capture failed), at most [`DEFAULT_CALL_TIMEOUT`]. Only then does virt-handler get its
//! answer and let QEMU connect, so the first migration connection is already captured.
//!
//! **The answer is always success** (`success: true`, `message` says what happened). A failed
//! hook blocks the user's migration (virt-handler fails it unless the Plugin says `Ignore`),
//! and nothing that can go wrong here is worth that: an unreadable VMI, a capture that could
//! not be installed, a core that did not answer in time or is stopping all leave the migration
//! on plain TCP, as without the gateway. Each is a `warn` log with a `reason` and counts as
//! `outcome="error"` in `rdma_gw_node_hook_calls_total{hook, outcome}`. Virt-handlers whose
//! API declares an empty response skip both fields as unknown.
//!
//! **Which node.** The gateway's own `--node-name` decides the role, also when the call's
//! `node_context.node_name` differs (a warning then): the VMI watch, which ends the migration,
//! judges with the same name, so a migration started here can always be ended there. The socket
//! is a host path of this node, so the caller is this node's virt-handler anyway. Without a
//! `--node-name` the call's node name is used.
//!
//! **De-duplication.** The VMI watch reports the same migration moments later; both build the
//! `Migration` with [`crate::kube::vmi::events_for`], so the core sees an equal `Started` and
//! treats it as a no-op ([`Handled::AlreadyStarted`]). Whichever trigger comes first starts it;
//! the watch ends it. A call for a migration that is already over changes nothing
//! ([`Handled::Stale`], answered as ignored).
//!
//! **The socket.** A stale socket file is replaced at start (anything else at the path is an
//! error), the parent directory is created, the mode is [`SOCKET_MODE`]; the file is removed
//! at shutdown if it is still ours.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use rdma_streams_common::{
    file_id::{FileId, file_id, remove_if_ours},
    report::Report,
    uds,
};
use tokio::{net::UnixListener, sync::mpsc};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Server};
use tracing::{Instrument, debug, info, info_span, warn};

use super::{
    hooks::{HookStart, NodeHookCall, event_for_hook},
    hooks_api::{
        hook_label,
        v1alpha1::{
            ExecuteNodeHookRequest, ExecuteNodeHookResponse,
            node_hook_service_server::{NodeHookService, NodeHookServiceServer},
        },
    },
    node::NodePeerDirectory,
};
use crate::{
    events::{EventDelivery, Handled, MigrationEvent},
    metrics::{HookOutcome, Metrics},
};

/// How long a call waits for the core: well below KubeVirt's default hook timeout (30 s), so
/// virt-handler always gets our answer rather than a deadline error.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Mode of the socket file: virt-handler (root) connects; nobody else on the node.
pub const SOCKET_MODE: u32 = 0o660;

/// Why the node hook socket could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookServerError {
    #[error("creating the node hook socket directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} exists and is not a socket; not replacing it")]
    NotASocket { path: PathBuf },
    #[error("removing the stale node hook socket {path}")]
    Stale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("binding the node hook socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("setting the mode of {path}")]
    Mode {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("serving node hooks")]
    Serve(#[source] tonic::transport::Error),
}

/// What one call came to: the metric outcome and the message of the answer.
struct Answer {
    outcome: HookOutcome,
    message: String,
}

impl Answer {
    fn new(outcome: HookOutcome, message: impl Into<String>) -> Answer {
        Answer {
            outcome,
            message: message.into(),
        }
    }
}

/// Answers `NodeHookService/ExecuteNodeHook`; see the module docs.
#[derive(Debug, Clone)]
pub struct NodeHookServer {
    node_name: String,
    events: mpsc::Sender<EventDelivery>,
    metrics: Metrics,
    timeout: Duration,
    peers: Option<NodePeerDirectory>,
}

impl NodeHookServer {
    /// A server for the gateway on `node_name` (may be empty: then each call's own node name
    /// is used) that hands events to the core on `events`.
    pub fn new(node_name: String, events: mpsc::Sender<EventDelivery>, metrics: Metrics) -> Self {
        NodeHookServer {
            node_name,
            events,
            metrics,
            timeout: DEFAULT_CALL_TIMEOUT,
            peers: None,
        }
    }

    /// Tells `peers` which node a source migration's target runs on before the migration is
    /// started, as the VMI watch does ([`NodePeerDirectory::learn_migration`]).
    pub fn with_peers(mut self, peers: Option<NodePeerDirectory>) -> Self {
        self.peers = peers;
        self
    }

    /// Bounds the wait for the core by `timeout` instead of [`DEFAULT_CALL_TIMEOUT`].
    #[cfg(test)]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The node whose role the call is judged for.
    fn node_for<'a>(&'a self, requested: &'a str) -> &'a str {
        if self.node_name.is_empty() {
            return requested;
        }
        if !requested.is_empty() && requested != self.node_name {
            warn!(
                node = %self.node_name,
                requested,
                "node hook call names another node; judging it for this gateway's --node-name"
            );
        }
        &self.node_name
    }

    /// Handles one call; never fails.
    async fn answer(&self, request: &ExecuteNodeHookRequest) -> Answer {
        let requested = request
            .node_context
            .as_ref()
            .map_or("", |c| c.node_name.as_str());
        let node = self.node_for(requested);
        let call = NodeHookCall {
            hook_point: &request.hook_point,
            vmi: &request.vmi,
            node_name: node,
        };
        match event_for_hook(call) {
            Err(error) => {
                warn!(error = %Report(&error), reason = "invalid_vmi", "node hook call ignored; the VMI watch still sees this migration");
                Answer::new(
                    HookOutcome::Error,
                    format!(
                        "rdma-migration-gateway: VMI not readable ({}); nothing done",
                        Report(&error)
                    ),
                )
            }
            Ok(None) => {
                debug!("node hook call means nothing for this gateway");
                Answer::new(
                    HookOutcome::Ignored,
                    "rdma-migration-gateway: nothing to do",
                )
            }
            Ok(Some(start)) => self.deliver(start).await,
        }
    }

    /// Hands the migration to the core and waits (bounded) until it was handled.
    async fn deliver(&self, start: HookStart) -> Answer {
        let HookStart {
            migration: m,
            target_node,
        } = start;
        if let Some(peers) = &self.peers {
            peers.learn_migration(&m, target_node.as_deref());
        }
        let described = format!("{} ({}, {})", m.vmi, m.uid, m.role.as_str());
        let (delivery, handled) = EventDelivery::acknowledged(MigrationEvent::Started(m));
        let handled = tokio::time::timeout(self.timeout, async {
            self.events.send(delivery).await.ok()?;
            handled.await.ok()
        })
        .await;
        let error = |reason: &'static str, what: &str| {
            warn!(reason, migration = %described, "node hook: {what}; not holding the migration up");
            Answer::new(
                HookOutcome::Error,
                format!(
                    "rdma-migration-gateway: {what} for {described}; not blocking the migration"
                ),
            )
        };
        match handled {
            Ok(Some(Handled::Started)) => {
                info!(migration = %described, "migration started by the node hook");
                Answer::new(
                    HookOutcome::Started,
                    format!("rdma-migration-gateway: carrying {described}"),
                )
            }
            Ok(Some(Handled::AlreadyStarted)) => {
                info!(migration = %described, "node hook: migration already started");
                Answer::new(
                    HookOutcome::AlreadyStarted,
                    format!("rdma-migration-gateway: already carrying {described}"),
                )
            }
            Ok(Some(Handled::Stale)) => {
                info!(migration = %described, "node hook: that migration is already over");
                Answer::new(
                    HookOutcome::Ignored,
                    format!("rdma-migration-gateway: {described} is already over; nothing to do"),
                )
            }
            Ok(Some(Handled::Uncaptured)) => error(
                "capture_failed",
                "capture not installed (its connections go over TCP without the gateway)",
            ),
            // A Started is never answered as an end.
            Ok(Some(Handled::Ended)) => error("unexpected", "the core ended instead of starting"),
            Ok(None) => error("gateway_stopping", "gateway stopping"),
            // The event stays queued: the capture may still come before the first connect.
            Err(_) => error("timeout", "no answer from the gateway core in time"),
        }
    }
}

#[tonic::async_trait]
impl NodeHookService for NodeHookServer {
    async fn execute_node_hook(
        &self,
        request: Request<ExecuteNodeHookRequest>,
    ) -> Result<Response<ExecuteNodeHookResponse>, Status> {
        let request = request.into_inner();
        let hook = hook_label(&request.hook_point);
        let span = info_span!("node_hook", hook = %request.hook_point);
        let answer = self.answer(&request).instrument(span).await;
        self.metrics.node_hook_call(hook, answer.outcome);
        Ok(Response::new(ExecuteNodeHookResponse {
            success: true,
            message: answer.message,
        }))
    }
}

/// The bound node hook socket.
#[derive(Debug)]
pub struct HookSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Our socket file's identity, to remove only ours.
    id: Option<FileId>,
}

impl HookSocket {
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds the socket at `path`: creates the parent directory, replaces a stale socket (refuses
/// to replace anything else), sets [`SOCKET_MODE`]. Must run inside a tokio runtime.
pub fn bind(path: &Path) -> Result<HookSocket, HookServerError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| HookServerError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| HookServerError::Stale {
                path: path.to_path_buf(),
                source,
            })?;
            info!(path = %path.display(), "removed a stale node hook socket");
        }
        Ok(_) => {
            return Err(HookServerError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| HookServerError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(
        |source| HookServerError::Mode {
            path: path.to_path_buf(),
            source,
        },
    )?;
    Ok(HookSocket {
        listener,
        id: file_id(path),
        path: path.to_path_buf(),
    })
}

/// Serves `server` on `socket` until `shutdown`, then removes the socket file (if it is still
/// ours). Calls in flight finish first; each is bounded by the server's timeout.
pub async fn serve(
    socket: HookSocket,
    server: NodeHookServer,
    shutdown: CancellationToken,
) -> Result<(), HookServerError> {
    let HookSocket { listener, path, id } = socket;
    info!(path = %path.display(), node = %server.node_name, "serving KubeVirt node hooks");
    let result = Server::builder()
        .add_service(NodeHookServiceServer::new(server))
        .serve_with_incoming_shutdown(uds::incoming(listener), shutdown.cancelled_owned())
        .await;
    remove_if_ours(&path, id);
    info!(path = %path.display(), "node hook server stopped");
    result.map_err(HookServerError::Serve)
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

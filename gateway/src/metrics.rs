//! Prometheus metrics (prometheus-client, prefix `rdma_gw`), served on `/metrics`.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{migration::Outcome, streams::Fallback};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndLabels {
    pub role: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    pub role: String,
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    pub path: String,
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// A KubeVirt node hook point (`other` for names we do not know).
    pub hook: String,
    /// `started`, `already_started`, `ignored` or `error`.
    pub outcome: String,
}

/// What a node hook call came to (label `outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookOutcome {
    /// The call started a migration (capture installed, or streams expected).
    Started,
    /// The migration was already active (the VMI watch reported it first).
    AlreadyStarted,
    /// Nothing to do: another hook point, not opted in, not this node, target not published,
    /// the migration already over.
    Ignored,
    /// Something went wrong (unreadable VMI, capture failed, no answer from the core in time,
    /// gateway stopping); the log line says which. KubeVirt was still told success.
    Error,
}

impl HookOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            HookOutcome::Started => "started",
            HookOutcome::AlreadyStarted => "already_started",
            HookOutcome::Ignored => "ignored",
            HookOutcome::Error => "error",
        }
    }
}

/// The data path a connection took (label `path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Rdma,
    Tcp,
}

impl PathKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::Rdma => "rdma",
            PathKind::Tcp => "tcp",
        }
    }
}

/// Every metric the gateway exports.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Migrations started, by role.
    pub migrations: Family<RoleLabels, Counter>,
    /// Migrations ended, by role and outcome (`completed`, `aborted`).
    pub migrations_ended: Family<EndLabels, Counter>,
    /// Migrations in progress.
    pub migrations_active: Gauge,
    /// Connections carried, by role and path: over RDMA once the stream took the connection (a
    /// stream that ended before it took it counts nothing; the source relays that connection
    /// over TCP and counts it there).
    pub connections: Family<PathLabels, Counter>,
    /// Connections open now.
    pub connections_active: Gauge,
    /// Bytes carried, by path and direction (`to_target`, `to_source`).
    pub bytes: Family<BytesLabels, Counter>,
    /// Connections relayed over TCP, by reason.
    pub fallbacks: Family<ReasonLabels, Counter>,
    /// Captured connections to a destination no active migration names (closed).
    pub unmatched: Counter,
    /// KubeVirt node hook calls answered, by hook point and outcome.
    pub node_hook_calls: Family<HookLabels, Counter>,
    /// Starts of migrations that were already over or older than the active one (a lagging
    /// VMI watch), ignored.
    pub late_starts: Counter,
    /// 1 when this gateway can carry streams (a usable RDMA device, the engine running), else
    /// 0 (every connection then falls back with the reason the probe gave).
    pub rdma_usable: Gauge,
    /// Connect requests of peer gateways, by what became of them (target side).
    pub peer_requests: Family<OutcomeLabels, Counter>,
    /// Peer keys in force (0: no stream is opened or accepted, `NO_PEER_KEY`).
    pub peer_keys: Gauge,
    /// Failed accepts on a capture listener (`EMFILE` and the like: the connection waits in
    /// the backlog while the listener backs off).
    pub capture_accept_errors: Counter,
}

impl Metrics {
    /// New metrics registered under the `rdma_gw` prefix of `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("rdma_gw");
        r.register("migrations", "Migrations started", m.migrations.clone());
        r.register(
            "migrations_ended",
            "Migrations ended, by outcome",
            m.migrations_ended.clone(),
        );
        r.register(
            "migrations_active",
            "Migrations in progress",
            m.migrations_active.clone(),
        );
        r.register(
            "connections",
            "Migration connections carried, by path",
            m.connections.clone(),
        );
        r.register(
            "connections_active",
            "Migration connections open",
            m.connections_active.clone(),
        );
        r.register("bytes", "Bytes carried, by path", m.bytes.clone());
        r.register(
            "fallbacks",
            "Connections relayed over TCP, by reason",
            m.fallbacks.clone(),
        );
        r.register(
            "unmatched_connections",
            "Captured connections no migration names",
            m.unmatched.clone(),
        );
        r.register(
            "node_hook_calls",
            "KubeVirt node hook calls answered, by hook point and outcome",
            m.node_hook_calls.clone(),
        );
        r.register(
            "late_starts",
            "Starts of migrations already over or older than the active one, ignored",
            m.late_starts.clone(),
        );
        r.register(
            "rdma_usable",
            "1 when RDMA streams can be opened from this node (device probed, engine running)",
            m.rdma_usable.clone(),
        );
        r.register(
            "peer_requests",
            "Stream requests of peer gateways, by outcome (challenged, admitted, or why refused)",
            m.peer_requests.clone(),
        );
        r.register(
            "peer_keys",
            "Peer keys in force (0: no RDMA stream is opened or accepted)",
            m.peer_keys.clone(),
        );
        r.register(
            "capture_accept_errors",
            "Failed accepts on capture listeners (file descriptors exhausted and the like)",
            m.capture_accept_errors.clone(),
        );
        for outcome in Outcome::ALL {
            let _ = m.peer_requests.get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().into(),
            });
        }
        for reason in Fallback::ALL {
            let _ = m.fallbacks.get_or_create(&ReasonLabels {
                reason: reason.as_str().into(),
            });
        }
        m
    }

    pub fn connection(&self, role: &str, path: PathKind) {
        self.connections
            .get_or_create(&PathLabels {
                role: role.into(),
                path: path.as_str().into(),
            })
            .inc();
    }

    /// Connections counted for `role` on `path` so far.
    #[cfg(test)]
    pub fn connections_of(&self, role: &str, path: PathKind) -> u64 {
        self.connections
            .get_or_create(&PathLabels {
                role: role.into(),
                path: path.as_str().into(),
            })
            .get()
    }

    pub fn fallback(&self, reason: Fallback) {
        self.fallbacks
            .get_or_create(&ReasonLabels {
                reason: reason.as_str().into(),
            })
            .inc();
    }

    /// Counts one peer request's outcome.
    pub fn peer_request(&self, outcome: Outcome) {
        self.peer_requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().into(),
            })
            .inc();
    }

    /// Peer requests with `outcome` so far.
    #[cfg(test)]
    pub fn peer_requests_of(&self, outcome: Outcome) -> u64 {
        self.peer_requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().into(),
            })
            .get()
    }

    /// Counts one node hook call; `hook` must already be one of a bounded set of names.
    pub fn node_hook_call(&self, hook: &str, outcome: HookOutcome) {
        self.node_hook_calls
            .get_or_create(&HookLabels {
                hook: hook.into(),
                outcome: outcome.as_str().into(),
            })
            .inc();
    }

    pub fn add_bytes(&self, path: PathKind, to_target: u64, to_source: u64) {
        for (direction, n) in [("to_target", to_target), ("to_source", to_source)] {
            self.bytes
                .get_or_create(&BytesLabels {
                    path: path.as_str().into(),
                    direction: direction.into(),
                })
                .inc_by(n);
        }
    }
}

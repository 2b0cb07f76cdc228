//! [`GatewayCore`]: consumes [`MigrationEvent`]s and owns every migration's state.
//!
//! - `Started` (source): locate virt-handler's namespace, open a capture listener there,
//!   install the migration's nftables table, accept captured connections
//!   ([`crate::capture`], then [`super::source`]). A failure leaves the migration uncaptured: virt-handler's
//!   connections then go over plain TCP as without the gateway.
//! - `Started` (target): remember the migration, so [`super::target`] accepts streams for
//!   its destinations.
//! - A `Started` for a migration that already ended, that a different migration of its VMI
//!   replaced, or that started before the VMI's active one, is ignored ([`Handled::Stale`]; a VMI watch lagging behind the node hooks sends
//!   those, see [`super::ended`]).
//! - `Ended`: close the uid's capture listener and remove its table at once; abort its streams
//!   and stop its TCP relays at once when aborted, else after [`Settings::drain_grace`](super::Settings::drain_grace) (a
//!   completed migration's connections are closing by themselves; this only bounds
//!   stragglers).
//! - Shutdown: the same for every migration.
//!
//! Events are handled one at a time, in order. A [`EventDelivery`] that asks for it is acknowledged
//! with the [`Handled`] outcome after its event was handled, so a producer can hold back until
//! the capture is in place (the node hook server does).

use std::{net::IpAddr, sync::Arc};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use rdma_streams_common::report::Report;

use super::{
    source,
    state::{Active, Handles, Shared},
};
use crate::{
    capture::{
        self, CaptureError, addresses,
        nft::{self, CaptureRule, OwnedTable},
    },
    events::{EventDelivery, Handled, Migration, MigrationEvent, Role},
    metrics::{EndLabels, RoleLabels},
    streams::payload::UidDigest,
};

/// Consumes migration events; see the module docs.
#[derive(Clone)]
pub struct GatewayCore {
    shared: Arc<Shared>,
}

impl GatewayCore {
    pub fn new(shared: Arc<Shared>) -> GatewayCore {
        GatewayCore { shared }
    }

    #[cfg(test)]
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Removes tables a previous gateway left in the capture namespace.
    pub async fn cleanup_stale(&self) {
        let locator = self.shared.locator.clone();
        let result = tokio::task::spawn_blocking(move || {
            let ns = locator.locate().map_err(nft::NftError::from)?;
            nft::remove_all(&ns)
        })
        .await;
        match result {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => info!(tables = n, "removed stale capture tables"),
            Ok(Err(error)) => {
                warn!(error = %Report(&error), "startup cleanup of capture tables skipped")
            }
            Err(error) => warn!(error = %Report(&error), "startup cleanup task failed"),
        }
    }

    /// Handles events until the channel closes or `shutdown`, then tears every migration
    /// down. Each delivery's acknowledgement (if any) is completed once its event is handled;
    /// deliveries still queued at shutdown are dropped, and so are their acknowledgements.
    pub async fn run(self, mut events: mpsc::Receiver<EventDelivery>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                delivery = events.recv() => match delivery {
                    Some(EventDelivery { event, handled }) => {
                        let outcome = self.handle(event).await;
                        if let Some(ack) = handled {
                            // The producer may have given up waiting: nothing to tell then.
                            let _ = ack.send(outcome);
                        }
                    }
                    None => break,
                },
                _ = shutdown.cancelled() => break,
            }
        }
        let uids: Vec<String> = self.shared.table().keys().cloned().collect();
        for uid in uids {
            self.end(&uid, true, None).await;
        }
        // Also the connections of migrations that ended before, still in their drain grace.
        self.shared.stop.cancel();
        info!("all migrations torn down");
    }

    /// Handles one event; returns what it did.
    pub async fn handle(&self, event: MigrationEvent) -> Handled {
        match event {
            MigrationEvent::Started(migration) => {
                let span = info_span!("migration", uid = %migration.uid, vmi = %migration.vmi, role = migration.role.as_str());
                self.start(migration).instrument(span).await
            }
            MigrationEvent::Ended {
                uid,
                aborted,
                migration,
            } => {
                let span = info_span!("migration", %uid);
                self.end(&uid, aborted, migration.as_deref())
                    .instrument(span)
                    .await;
                if let Some(id) = &migration {
                    // Even if it never started here: a late Started for it must not start it.
                    self.shared.ended().record(&uid, id);
                }
                Handled::Ended
            }
        }
    }

    async fn start(&self, migration: Migration) -> Handled {
        let active = self
            .shared
            .table()
            .get(&migration.uid)
            .map(|a| a.migration.clone());
        // Two triggers (node hook, VMI watch) report the same migration: the second is a no-op.
        if active.as_ref() == Some(&migration) {
            info!("already started");
            return Handled::AlreadyStarted;
        }
        let other = active.filter(|a| a.id != migration.id);
        let late = if self.shared.ended().contains(&migration.uid, &migration.id) {
            Some("start of a migration that is over: ignored")
        } else if other.as_ref().is_some_and(|a| migration.started_before(a)) {
            Some("start of a migration older than the active one: ignored")
        } else {
            None
        };
        if let Some(what) = late {
            info!(migration = %migration.id, "{what}");
            self.shared.metrics.late_starts.inc();
            return Handled::Stale;
        }
        // A different migration of the VMI replaces the active one (that one is over), and a
        // changed report of the same migration (ports published later) starts it afresh.
        if let Some(replaced) = other {
            info!(replaced = %replaced.id, "a new migration of this VMI replaces the active one");
            self.shared.ended().record(&migration.uid, &replaced.id);
        }
        self.end(&migration.uid, true, None).await;
        let cancel = self.shared.stop.child_token();
        let handles = Handles {
            migration: migration.clone(),
            capture_cancel: cancel.child_token(),
            cancel,
        };
        self.shared.table().insert(
            migration.uid.clone(),
            Active {
                migration: migration.clone(),
                digest: UidDigest::of(&migration.uid),
                cancel: handles.cancel.clone(),
                capture_cancel: handles.capture_cancel.clone(),
                capture: None,
                local_destination: false,
            },
        );
        let role = migration.role.as_str();
        self.shared
            .metrics
            .migrations
            .get_or_create(&RoleLabels { role: role.into() })
            .inc();
        self.shared.metrics.migrations_active.inc();
        info!(target = %migration.target, ports = ?migration.ports, "migration started");
        if migration.role == Role::Target {
            let local = self.destination_is_local(migration.target).await;
            if let Some(active) = self.shared.table().get_mut(&migration.uid) {
                active.local_destination = local;
            }
            return Handled::Started;
        }
        match self.capture(&handles).await {
            Ok(installed) => {
                if let Some(active) = self.shared.table().get_mut(&migration.uid) {
                    active.capture = Some(installed);
                }
                Handled::Started
            }
            Err(error) => {
                warn!(error = %Report(&error), "capture not installed: this migration's connections go over TCP without the gateway");
                Handled::Uncaptured
            }
        }
    }

    /// Whether `target` is this node's: one of the addresses of virt-handler's network
    /// namespace (found as for capture), or the advertised node address. A target gateway
    /// dials nothing else, whatever a migration names.
    async fn destination_is_local(&self, target: IpAddr) -> bool {
        if self.shared.settings.advertised == Some(target) {
            info!(%target, "the target address is this node's advertised address");
            return true;
        }
        let locator = self.shared.locator.clone();
        let read = tokio::task::spawn_blocking(move || {
            let ns = locator.locate().map_err(addresses::AddressError::from)?;
            addresses::addresses_in(&ns)
        })
        .await;
        match read {
            Ok(Ok(addrs)) if addrs.contains(&target) => {
                info!(%target, "the target address is virt-handler's on this node");
                true
            }
            Ok(Ok(addrs)) => {
                warn!(%target, virt_handler = ?addrs, "the target address is neither virt-handler's on this node nor the advertised one: streams for this migration are refused");
                false
            }
            Ok(Err(error)) => {
                warn!(error = %Report(&error), %target, "virt-handler's addresses could not be read: streams for this migration are refused unless it is the advertised address");
                false
            }
            Err(error) => {
                warn!(error = %Report(&error), "reading virt-handler's addresses: task failed");
                false
            }
        }
    }

    async fn capture(&self, handles: &Handles) -> Result<OwnedTable, CaptureError> {
        let m = &handles.migration;
        let locator = self.shared.locator.clone();
        let ns = tokio::task::spawn_blocking(move || locator.locate())
            .await
            .map_err(|e| CaptureError::Task(e.to_string()))??;
        let listener = capture::listen_in(&ns, m.target).await?;
        let port = listener.local_addr().map_err(CaptureError::Listen)?.port();
        let rule = CaptureRule {
            table: nft::table_name(&m.uid),
            target: m.target,
            ports: m.ports.clone(),
            redirect_port: port,
            mark: self.shared.settings.mark,
        };
        let ns_for_rule = ns.clone();
        let table = tokio::task::spawn_blocking(move || nft::install(&ns_for_rule, &rule))
            .await
            .map_err(|e| CaptureError::Task(e.to_string()))??;
        info!(netns = %ns.display(), table = table.name(), capture_port = port, "capture installed");
        self.shared.spawn(
            source::accept_loop(self.shared.clone(), listener, handles.clone())
                .instrument(info_span!("capture", uid = %m.uid)),
        );
        Ok(table)
    }

    /// Tears down the active migration of `uid`; with `only`, just if it is that migration
    /// (checked and removed under one lock).
    async fn end(&self, uid: &str, aborted: bool, only: Option<&str>) {
        let active = {
            let mut table = self.shared.table();
            match (table.get(uid), only) {
                (Some(active), Some(ended)) if active.migration.id != ended => {
                    debug!(active = %active.migration.id, ended, "end of another migration of this VMI: ignored");
                    None
                }
                _ => table.remove(uid),
            }
        };
        let Some(active) = active else {
            return;
        };
        active.capture_cancel.cancel();
        if aborted {
            active.cancel.cancel();
        } else {
            let cancel = active.cancel.clone();
            let grace = self.shared.settings.drain_grace;
            self.shared.spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(grace) => cancel.cancel(),
                    () = cancel.cancelled() => {}
                }
            });
        }
        if let Some(table) = active.capture {
            let result = tokio::task::spawn_blocking(move || table.remove()).await;
            match result {
                Ok(Ok(())) => info!("capture removed"),
                Ok(Err(error)) => {
                    warn!(error = %Report(&error), "removing the capture table failed")
                }
                Err(error) => {
                    warn!(error = %Report(&error), "removing the capture table: task failed")
                }
            }
        }
        let outcome = if aborted { "aborted" } else { "completed" };
        self.shared
            .metrics
            .migrations_ended
            .get_or_create(&EndLabels {
                role: active.migration.role.as_str().into(),
                outcome: outcome.into(),
            })
            .inc();
        self.shared.metrics.migrations_active.dec();
        info!(outcome, "migration ended");
    }
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, time::Duration};

    use super::*;
    use crate::{
        capture::netns::PathLocator,
        migration::Settings,
        testing::{CountingLocator, spawn_core},
    };

    /// A core without capture namespace, whose advertised address is the test migrations'
    /// target (so target streams for them are admitted).
    fn core() -> GatewayCore {
        crate::testing::core_with_settings(
            PathLocator("/nonexistent/ns".into()),
            Settings {
                advertised: Some("10.2.0.2".parse().unwrap()),
                ..Settings::default()
            },
        )
    }

    fn migration(role: Role) -> Migration {
        Migration {
            uid: "u1".into(),
            id: "m1".into(),
            vmi: "default/vm1".into(),
            role,
            target: "10.2.0.2".parse().unwrap(),
            ports: vec![49152, 49153],
            started: None,
        }
    }

    /// Runs an async test body on its own runtime, failing after 10 s.
    fn within<F>(body: impl FnOnce() -> F + Send + 'static)
    where
        F: std::future::Future<Output = ()>,
    {
        crate::testing::within(Duration::from_secs(10), body);
    }

    #[test]
    fn target_migrations_admit_only_their_destinations_until_ended() {
        within(target_migrations_body);
    }

    async fn target_migrations_body() {
        let core = core();
        let shared = core.shared().clone();
        let (tx, shutdown, task) = spawn_core(core);
        tx.send(MigrationEvent::Started(migration(Role::Target)).into())
            .await
            .unwrap();
        let dst: SocketAddr = "10.2.0.2:49153".parse().unwrap();
        let u1 = UidDigest::of("u1");
        let handles = loop {
            if let Some(h) = shared.target_handles(&u1, dst) {
                break h;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(
            shared
                .target_handles(&u1, "10.2.0.2:22".parse().unwrap())
                .is_none()
        );
        assert!(shared.target_handles(&UidDigest::of("u2"), dst).is_none());
        tx.send(
            MigrationEvent::Ended {
                uid: "u1".into(),
                aborted: true,
                migration: None,
            }
            .into(),
        )
        .await
        .unwrap();
        while shared.active() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(handles.cancel.is_cancelled());
        shutdown.cancel();
        task.await.unwrap();
    }

    #[test]
    fn a_source_without_its_namespace_stays_uncaptured_and_ends_cleanly() {
        within(uncaptured_source_body);
    }

    async fn uncaptured_source_body() {
        let core = core();
        let shared = core.shared().clone();
        assert_eq!(
            core.handle(MigrationEvent::Started(migration(Role::Source)))
                .await,
            Handled::Uncaptured
        );
        assert_eq!(shared.active(), 1);
        // The same event again changes nothing; the end removes it.
        assert_eq!(
            core.handle(MigrationEvent::Started(migration(Role::Source)))
                .await,
            Handled::AlreadyStarted
        );
        assert_eq!(shared.active(), 1);
        assert_eq!(
            core.handle(MigrationEvent::Ended {
                uid: "u1".into(),
                aborted: false,
                migration: None,
            })
            .await,
            Handled::Ended
        );
        assert_eq!(shared.active(), 0);
        assert_eq!(shared.metrics.migrations_active.get(), 0);
    }

    #[test]
    fn a_named_end_ends_only_that_migration_of_the_vmi() {
        within(named_end_body);
    }

    async fn named_end_body() {
        let core = core();
        let shared = core.shared().clone();
        // A node hook started the VMI's second migration before the watch saw the first end.
        let second = Migration {
            id: "m2".into(),
            ..migration(Role::Target)
        };
        assert_eq!(
            core.handle(MigrationEvent::Started(second)).await,
            Handled::Started
        );
        let end = |id: &str| MigrationEvent::Ended {
            uid: "u1".into(),
            aborted: false,
            migration: Some(id.into()),
        };
        assert_eq!(core.handle(end("m1")).await, Handled::Ended);
        assert_eq!(shared.active(), 1, "the end of m1 left m2 alone");
        assert!(
            shared
                .target_handles(&UidDigest::of("u1"), "10.2.0.2:49152".parse().unwrap())
                .is_some()
        );
        assert_eq!(core.handle(end("m2")).await, Handled::Ended);
        assert_eq!(shared.active(), 0);
        // Ending what is not active (a watch's first sight of an old, finished migration)
        // changes nothing.
        assert_eq!(core.handle(end("m0")).await, Handled::Ended);
        assert_eq!(shared.metrics.migrations_active.get(), 0);
    }

    #[test]
    fn acknowledgements_follow_the_handling_in_order() {
        within(acknowledgements_body);
    }

    async fn acknowledgements_body() {
        let locator = CountingLocator {
            delay: Duration::from_millis(200),
            ..CountingLocator::default()
        };
        // The target's address is the advertised one: only the source start looks the
        // namespace up.
        let core = crate::testing::core_with_settings(
            locator.clone(),
            Settings {
                advertised: Some("10.2.0.2".parse().unwrap()),
                ..Settings::default()
            },
        );
        let shared = core.shared().clone();
        let (tx, shutdown, task) = spawn_core(core);
        // A fire-and-forget event first: the acknowledged one is handled after it.
        tx.send(MigrationEvent::Started(migration(Role::Target)).into())
            .await
            .unwrap();
        let source = Migration {
            uid: "u2".into(),
            ..migration(Role::Source)
        };
        let (delivery, ack) = EventDelivery::acknowledged(MigrationEvent::Started(source));
        let sent = std::time::Instant::now();
        tx.send(delivery).await.unwrap();
        assert_eq!(ack.await.unwrap(), Handled::Uncaptured);
        assert!(
            sent.elapsed() >= Duration::from_millis(200),
            "acknowledged before the capture attempt finished"
        );
        assert_eq!(locator.calls(), 1);
        assert_eq!(shared.active(), 2, "both handled before the ack");
        // Once the core stopped, an acknowledgement fails instead of hanging.
        shutdown.cancel();
        task.await.unwrap();
        let (delivery, ack) = EventDelivery::acknowledged(MigrationEvent::Ended {
            uid: "u2".into(),
            aborted: true,
            migration: None,
        });
        let _ = tx.send(delivery).await;
        assert!(ack.await.is_err());
        assert_eq!(shared.active(), 0, "shutdown tore everything down");
    }

    #[test]
    fn a_late_start_of_an_ended_or_replaced_migration_changes_nothing() {
        within(late_start_body);
    }

    async fn late_start_body() {
        let core = core();
        let shared = core.shared().clone();
        let dst: SocketAddr = "10.2.0.2:49152".parse().unwrap();
        let m = |id: &str| Migration {
            id: id.into(),
            ..migration(Role::Target)
        };
        assert_eq!(
            core.handle(MigrationEvent::Started(m("m1"))).await,
            Handled::Started
        );
        assert_eq!(
            core.handle(MigrationEvent::Started(m("m2"))).await,
            Handled::Started
        );
        let m2 = shared
            .target_handles(&UidDigest::of("u1"), dst)
            .expect("m2 active");
        assert_eq!(m2.migration.id, "m2");
        // m2 replaced m1: a late start of m1 neither stops m2 nor comes back.
        assert_eq!(
            core.handle(MigrationEvent::Started(m("m1"))).await,
            Handled::Stale
        );
        assert!(!m2.cancel.is_cancelled());
        // A changed report of the active migration (another port published) restarts it and
        // is no late start.
        let wider = Migration {
            ports: vec![49152, 49153, 49154],
            ..m("m2")
        };
        assert_eq!(
            core.handle(MigrationEvent::Started(wider.clone())).await,
            Handled::Started
        );
        assert!(m2.cancel.is_cancelled(), "the narrower m2 was replaced");
        assert_eq!(
            core.handle(MigrationEvent::Started(wider)).await,
            Handled::AlreadyStarted
        );
        // A named end makes a later start of it stale, even of one never seen starting here.
        let end = |id: &str| MigrationEvent::Ended {
            uid: "u1".into(),
            aborted: false,
            migration: Some(id.into()),
        };
        assert_eq!(core.handle(end("m2")).await, Handled::Ended);
        assert_eq!(
            core.handle(MigrationEvent::Started(m("m2"))).await,
            Handled::Stale
        );
        assert_eq!(core.handle(end("m3")).await, Handled::Ended);
        assert_eq!(
            core.handle(MigrationEvent::Started(m("m3"))).await,
            Handled::Stale
        );
        assert_eq!(shared.active(), 0);
        // Producers that do not know the migration (empty id) are never stale.
        let anonymous = m("");
        assert_eq!(
            core.handle(MigrationEvent::Started(anonymous.clone()))
                .await,
            Handled::Started
        );
        let unnamed_end = MigrationEvent::Ended {
            uid: "u1".into(),
            aborted: true,
            migration: None,
        };
        assert_eq!(core.handle(unnamed_end).await, Handled::Ended);
        assert_eq!(
            core.handle(MigrationEvent::Started(anonymous)).await,
            Handled::Started
        );
        assert_eq!(shared.metrics.migrations_active.get(), 1);
    }

    #[test]
    fn a_late_start_of_an_older_migration_never_seen_changes_nothing() {
        within(older_start_body);
    }

    async fn older_start_body() {
        let core = core();
        let shared = core.shared().clone();
        let dst: SocketAddr = "10.2.0.2:49152".parse().unwrap();
        let m = |id: &str, started: &str| Migration {
            id: id.into(),
            started: Some(started.into()),
            ..migration(Role::Target)
        };
        let second = m("m2", "2026-11-30T05:10:00Z");
        assert_eq!(
            core.handle(MigrationEvent::Started(second)).await,
            Handled::Started
        );
        let active = shared
            .target_handles(&UidDigest::of("u1"), dst)
            .expect("m2 active");
        // m1 started before m2 and was never seen here (a gateway restart, a missed hook):
        // its late start leaves m2 alone.
        let first = m("m1", "2026-11-30T05:00:00Z");
        assert_eq!(
            core.handle(MigrationEvent::Started(first)).await,
            Handled::Stale
        );
        assert!(!active.cancel.is_cancelled());
        assert_eq!(
            shared
                .target_handles(&UidDigest::of("u1"), dst)
                .unwrap()
                .migration
                .id,
            "m2"
        );
        assert_eq!(shared.metrics.late_starts.get(), 1);
        // A later one replaces it; so does one of the same second (no order claimed).
        let third = m("m3", "2026-11-30T05:10:00Z");
        assert_eq!(
            core.handle(MigrationEvent::Started(third)).await,
            Handled::Started
        );
        assert!(active.cancel.is_cancelled());
        assert_eq!(
            shared
                .target_handles(&UidDigest::of("u1"), dst)
                .unwrap()
                .migration
                .id,
            "m3"
        );
    }
}

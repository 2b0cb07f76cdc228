//! The process runtime every long-running binary runs in: the admin endpoint
//! ([`crate::admin`]), the shutdown signals, and the set of tasks that shutdown drains.
//!
//! ```text
//!  Builder ──build──> Runtime ──run(main)──────────────────────────────────────────────┐
//!   admin bound         │ admin serving (/live, /ready gates, /metrics)                 │
//!   signals installed   │ main runs; it spawns named tasks on Tasks                      │
//!                       ▼                                                                │
//!  SIGTERM/SIGINT (or the shutdown token, or main returning):                           │
//!   1. /ready fails ("draining")                                                         │
//!   2. the drain delay passes (the process keeps serving; only if it was ready)          │
//!   3. Tasks::shutdown() is cancelled: main and every task stop                          │
//!   4. run waits for main and every task, up to the drain timeout; late tasks are       │
//!      aborted, and every task that failed, panicked or was aborted is logged by name   │
//!   5. the admin endpoint stops last                                     <──────────────┘
//!  A second signal exits at once (status 130).
//! ```
//!
//! No task is left detached: whatever a binary spawns goes through [`Tasks::spawn`] (or
//! [`Tasks::adopt`] for a task another module spawned and handed back), into one
//! [`tokio::task::JoinSet`] that [`Runtime::run`] owns.
//!
//! ```
//! # async fn example() -> Result<(), rdma_streams_common::runtime::Error> {
//! use rdma_streams_common::runtime::Runtime;
//!
//! let rt = Runtime::builder()
//!     .admin(Some(([127, 0, 0, 1], 0).into()))
//!     .with_signals()
//!     .build()
//!     .await?;
//! let cache = rt.readiness().gate("cache");
//! let tasks = rt.tasks().clone();
//! rt.run(async move {
//!     let stop = tasks.shutdown().clone();
//!     tasks.spawn("cache", async move {
//!         cache.set(true);
//!         stop.cancelled().await;
//!     });
//!     // ... serve until tasks.shutdown() is cancelled ...
//! #   tasks.shutdown().cancel();
//!     tasks.shutdown().cancelled().await;
//!     Ok::<_, rdma_streams_common::runtime::Error>(())
//! })
//! .await
//! # }
//! ```

use std::{collections::HashMap, future::Future, net::SocketAddr, pin::Pin, time::Duration};

use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::mpsc,
    task::{JoinHandle, JoinSet},
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{
    admin::{self, BindError, MetricsEndpoint, Readiness},
    report::Report,
};

/// How long [`Runtime::run`] waits for main and the tasks once they were told to stop, unless
/// the binary says otherwise: within Kubernetes' default 30 s termination grace period.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(25);

/// How long the admin endpoint may take to finish its last requests.
const ADMIN_STOP_GRACE: Duration = Duration::from_secs(2);

/// Exit status after a second signal.
pub const SECOND_SIGNAL_EXIT: i32 = 130;

/// What a task may fail with.
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

/// Builds a [`Runtime`].
#[derive(Debug)]
#[must_use]
pub struct Builder {
    admin: Option<SocketAddr>,
    signals: bool,
    trigger: Option<CancellationToken>,
    drain_delay: Duration,
    drain_timeout: Duration,
}

/// The runtime of a process: see the module doc.
pub struct Runtime {
    readiness: Readiness,
    metrics: MetricsEndpoint,
    tasks: Tasks,
    spawned: mpsc::UnboundedReceiver<Spawned>,
    admin: Option<(tokio::net::TcpListener, SocketAddr)>,
    signals: Option<Signals>,
    trigger: CancellationToken,
    drain_delay: Duration,
    drain_timeout: Duration,
}

/// Spawns named tasks into the runtime's task set; cloneable, usable from any task.
#[derive(Clone, Debug)]
pub struct Tasks {
    tx: mpsc::UnboundedSender<Spawned>,
    shutdown: CancellationToken,
}

/// What a task returns: `()`, or a `Result` whose error is reported by name.
pub trait TaskOutput: Send + 'static {
    fn into_result(self) -> Result<(), TaskError>;
}

/// The runtime could not start, or shutdown did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Admin(#[from] BindError),
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// Main had not returned when the drain timeout ran out.
    #[error("shutdown did not finish within {timeout:?}")]
    DrainTimeout { timeout: Duration },
}

/// How one task ended.
#[derive(Debug)]
pub enum Ended {
    Finished,
    Failed(TaskError),
    Panicked(String),
    /// Aborted (by the drain timeout).
    Aborted,
}

/// The tasks a runtime ran, after a drain.
#[derive(Debug, Default)]
pub struct Drained {
    /// Tasks that failed or panicked, by name, with why.
    pub failed: Vec<(String, String)>,
    /// Tasks still running when the timeout ran out (aborted), by name.
    pub aborted: Vec<String>,
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;

struct Spawned {
    name: String,
    future: BoxFuture,
}

/// The task set: a [`JoinSet`] whose tasks have names.
#[derive(Default)]
pub struct TaskSet {
    set: JoinSet<Result<(), TaskError>>,
    names: HashMap<tokio::task::Id, String>,
    drained: Drained,
}

struct Signals {
    term: Signal,
    int: Signal,
}

// === impl Builder ===

impl Default for Builder {
    fn default() -> Self {
        Self {
            admin: None,
            signals: false,
            trigger: None,
            drain_delay: Duration::ZERO,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

impl Builder {
    /// Serve the admin endpoint on `addr` (`--admin-listen`); none when `None`.
    pub fn admin(mut self, addr: Option<SocketAddr>) -> Self {
        self.admin = addr;
        self
    }

    /// Drain on SIGTERM or SIGINT (a second one exits at once). Off by default: tests and
    /// embedders use [`Builder::with_shutdown`].
    pub fn with_signals(mut self) -> Self {
        self.signals = true;
        self
    }

    /// Drain once `token` is cancelled (as on a signal).
    pub fn with_shutdown(mut self, token: CancellationToken) -> Self {
        self.trigger = Some(token);
        self
    }

    /// How long `/ready` fails before main and the tasks are told to stop, so that Service
    /// endpoints stop routing here first; skipped when the process was not ready anyway.
    /// Default: none.
    pub fn drain_delay(mut self, delay: Duration) -> Self {
        self.drain_delay = delay;
        self
    }

    /// How long main and the tasks may take to stop ([`DEFAULT_DRAIN_TIMEOUT`]).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Binds the admin endpoint and installs the signal handlers; nothing runs until
    /// [`Runtime::run`].
    pub async fn build(self) -> Result<Runtime, Error> {
        let admin = match self.admin {
            Some(addr) => {
                let listener = admin::bind(addr).await?;
                let local = listener
                    .local_addr()
                    .map_err(|source| BindError { addr, source })?;
                Some((listener, local))
            }
            None => None,
        };
        let signals = if self.signals {
            Some(Signals {
                term: signal(SignalKind::terminate()).map_err(Error::Signals)?,
                int: signal(SignalKind::interrupt()).map_err(Error::Signals)?,
            })
        } else {
            None
        };
        let (tx, spawned) = mpsc::unbounded_channel();
        Ok(Runtime {
            readiness: Readiness::new(),
            metrics: MetricsEndpoint::new(),
            tasks: Tasks {
                tx,
                shutdown: CancellationToken::new(),
            },
            spawned,
            admin,
            signals,
            trigger: self.trigger.unwrap_or_default(),
            drain_delay: self.drain_delay,
            drain_timeout: self.drain_timeout,
        })
    }
}

// === impl Runtime ===

impl Runtime {
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// `/ready`: register the gates here.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// `/metrics`: publish the registry here once it is complete.
    pub fn metrics(&self) -> &MetricsEndpoint {
        &self.metrics
    }

    /// Where tasks are spawned, and the token that tells them to stop.
    pub fn tasks(&self) -> &Tasks {
        &self.tasks
    }

    /// The admin endpoint's bound address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(_, addr)| *addr)
    }

    /// Serves the admin endpoint, runs `main` and the tasks it spawns, and drains them all on
    /// shutdown (see the module doc). `main` must return once [`Tasks::shutdown`] is
    /// cancelled; its result is the result. A task's failure is logged when it happens and
    /// again in the closing summary; it does not end the process.
    pub async fn run<T, E>(self, main: impl Future<Output = Result<T, E>>) -> Result<T, E>
    where
        E: From<Error>,
    {
        let Runtime {
            readiness,
            metrics,
            tasks,
            mut spawned,
            admin,
            mut signals,
            trigger,
            drain_delay,
            drain_timeout,
        } = self;
        let shutdown = tasks.shutdown.clone();
        drop(tasks);
        // Not in the task set: it must outlive every task, and stops last.
        let admin_stop = CancellationToken::new();
        let admin_task = admin.map(|(listener, _)| {
            tokio::spawn(admin::serve(
                listener,
                metrics,
                readiness.clone(),
                admin_stop.clone(),
            ))
        });
        let mut set = TaskSet::default();
        let mut main = std::pin::pin!(main);

        // Running, until a signal, the trigger, or main's end.
        let mut result = loop {
            tokio::select! {
                r = &mut main => break Some(r),
                name = next_signal(&mut signals) => {
                    info!(signal = name, "draining");
                    break None;
                }
                () = trigger.cancelled() => {
                    info!("draining");
                    break None;
                }
                Some(s) = spawned.recv() => set.spawn_boxed(s.name, s.future),
                Some(_) = set.join_next() => {}
            }
        };
        // A process that was not ready is in no Service's endpoints: no delay for it.
        let was_ready = readiness.is_ready();
        readiness.drain();

        // Still serving, but not ready, for the drain delay.
        if result.is_none() && was_ready && !drain_delay.is_zero() {
            info!(delay = ?drain_delay, "not ready; stopping after the drain delay");
            let delay = tokio::time::sleep(drain_delay);
            tokio::pin!(delay);
            loop {
                tokio::select! {
                    r = &mut main => { result = Some(r); break; }
                    () = &mut delay => break,
                    _ = next_signal(&mut signals) => exit_on_second_signal(),
                    Some(s) = spawned.recv() => set.spawn_boxed(s.name, s.future),
                    Some(_) = set.join_next() => {}
                }
            }
        }

        // Stopping: main and every task, within the drain timeout.
        shutdown.cancel();
        let deadline = tokio::time::sleep(drain_timeout);
        tokio::pin!(deadline);
        let mut timed_out = false;
        loop {
            while let Ok(s) = spawned.try_recv() {
                set.spawn_boxed(s.name, s.future);
            }
            if result.is_some() && set.is_empty() {
                break;
            }
            tokio::select! {
                r = &mut main, if result.is_none() => result = Some(r),
                Some(s) = spawned.recv() => set.spawn_boxed(s.name, s.future),
                Some(_) = set.join_next() => {}
                _ = next_signal(&mut signals) => exit_on_second_signal(),
                () = &mut deadline => { timed_out = true; break; }
            }
        }
        if timed_out {
            set.abort_all().await;
        }
        let drained = set.into_drained();
        if !drained.failed.is_empty() {
            let names: Vec<&str> = drained.failed.iter().map(|(n, _)| n.as_str()).collect();
            warn!(tasks = ?names, "tasks failed during the run");
        }

        // The admin endpoint last.
        admin_stop.cancel();
        if let Some(mut task) = admin_task {
            match tokio::time::timeout(ADMIN_STOP_GRACE, &mut task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => error!(error = %Report(&error), "admin endpoint failed"),
                Ok(Err(error)) => error!(error = %Report(&error), "admin endpoint task failed"),
                Err(_) => {
                    warn!("admin endpoint did not stop in time; aborted");
                    task.abort();
                }
            }
        }
        match result {
            Some(r) => r,
            None => {
                error!(timeout = ?drain_timeout, "main did not stop in time");
                Err(Error::DrainTimeout {
                    timeout: drain_timeout,
                }
                .into())
            }
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("admin", &self.admin_addr())
            .field("readiness", &self.readiness)
            .field("drain_delay", &self.drain_delay)
            .field("drain_timeout", &self.drain_timeout)
            .finish_non_exhaustive()
    }
}

/// The next SIGTERM or SIGINT (never, without signal handlers).
async fn next_signal(signals: &mut Option<Signals>) -> &'static str {
    match signals {
        Some(s) => tokio::select! {
            _ = s.term.recv() => "SIGTERM",
            _ = s.int.recv() => "SIGINT",
        },
        None => std::future::pending().await,
    }
}

fn exit_on_second_signal() -> ! {
    warn!("second signal: exiting without draining");
    std::process::exit(SECOND_SIGNAL_EXIT)
}

// === impl Tasks ===

impl Tasks {
    /// Runs `future` as the task `name` until it ends; shutdown waits for it. It should end
    /// soon after [`Tasks::shutdown`] is cancelled.
    pub fn spawn<F>(&self, name: impl Into<String>, future: F)
    where
        F: Future + Send + 'static,
        F::Output: TaskOutput,
    {
        let name = name.into();
        let future: BoxFuture = Box::pin(async move { future.await.into_result() });
        if self.tx.send(Spawned { name, future }).is_err() {
            // The runtime has ended: there is nothing left to run it.
            tracing::debug!("task spawned after the runtime ended: dropped");
        }
    }

    /// Tracks a task another module spawned and handed back (aborted with the set).
    pub fn adopt<T: TaskOutput>(&self, name: impl Into<String>, handle: JoinHandle<T>) {
        let guard = AbortOnDrop(handle);
        self.spawn(name, async move {
            let mut guard = guard;
            match (&mut guard.0).await {
                Ok(output) => output.into_result(),
                Err(error) if error.is_panic() => Err(panic_message(error.into_panic()).into()),
                Err(error) => Err(error.into()),
            }
        });
    }

    /// Cancelled when tasks must stop (after the drain delay).
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }
}

/// Aborts the adopted task when its tracking task is aborted.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// === impl TaskOutput ===

impl TaskOutput for () {
    fn into_result(self) -> Result<(), TaskError> {
        Ok(())
    }
}

impl<E: Into<TaskError> + Send + 'static> TaskOutput for Result<(), E> {
    fn into_result(self) -> Result<(), TaskError> {
        self.map_err(Into::into)
    }
}

// === impl TaskSet ===

impl TaskSet {
    /// Runs `future` as the task `name`.
    pub fn spawn<F>(&mut self, name: impl Into<String>, future: F)
    where
        F: Future + Send + 'static,
        F::Output: TaskOutput,
    {
        self.spawn_boxed(
            name.into(),
            Box::pin(async move { future.await.into_result() }),
        );
    }

    fn spawn_boxed(&mut self, name: String, future: BoxFuture) {
        let handle = self.set.spawn(future);
        self.names.insert(handle.id(), name);
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The names of the tasks still running.
    pub fn running(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.values().cloned().collect();
        names.sort();
        names
    }

    /// The next task to end, with its name; a failure is logged and kept for
    /// [`TaskSet::into_drained`]. `None` when the set is empty.
    pub async fn join_next(&mut self) -> Option<(String, Ended)> {
        let (id, ended) = match self.set.join_next_with_id().await? {
            Ok((id, Ok(()))) => (id, Ended::Finished),
            Ok((id, Err(error))) => (id, Ended::Failed(error)),
            Err(error) => {
                let id = error.id();
                if error.is_panic() {
                    (id, Ended::Panicked(panic_message(error.into_panic())))
                } else {
                    (id, Ended::Aborted)
                }
            }
        };
        let name = self.names.remove(&id).unwrap_or_default();
        match &ended {
            Ended::Finished => tracing::debug!(task = %name, "task ended"),
            Ended::Failed(error) => {
                error!(task = %name, error = %Report(error.as_ref()), "task failed");
                self.drained
                    .failed
                    .push((name.clone(), Report(error.as_ref()).to_string()));
            }
            Ended::Panicked(message) => {
                error!(task = %name, panic = %message, "task panicked");
                self.drained
                    .failed
                    .push((name.clone(), format!("panicked: {message}")));
            }
            Ended::Aborted => {}
        }
        Some((name, ended))
    }

    /// Aborts every task still running and waits for them; their names are reported.
    pub async fn abort_all(&mut self) {
        let running = self.running();
        if !running.is_empty() {
            warn!(tasks = ?running, "tasks did not stop in time; aborted");
        }
        self.set.abort_all();
        while self.join_next().await.is_some() {}
        self.drained.aborted.extend(running);
    }

    /// Waits up to `timeout` for every task to end, then aborts the rest.
    pub async fn drain(mut self, timeout: Duration) -> Drained {
        let all = async { while self.join_next().await.is_some() {} };
        if tokio::time::timeout(timeout, all).await.is_err() {
            self.abort_all().await;
        }
        self.into_drained()
    }

    /// What ended badly so far.
    pub fn into_drained(mut self) -> Drained {
        std::mem::take(&mut self.drained)
    }
}

impl std::fmt::Debug for TaskSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSet")
            .field("running", &self.running())
            .finish_non_exhaustive()
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_owned(),
            Err(_) => "(no message)".to_owned(),
        },
    }
}

mod executor;
pub use executor::{Threads, executor};

#[cfg(test)]
mod tests;

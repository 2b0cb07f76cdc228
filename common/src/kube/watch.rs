//! One way to watch Kubernetes objects: kube-runtime's [`watcher()`] behind its default
//! backoff ([`WatchStreamExt::default_backoff`]: 0.8 s doubling to 30 s, jittered, back to
//! 0.8 s at the next event), with
//! - its errors logged, never returned: a failed LIST or WATCH is retried after the backoff,
//!   a `410 Gone` relists; a 403 (RBAC grants no list or watch) is warned once, then logged
//!   at debug until an event arrives, since only a change of the RBAC rules ends it;
//! - `Init` (a list begins) delivered once the LIST has answered, not before each attempt, so
//!   that failed LISTs back off as failed WATCHes do;
//! - a [`Synced`] signal, true from the first full list on (the first `InitDone`);
//! - an end at shutdown: once the token is cancelled the stream yields `None`, without
//!   waiting for a backoff or an API answer.
//!
//! [`Watch`] is the stream of events, for code that acts on each event. [`Cache`] keeps the
//! objects in a kube-runtime [`reflector`] [`Store`] for lookups; its `Watch` fills the store
//! as it is polled, so a cache's owner runs [`Watch::run`] on a task.
//!
//! Log lines come from a `watch` span that names what is watched: the kind, the namespace and
//! the selectors (`watch{kind=Secret namespace="ns" fields="metadata.name=ca"}: ...`).

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{
    Stream, StreamExt,
    future::ready,
    stream::{self, BoxStream},
};
use kube::{
    Api, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Span, debug, info, info_span, warn};

use crate::report::Report;

#[cfg(test)]
mod tests;

/// Whether a watch has received its first full list. Cheap to clone.
#[derive(Clone)]
pub struct Synced(watch::Receiver<bool>);

impl Synced {
    /// A signal that is synced already: for a cache with no API server behind it.
    pub fn ready() -> Self {
        Self(watch::channel(true).1)
    }

    /// Whether the first full list has been received.
    pub fn is_synced(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until synced: `true` once synced, `false` if the watch stopped (shutdown) before.
    pub async fn wait(&self) -> bool {
        self.0.clone().wait_for(|synced| *synced).await.is_ok()
    }
}

impl fmt::Debug for Synced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Synced").field(&self.is_synced()).finish()
    }
}

/// The events of a watch, until shutdown; see the module docs.
#[must_use = "a watch does nothing unless polled"]
pub struct Watch<K> {
    /// `None` once ended.
    events: Option<BoxStream<'static, Event<K>>>,
    synced: Synced,
    span: Span,
}

impl<K> Watch<K>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    /// Watches the objects of `api` that `config` selects, until `shutdown` is cancelled.
    pub fn new(api: Api<K>, config: watcher::Config, shutdown: CancellationToken) -> Self {
        let span = span_for(&api, &config);
        Self::over(watcher::watcher(api, config), span, shutdown)
    }
}

impl<K: Send + 'static> Watch<K> {
    /// The watch of `events` (a watcher, maybe behind a reflector): backoff, logging, synced.
    fn over(
        events: impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
        span: Span,
        shutdown: CancellationToken,
    ) -> Self {
        let (synced_tx, synced) = watch::channel(false);
        let mut log = ErrorLog::default();
        let events = init_after_list(events)
            .default_backoff()
            .filter_map(move |item| {
                ready(match item {
                    Ok(event) => {
                        log.recovered();
                        if let Event::InitDone = event {
                            if synced_tx.send_replace(true) {
                                debug!("watch relisted");
                            } else {
                                info!("watch synced");
                            }
                        }
                        Some(event)
                    }
                    Err(error) => {
                        log.failed(&error);
                        None
                    }
                })
            })
            .take_until(shutdown.cancelled_owned())
            .boxed();
        Self {
            events: Some(events),
            synced: Synced(synced),
            span,
        }
    }

    /// Whether (and when) the first full list has arrived.
    pub fn synced(&self) -> Synced {
        self.synced.clone()
    }

    /// Polls the watch until shutdown, dropping its events: the task of a [`Cache`].
    pub async fn run(mut self) {
        while self.next().await.is_some() {}
    }
}

impl<K> Stream for Watch<K> {
    type Item = Event<K>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event<K>>> {
        let this = self.get_mut();
        let Some(events) = this.events.as_mut() else {
            return Poll::Ready(None);
        };
        // kube-runtime's own log lines (a 403, a backoff) also name the watch.
        let _entered = this.span.enter();
        let next = events.poll_next_unpin(cx);
        if let Poll::Ready(None) = next {
            debug!("watch stopped");
            // Drops the watcher and the synced sender: a `Synced::wait` still pending ends.
            this.events = None;
        }
        next
    }
}

impl<K> fmt::Debug for Watch<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("synced", &self.synced.is_synced())
            .finish_non_exhaustive()
    }
}

/// Objects kept by a watch, for lookups: a kube-runtime reflector [`Store`] and its
/// [`Synced`]. Cheap to clone.
pub struct Cache<K: Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    store: Store<K>,
    synced: Synced,
}

impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Clone + std::hash::Hash + Eq,
{
    /// Watches the objects of `api` that `config` selects into a store, until `shutdown` is
    /// cancelled. `slim` trims each object before it is stored (drop what lookups never read:
    /// the store holds every object). The store fills while the returned [`Watch`] is polled.
    pub fn new(
        api: Api<K>,
        config: watcher::Config,
        slim: impl FnMut(&mut K) + Send + 'static,
        shutdown: CancellationToken,
    ) -> (Self, Watch<K>) {
        let span = span_for(&api, &config);
        let (store, writer) = reflector::store();
        let events = reflector::reflector(writer, watcher::watcher(api, config).modify(slim));
        let watch = Watch::over(events, span, shutdown);
        let cache = Self {
            store,
            synced: watch.synced(),
        };
        (cache, watch)
    }
}

impl<K: Resource + 'static> Cache<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    /// The objects.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Whether the store holds the first full list yet.
    pub fn synced(&self) -> &Synced {
        &self.synced
    }
}

impl<K: Resource + 'static> Clone for Cache<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            synced: self.synced.clone(),
        }
    }
}

impl<K: Resource + Clone + 'static> fmt::Debug for Cache<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("objects", &self.store.len())
            .field("synced", &self.synced.is_synced())
            .finish()
    }
}

/// The `watch` span of the log lines about a watch of `api` with `config`.
fn span_for<K>(api: &Api<K>, config: &watcher::Config) -> Span
where
    K: Resource,
    K::DynamicType: Default,
{
    info_span!(
        "watch",
        kind = %K::kind(&K::DynamicType::default()),
        namespace = api.namespace(),
        labels = config.label_selector.as_deref(),
        fields = config.field_selector.as_deref(),
    )
}

/// Holds back each `Init` until the LIST it announces has answered, dropping it if the LIST
/// failed. kube's watcher sends `Init` before every LIST attempt and `default_backoff` starts
/// over at any event, so a LIST that keeps failing would be retried every 0.8 to 1.6 s for
/// ever; with `Init` held back, the backoff grows to 30 s until a LIST succeeds.
fn init_after_list<K>(
    events: impl Stream<Item = watcher::Result<Event<K>>>,
) -> impl Stream<Item = watcher::Result<Event<K>>> {
    events
        .scan(false, |held, item| {
            let out = match item {
                Ok(Event::Init) => {
                    *held = true;
                    Vec::new()
                }
                Err(error) => {
                    *held = false;
                    vec![Err(error)]
                }
                Ok(event) if std::mem::take(held) => vec![Ok(Event::Init), Ok(event)],
                Ok(event) => vec![Ok(event)],
            };
            ready(Some(stream::iter(out)))
        })
        .flatten()
}

/// How watch errors are logged: each at WARN, except that a run of 403s is warned once.
#[derive(Default)]
struct ErrorLog {
    /// The last error was a 403 and has been warned.
    forbidden: bool,
}

impl ErrorLog {
    fn failed(&mut self, error: &watcher::Error) {
        let forbidden = is_forbidden(error);
        let error = Report(error);
        if !forbidden {
            self.forbidden = false;
            warn!(%error, "watch failed; retrying with backoff");
        } else if !self.forbidden {
            self.forbidden = true;
            warn!(%error, "not allowed to list or watch (RBAC); retrying with backoff");
        } else {
            debug!(%error, "still not allowed to list or watch");
        }
    }

    fn recovered(&mut self) {
        self.forbidden = false;
    }
}

/// True for an API answer 403 (list or watch not granted).
fn is_forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.is_forbidden(),
        watcher::Error::WatchError(status) => status.is_forbidden(),
        _ => false,
    }
}

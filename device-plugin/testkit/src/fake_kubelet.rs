//! A fake kubelet on the real protos, for tests and benchmarks.
//!
//! It behaves like kubelet's device manager where plugins can tell: it serves
//! `v1beta1.Registration` on `<root>/device-plugins/kubelet.sock`, validates Register like
//! kubelet (version, extended resource name, bare endpoint file name), answers at once and then
//! dials the plugin, calls GetDevicePluginOptions and keeps one ListAndWatch stream per
//! resource, each message replacing the whole list. [`FakeKubelet::restart`] does what a
//! kubelet restart does to the folder: every socket but the checkpoint is deleted and a new
//! `kubelet.sock` is served. It can also act as the plugin watcher (`plugins_registry/`).

use std::{
    collections::BTreeMap,
    io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use rdma_kubelet_api::{
    self as api, pluginregistration as pr,
    v1beta1::{
        self as pb,
        device_plugin_client::DevicePluginClient,
        registration_server::{Registration, RegistrationServer},
    },
};
use rdma_streams_common::{names::validate_extended_resource_name, uds};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Channel};

/// kubelet's dial timeout for a plugin endpoint.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the fake kubelet knows about one resource's plugin.
#[derive(Debug, Default)]
struct PluginState {
    endpoint: PathBuf,
    registrations: usize,
    last_registered: Option<Instant>,
    options: Option<pb::DevicePluginOptions>,
    devices: Option<Vec<pb::Device>>,
    /// ListAndWatch messages received over every connection.
    updates: u64,
    /// When the current list arrived.
    last_update: Option<Instant>,
    stream_open: bool,
    client: Option<DevicePluginClient<Channel>>,
    conn: Option<JoinHandle<()>>,
    /// Bumped by every registration: a connection task of an older one changes nothing.
    generation: u64,
}

#[derive(Debug, Default)]
struct Inner {
    plugins: BTreeMap<String, PluginState>,
    reject_next: usize,
    rejected: usize,
    fail_next_notify: usize,
    /// When `kubelet.sock` was last bound.
    served_at: Option<Instant>,
    /// Plugin-watcher sockets already handled, by path and file identity.
    watched: BTreeMap<PathBuf, uds::FileId>,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    /// Bumped on every change, so waiters wake up.
    changed: watch::Sender<u64>,
}

impl Shared {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let r = f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.send_modify(|n| *n += 1);
        r
    }

    fn read<R>(&self, f: impl FnOnce(&Inner) -> R) -> R {
        f(&self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The fake kubelet. Dropping it stops its server and connections.
pub struct FakeKubelet {
    root: PathBuf,
    shared: Arc<Shared>,
    server: Option<(CancellationToken, JoinHandle<()>)>,
    watcher: Option<CancellationToken>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            stop.cancel();
            task.abort();
        }
        if let Some(w) = self.watcher.take() {
            w.cancel();
        }
        self.shared.with(|i| {
            for p in i.plugins.values_mut() {
                if let Some(c) = p.conn.take() {
                    c.abort();
                }
            }
        });
    }
}

struct RegistrationSvc {
    shared: Arc<Shared>,
    dir: PathBuf,
}

#[tonic::async_trait]
impl Registration for RegistrationSvc {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let req = request.into_inner();
        if req.version != api::VERSION {
            return Err(Status::invalid_argument(format!(
                "Unsupported version {:?}: supported versions are [v1beta1]",
                req.version
            )));
        }
        // kubelet's `IsExtendedResourceName`, the rule the plugin and the injector check with.
        if validate_extended_resource_name(&req.resource_name).is_err() {
            return Err(Status::invalid_argument(format!(
                "invalid extended resource name {:?}",
                req.resource_name
            )));
        }
        if req.endpoint.is_empty() || req.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a file name in the device plugin folder",
                req.endpoint
            )));
        }
        let injected = self.shared.with(|i| {
            if i.reject_next > 0 {
                i.reject_next -= 1;
                i.rejected += 1;
                true
            } else {
                false
            }
        });
        if injected {
            return Err(Status::unavailable("injected registration failure"));
        }
        let endpoint = self.dir.join(&req.endpoint);
        connect_plugin(&self.shared, req.resource_name, endpoint, None);
        Ok(Response::new(pb::Empty {}))
    }
}

/// Records a registration and (like kubelet's `addEndpoint`, asynchronously) dials the plugin.
/// `watcher_socket` is the plugin-watcher socket to call NotifyRegistrationStatus on.
fn connect_plugin(
    shared: &Arc<Shared>,
    resource: String,
    endpoint: PathBuf,
    watcher_socket: Option<PathBuf>,
) {
    // The registration is recorded (and the old connection dropped) before the new connection
    // task starts: on a multi-threaded runtime the task can open its stream at once, and its
    // `stream_open = true` must not be overwritten by this bookkeeping.
    let generation = shared.with(|i| {
        let p = i.plugins.entry(resource.clone()).or_default();
        if let Some(old) = p.conn.take() {
            old.abort();
        }
        p.endpoint = endpoint.clone();
        p.registrations += 1;
        p.last_registered = Some(Instant::now());
        p.stream_open = false;
        p.generation += 1;
        p.generation
    });
    let task_shared = shared.clone();
    let task_resource = resource.clone();
    let task_endpoint = endpoint.clone();
    let task = tokio::spawn(async move {
        let result = run_connection(
            &task_shared,
            &task_resource,
            &task_endpoint,
            watcher_socket,
            generation,
        )
        .await;
        task_shared.with(|i| {
            if let Some(p) = i.plugins.get_mut(&task_resource)
                && p.generation == generation
            {
                p.stream_open = false;
                if result.is_err() {
                    p.client = None;
                }
            }
        });
    });
    shared.with(|i| {
        let p = i.plugins.entry(resource).or_default();
        if let Some(old) = p.conn.replace(task) {
            old.abort();
        }
    });
}

async fn run_connection(
    shared: &Arc<Shared>,
    resource: &str,
    endpoint: &Path,
    watcher_socket: Option<PathBuf>,
    generation: u64,
) -> Result<(), Status> {
    let channel = uds::channel(endpoint, DIAL_TIMEOUT, None)
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut client = DevicePluginClient::new(channel);
    let options = client
        .get_device_plugin_options(pb::Empty {})
        .await?
        .into_inner();
    let mut stream = client.list_and_watch(pb::Empty {}).await?.into_inner();
    let current = shared.with(|i| {
        let p = i.plugins.entry(resource.to_string()).or_default();
        if p.generation != generation {
            return false;
        }
        p.options = Some(options);
        p.client = Some(client.clone());
        p.stream_open = true;
        true
    });
    if !current {
        // A newer registration replaced this one while it connected.
        return Ok(());
    }
    if let Some(sock) = watcher_socket {
        let fail = shared.with(|i| {
            let f = i.fail_next_notify > 0;
            i.fail_next_notify = i.fail_next_notify.saturating_sub(1);
            f
        });
        let ch = uds::channel(&sock, DIAL_TIMEOUT, Some(DIAL_TIMEOUT))
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        pr::registration_client::RegistrationClient::new(ch)
            .notify_registration_status(pr::RegistrationStatus {
                plugin_registered: !fail,
                error: if fail {
                    "injected registration failure".into()
                } else {
                    String::new()
                },
            })
            .await?;
    }
    while let Some(msg) = stream.message().await? {
        shared.with(|i| {
            let p = i.plugins.entry(resource.to_string()).or_default();
            p.devices = Some(msg.devices);
            p.updates += 1;
            p.last_update = Some(Instant::now());
        });
    }
    Ok(())
}

impl FakeKubelet {
    /// Serves `kubelet.sock` in `<root>/device-plugins/` (created, with a checkpoint file).
    pub async fn start(root: &Path) -> io::Result<Self> {
        let dir = root.join("device-plugins");
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(root.join("plugins_registry"))?;
        std::fs::write(dir.join(api::KUBELET_CHECKPOINT), b"{}")?;
        let (changed, _) = watch::channel(0);
        let mut k = Self {
            root: root.to_path_buf(),
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner::default()),
                changed,
            }),
            server: None,
            watcher: None,
        };
        k.serve()?;
        Ok(k)
    }

    pub fn device_plugins_dir(&self) -> PathBuf {
        self.root.join("device-plugins")
    }

    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    fn serve(&mut self) -> io::Result<()> {
        let dir = self.device_plugins_dir();
        let listener = uds::bind_fresh(&dir.join(api::KUBELET_SOCKET))?;
        self.shared.with(|i| i.served_at = Some(Instant::now()));
        let stop = CancellationToken::new();
        let svc = RegistrationSvc {
            shared: self.shared.clone(),
            dir,
        };
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(uds::incoming(listener), s.cancelled_owned())
                .await;
        });
        self.server = Some((stop, task));
        Ok(())
    }

    /// Stops serving and drops every plugin connection, as a dying kubelet does.
    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        self.shared.with(|i| {
            for p in i.plugins.values_mut() {
                if let Some(c) = p.conn.take() {
                    c.abort();
                }
                p.client = None;
                p.stream_open = false;
            }
        });
    }

    /// A kubelet restart: stop, delete every socket in `device-plugins/` except the checkpoint
    /// (kubelet's `CleanupPluginDirectory`), serve a new `kubelet.sock`.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.stop().await;
        for entry in std::fs::read_dir(self.device_plugins_dir())?.flatten() {
            if entry.file_name() == api::KUBELET_CHECKPOINT {
                continue;
            }
            if entry.file_type().is_ok_and(|t| t.is_socket()) {
                std::fs::remove_file(entry.path())?;
            }
        }
        self.serve()
    }

    /// The next `n` Register calls fail with UNAVAILABLE.
    pub fn reject_next_registrations(&self, n: usize) {
        self.shared.with(|i| i.reject_next = n);
    }

    /// Register calls rejected so far by injection.
    pub fn rejected_registrations(&self) -> usize {
        self.shared.read(|i| i.rejected)
    }

    /// Accepted registrations of `resource`.
    pub fn registrations(&self, resource: &str) -> usize {
        self.shared
            .read(|i| i.plugins.get(resource).map_or(0, |p| p.registrations))
    }

    pub fn last_registered(&self, resource: &str) -> Option<Instant> {
        self.shared
            .read(|i| i.plugins.get(resource).and_then(|p| p.last_registered))
    }

    /// When the current `kubelet.sock` was created.
    pub fn served_at(&self) -> Option<Instant> {
        self.shared.read(|i| i.served_at)
    }

    /// When the latest ListAndWatch message of `resource` arrived.
    pub fn last_update(&self, resource: &str) -> Option<Instant> {
        self.shared
            .read(|i| i.plugins.get(resource).and_then(|p| p.last_update))
    }

    /// The latest full list of `resource`.
    pub fn devices(&self, resource: &str) -> Option<Vec<pb::Device>> {
        self.shared
            .read(|i| i.plugins.get(resource).and_then(|p| p.devices.clone()))
    }

    /// ListAndWatch messages received for `resource` so far.
    pub fn updates(&self, resource: &str) -> u64 {
        self.shared
            .read(|i| i.plugins.get(resource).map_or(0, |p| p.updates))
    }

    pub fn options(&self, resource: &str) -> Option<pb::DevicePluginOptions> {
        self.shared
            .read(|i| i.plugins.get(resource).and_then(|p| p.options))
    }

    pub fn stream_open(&self, resource: &str) -> bool {
        self.shared
            .read(|i| i.plugins.get(resource).is_some_and(|p| p.stream_open))
    }

    pub fn endpoint(&self, resource: &str) -> Option<PathBuf> {
        self.shared
            .read(|i| i.plugins.get(resource).map(|p| p.endpoint.clone()))
    }

    /// Waits until `pred` holds over the fake's state, or fails after `timeout` with `what`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Self) -> bool,
    ) -> Result<(), String> {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if pred(self) {
                return Ok(());
            }
            // Wake on a change, or at least every 50 ms (state such as sockets on disk too).
            let wake = (tokio::time::Instant::now() + Duration::from_millis(50)).min(deadline);
            let _ = tokio::time::timeout_at(wake, rx.changed()).await;
            if tokio::time::Instant::now() >= deadline {
                return if pred(self) {
                    Ok(())
                } else {
                    Err(format!("timed out after {timeout:?} waiting for {what}"))
                };
            }
        }
    }

    /// Waits for at least `n` accepted registrations of `resource` with an open stream.
    pub async fn wait_registered(
        &self,
        resource: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<(), String> {
        self.wait_for(&format!("registration #{n} of {resource}"), timeout, |k| {
            k.registrations(resource) >= n && k.stream_open(resource)
        })
        .await
    }

    /// Waits until the latest list of `resource` satisfies `pred`; returns it.
    pub async fn wait_devices(
        &self,
        resource: &str,
        timeout: Duration,
        pred: impl Fn(&[pb::Device]) -> bool,
    ) -> Result<Vec<pb::Device>, String> {
        self.wait_for(&format!("a device list of {resource}"), timeout, |k| {
            k.devices(resource).is_some_and(|d| pred(&d))
        })
        .await
        .map_err(|e| format!("{e}; last list: {:?}", self.devices(resource)))?;
        Ok(self.devices(resource).unwrap_or_default())
    }

    fn client(&self, resource: &str) -> Result<DevicePluginClient<Channel>, Status> {
        self.shared
            .read(|i| i.plugins.get(resource).and_then(|p| p.client.clone()))
            .ok_or_else(|| {
                Status::unavailable(format!("no connection to the plugin of {resource}"))
            })
    }

    /// Allocate for one container, as kubelet calls it.
    pub async fn allocate(
        &self,
        resource: &str,
        ids: &[&str],
    ) -> Result<pb::ContainerAllocateResponse, Status> {
        let resp = self
            .client(resource)?
            .allocate(pb::AllocateRequest {
                container_requests: vec![pb::ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                }],
            })
            .await?
            .into_inner();
        resp.container_responses
            .into_iter()
            .next()
            .ok_or_else(|| Status::internal("kubelet needs one container response, got none"))
    }

    /// GetPreferredAllocation for one container.
    pub async fn preferred(
        &self,
        resource: &str,
        available: &[String],
        must_include: &[String],
        size: i32,
    ) -> Result<Vec<String>, Status> {
        let resp = self
            .client(resource)?
            .get_preferred_allocation(pb::PreferredAllocationRequest {
                container_requests: vec![pb::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.to_vec(),
                    must_include_device_i_ds: must_include.to_vec(),
                    allocation_size: size,
                }],
            })
            .await?
            .into_inner();
        Ok(resp
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    /// Acts as kubelet's plugin watcher: polls `plugins_registry/` and registers every new
    /// socket (GetInfo, validate, dial the endpoint, NotifyRegistrationStatus).
    pub fn start_plugin_watcher(&mut self) {
        let stop = CancellationToken::new();
        self.watcher = Some(stop.clone());
        let shared = self.shared.clone();
        let dir = self.plugins_registry_dir();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                scan_registry(&shared, &dir).await;
            }
        });
    }

    /// The next `n` NotifyRegistrationStatus calls report failure.
    pub fn fail_next_watcher_notifications(&self, n: usize) {
        self.shared.with(|i| i.fail_next_notify = n);
    }
}

async fn scan_registry(shared: &Arc<Shared>, dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.file_type().is_socket() || entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Some(id) = uds::file_id(&path) else {
            continue;
        };
        if shared.read(|i| i.watched.get(&path) == Some(&id)) {
            continue;
        }
        shared.with(|i| i.watched.insert(path.clone(), id));
        let Ok(ch) = uds::channel(&path, DIAL_TIMEOUT, Some(DIAL_TIMEOUT)).await else {
            continue;
        };
        let Ok(info) = pr::registration_client::RegistrationClient::new(ch)
            .get_info(pr::InfoRequest {})
            .await
            .map(Response::into_inner)
        else {
            continue;
        };
        let valid = info.r#type == api::PLUGIN_TYPE_DEVICE_PLUGIN
            && info.supported_versions.iter().any(|v| v == api::VERSION)
            && validate_extended_resource_name(&info.name).is_ok();
        if valid {
            // kubelet's plugin manager: an empty endpoint means the registration socket itself.
            let endpoint = if info.endpoint.is_empty() {
                path.clone()
            } else {
                PathBuf::from(info.endpoint)
            };
            connect_plugin(shared, info.name, endpoint, Some(path));
        }
    }
}

//! Command line: `rdma-stream-injector serve` (the webhook) and `inject -f` (offline).
//!
//! Every flag is also an environment variable `RDMA_INJECTOR_<FLAG>`.

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use clap::{Args as ClapArgs, Parser, Subcommand, ValueEnum};
use prometheus_client::registry::Registry;
use rdma_streams_common::{
    args::{AdminArgs, LogArgs},
    backoff::Backoff,
    reload_metrics::ReloadStatsCollector,
    report::Report,
    runtime::{self, Runtime, Tasks},
};
use tracing::{info, warn};

use crate::{
    audit, certs,
    namespaces::NamespaceCache,
    profile::{self, Config},
    server::{Server, ServerConfig, ServerError},
    webhook::InjectorHandler,
    workloads::{self, InjectOptions},
};

#[derive(Debug, Parser)]
#[command(
    name = "rdma-stream-injector",
    version,
    about = "Mutating admission webhook and offline injector for RDMA streams"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,

    /// `--log-format`, `--log-level` (for every subcommand).
    #[command(flatten)]
    pub log: LogArgs<Env>,
}

rdma_streams_common::flag_env! {
    /// The environment variables of the shared flags: `RDMA_INJECTOR_<FLAG>`, like every other
    /// flag.
    pub enum Env = "RDMA_INJECTOR";
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the mutating admission webhook over HTTPS.
    Serve(ServeArgs),
    /// Print manifests with the injection applied, as the webhook would apply it.
    Inject(InjectArgs),
    /// List running pods that are opted in but were not injected (created while the webhook
    /// was down, say); exit status 3 if there are any (1: an error). Uses your kubeconfig.
    Audit(AuditArgs),
}

/// Whether the injector talks to the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClusterAccess {
    /// Namespace labels from a reflector; self-managed certificates possible.
    On,
    /// No API server: namespace facts come only from the AdmissionReview.
    Off,
}

/// Who provides the serving certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CertMode {
    /// Files are provided (cert-manager, a Secret volume); they are re-read when they change.
    External,
    /// The injector keeps a CA in a Secret, issues its own certificate into the `--tls-cert`
    /// folder and keeps the webhook configuration's caBundle patched.
    SelfManaged,
}

#[derive(Debug, ClapArgs)]
pub struct ServeArgs {
    /// HTTPS address of the webhook.
    #[arg(long, env = "RDMA_INJECTOR_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain (re-read when it changes, no restart).
    #[arg(long, env = "RDMA_INJECTOR_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM private key.
    #[arg(long, env = "RDMA_INJECTOR_TLS_KEY")]
    pub tls_key: PathBuf,
    /// Profiles (YAML). A missing file means the built-in default profile until it appears.
    #[arg(long, env = "RDMA_INJECTOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Talk to the API server (namespace labels, self-managed certificates) or not.
    #[arg(
        long,
        env = "RDMA_INJECTOR_CLUSTER_ACCESS",
        value_enum,
        default_value = "on"
    )]
    pub cluster_access: ClusterAccess,
    /// `--admin-listen`: `/live`, `/ready`, `/metrics` over plain HTTP; none when unset.
    #[command(flatten)]
    pub admin: AdminArgs<Env>,
    /// Certificate mode.
    #[arg(
        long,
        env = "RDMA_INJECTOR_CERT_MODE",
        value_enum,
        default_value = "external"
    )]
    pub cert_mode: CertMode,
    /// Our Service's name (self-managed certificate names).
    #[arg(
        long,
        env = "RDMA_INJECTOR_SERVICE",
        default_value = "rdma-stream-injector"
    )]
    pub service: String,
    /// Our namespace (defaults to the pod's, from the service account).
    #[arg(long, env = "RDMA_INJECTOR_NAMESPACE")]
    pub namespace: Option<String>,
    /// Our MutatingWebhookConfiguration (self-managed caBundle).
    #[arg(
        long,
        env = "RDMA_INJECTOR_WEBHOOK_CONFIG",
        default_value = "rdma-stream-injector"
    )]
    pub webhook_config: String,
    /// Largest accepted AdmissionReview body, in bytes.
    #[arg(long, env = "RDMA_INJECTOR_MAX_BODY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Per-request deadline in milliseconds (keep it below the webhook's timeoutSeconds).
    #[arg(long, env = "RDMA_INJECTOR_REQUEST_TIMEOUT_MS", default_value_t = 4000)]
    pub request_timeout_ms: u64,
    /// On SIGTERM, report not-ready and keep serving this long before draining, so Service
    /// endpoints stop routing admission calls here first (milliseconds).
    #[arg(long, env = "RDMA_INJECTOR_SHUTDOWN_DELAY_MS", default_value_t = 5000)]
    pub shutdown_delay_ms: u64,
}

#[derive(Debug, ClapArgs)]
pub struct InjectArgs {
    /// Manifest file (multi-document YAML), or `-` for standard input.
    #[arg(short = 'f', long = "filename")]
    pub file: String,
    /// Profiles (YAML); the built-in default when absent.
    #[arg(long, env = "RDMA_INJECTOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Profile for workloads that do not name one.
    #[arg(long)]
    pub profile: Option<String>,
    /// Print a unified diff against the input instead of the injected manifests.
    #[arg(long)]
    pub diff: bool,
}

#[derive(Debug, ClapArgs)]
pub struct AuditArgs {
    /// Profiles (YAML) the webhook runs with; the built-in default when absent.
    #[arg(long, env = "RDMA_INJECTOR_CONFIG", conflicts_with = "config_map")]
    pub config: Option<PathBuf>,
    /// Read the profiles from the webhook's own ConfigMap instead (`NAMESPACE/NAME`, key
    /// `profiles.yaml`), so the audit judges with exactly what the webhook injects.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub config_map: Option<String>,
    /// Only this namespace (default: all).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = AuditOutput::Text)]
    pub output: AuditOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuditOutput {
    Text,
    Json,
}

/// Failures that end the process, each saying what to fix.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Profile(#[from] profile::ProfileError),
    #[error(transparent)]
    Inject(#[from] workloads::InjectError),
    #[error("reading {path}")]
    Input {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("connecting to the API server (use --cluster-access off to run without one)")]
    Kube(#[source] kube::Error),
    #[error("reading the cluster (kubeconfig, or the in-cluster service account)")]
    Audit(#[source] kube::Error),
    #[error(transparent)]
    ConfigMap(#[from] audit::ConfigMapError),
    #[error("self-managed certificates")]
    Certs(#[from] certs::CertError),
    /// The admin endpoint, the signal handlers, or a drain that did not finish.
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error("{0}")]
    Usage(String),
    #[error("starting")]
    Io(#[from] std::io::Error),
}

impl Args {
    /// Parses the command line and runs it.
    pub fn parse_and_run() -> Result<ExitCode, RunError> {
        let args = Self::parse();
        args.log.init();
        match args.command {
            Command::Inject(inject) => run_inject(&inject),
            Command::Audit(audit) => {
                let rt = runtime::executor(runtime::Threads::Current)?;
                rt.block_on(async {
                    let client = audit_client(audit.context.as_deref()).await?;
                    run_audit(&audit, &client).await
                })
            }
            Command::Serve(serve) => {
                let rt = runtime::executor(runtime::Threads::Workers(2))?;
                let plan = serve.plan()?;
                rt.block_on(run_serve(plan, Runtime::builder().with_signals()))?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

/// `inject -f`.
pub fn run_inject(args: &InjectArgs) -> Result<ExitCode, RunError> {
    let config = match &args.config {
        Some(path) => profile::load(path)?,
        None => Config::builtin_default(),
    };
    if let Some(p) = &args.profile
        && config.profile(p).is_none()
    {
        return Err(RunError::Usage(format!(
            "unknown profile {p:?}; the config has {:?}",
            config.profile_names()
        )));
    }
    let mut text = String::new();
    let read = if args.file == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(&args.file).map(|t| text = t)
    };
    read.map_err(|source| RunError::Input {
        path: args.file.clone(),
        source,
    })?;
    let opts = InjectOptions {
        profile: args.profile.clone(),
        namespace: None,
    };
    let (out, reports) = workloads::inject_yaml(&text, &config, &opts)?;
    for r in &reports {
        info!(kind = %r.kind, name = %r.name, outcome = %r.outcome, "document");
        for w in &r.warnings {
            warn!(kind = %r.kind, name = %r.name, warning = %w, "injection warning");
        }
    }
    let printed = if args.diff {
        let before = workloads::render_documents(&workloads::parse_documents(&text)?)?;
        unified_diff(&before, &out, &args.file)
    } else {
        out
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(printed.as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// A client from the kubeconfig (`context`, or the current one), else the in-cluster config.
async fn audit_client(context: Option<&str>) -> Result<kube::Client, RunError> {
    let config = match context {
        Some(context) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(context.to_owned()),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&options).await.map_err(|e| {
                RunError::Usage(format!("kubeconfig context {context:?}: {}", Report(&e)))
            })?
        }
        None => kube::Config::infer().await.map_err(|e| {
            RunError::Usage(format!(
                "no kubeconfig and not in a cluster: {}",
                Report(&e)
            ))
        })?,
    };
    kube::Client::try_from(config).map_err(RunError::Audit)
}

/// Exit status of `audit` when a pod was not injected (1 is any error, 2 a usage error).
pub const AUDIT_FOUND_UNINJECTED: u8 = 3;

/// `audit` against the cluster `client` talks to: prints the findings; exit status
/// [`AUDIT_FOUND_UNINJECTED`] if a pod was not injected.
pub async fn run_audit(args: &AuditArgs, client: &kube::Client) -> Result<ExitCode, RunError> {
    let config = match (&args.config, &args.config_map) {
        (Some(path), _) => profile::load(path)?,
        (None, Some(reference)) => audit::profiles_from_config_map(client, reference).await?,
        (None, None) => Config::builtin_default(),
    };
    let findings = audit::audit_cluster(client, args.namespace.as_deref(), &config)
        .await
        .map_err(RunError::Audit)?;
    let printed = match args.output {
        AuditOutput::Text => audit::render_text(&findings),
        AuditOutput::Json => {
            let mut json =
                serde_json::to_string_pretty(&findings).map_err(std::io::Error::other)?;
            json.push('\n');
            json
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(printed.as_bytes())?;
    stdout.flush()?;
    let missing = findings
        .iter()
        .any(|f| f.state == audit::State::NotInjected);
    Ok(if missing {
        ExitCode::from(AUDIT_FOUND_UNINJECTED)
    } else {
        ExitCode::SUCCESS
    })
}

/// A unified diff of two renderings (both through the same serializer, so only the injection
/// shows).
fn unified_diff(before: &str, after: &str, name: &str) -> String {
    similar::TextDiff::from_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{name} (as given)"), &format!("{name} (injected)"))
        .to_string()
}

/// What `serve` runs, decided from the flags alone.
#[derive(Clone, Debug)]
pub struct ServePlan {
    /// The HTTPS webhook.
    pub server: ServerConfig,
    /// `--admin-listen`.
    pub admin: Option<SocketAddr>,
    /// `--config`, watched.
    pub profiles: Option<PathBuf>,
    /// `--cluster-access on`.
    pub cluster: bool,
    /// `--cert-mode self-managed`.
    pub self_managed: Option<SelfManaged>,
    /// `/ready` fails this long before the server drains.
    pub shutdown_delay: Duration,
}

/// Self-managed certificates: where they go and what they are for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfManaged {
    /// The `--tls-cert` folder, where the certificate and key are written.
    pub dir: PathBuf,
    /// `--service`.
    pub service: String,
    /// `--namespace` (default: the client's).
    pub namespace: Option<String>,
    /// `--webhook-config`.
    pub webhook_config: String,
}

impl ServeArgs {
    /// What to run; a combination of flags that cannot work is a usage error.
    pub fn plan(&self) -> Result<ServePlan, RunError> {
        let cluster = self.cluster_access == ClusterAccess::On;
        let self_managed = match self.cert_mode {
            CertMode::External => None,
            CertMode::SelfManaged => {
                if !cluster {
                    return Err(RunError::Usage(
                        "--cert-mode self-managed needs --cluster-access on".to_string(),
                    ));
                }
                let dir = self
                    .tls_cert
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_default();
                let names_ok = self
                    .tls_cert
                    .file_name()
                    .is_some_and(|n| n == certs::TLS_CERT_FILE)
                    && self
                        .tls_key
                        .file_name()
                        .is_some_and(|n| n == certs::TLS_KEY_FILE)
                    && self.tls_key.parent() == self.tls_cert.parent();
                if !names_ok {
                    return Err(RunError::Usage(format!(
                        "--cert-mode self-managed writes {0}/{1} and {0}/{2}: point --tls-cert and --tls-key there",
                        dir.display(),
                        certs::TLS_CERT_FILE,
                        certs::TLS_KEY_FILE
                    )));
                }
                Some(SelfManaged {
                    dir,
                    service: self.service.clone(),
                    namespace: self.namespace.clone(),
                    webhook_config: self.webhook_config.clone(),
                })
            }
        };
        let mut server = ServerConfig::new(self.listen, &self.tls_cert, &self.tls_key);
        server.admission.body_limit = self.max_body_bytes;
        server.admission.deadline = Duration::from_millis(self.request_timeout_ms);
        Ok(ServePlan {
            server,
            admin: self.admin.listen,
            profiles: self.config.clone(),
            cluster,
            self_managed,
            shutdown_delay: Duration::from_millis(self.shutdown_delay_ms),
        })
    }
}

/// `serve` in the runtime `runtime` builds: on shutdown `/ready` fails at once, the server
/// keeps answering for the shutdown delay, then drains.
pub async fn run_serve(plan: ServePlan, runtime: runtime::Builder) -> Result<(), RunError> {
    let ServePlan {
        server: config,
        admin,
        profiles,
        cluster,
        self_managed,
        shutdown_delay,
    } = plan;
    let profiles = profile::watch::spawn(profiles, profile::watch::DEFAULT_POLL)?;
    let rt = runtime
        .admin(admin)
        .drain_delay(shutdown_delay)
        .build()
        .await?;
    let readiness = rt.readiness().clone();
    // Until the server is bound and answers for its certificate itself.
    let certificate = readiness.gate("tls certificate");
    let metrics = rt.metrics().clone();
    let tasks = rt.tasks().clone();
    rt.run(async move {
        let client = if cluster {
            Some(kube::Client::try_default().await.map_err(RunError::Kube)?)
        } else {
            None
        };
        let namespaces = match &client {
            Some(client) => {
                let (cache, task) = NamespaceCache::spawn(client.clone(), tasks.shutdown().clone());
                tasks.adopt("namespace cache", task);
                let gate = readiness.gate("namespace cache");
                let c = cache.clone();
                let stop = tasks.shutdown().clone();
                tasks.spawn("namespace cache sync", async move {
                    tokio::select! {
                        synced = c.wait_synced() => if synced {
                            info!("namespace cache synced");
                            gate.set(true);
                        },
                        () = stop.cancelled() => {}
                    }
                });
                cache
            }
            None => NamespaceCache::disabled(),
        };

        let ca_metrics = self_managed.is_some().then(certs::CaMetrics::default);
        if let (Some(certs), Some(ca_metrics), Some(client)) = (&self_managed, &ca_metrics, &client)
            && !self_managed_certs(certs, client, ca_metrics, &tasks).await?
        {
            info!("shut down before the serving certificate was ready");
            return Ok(());
        }

        let handler = Arc::new(InjectorHandler {
            profiles: profiles.subscribe(),
            namespaces,
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ReloadStatsCollector::new(
            crate::server::METRICS_PREFIX,
            profiles.stats(),
        )));
        if let Some(ca_metrics) = &ca_metrics {
            ca_metrics.register(registry.sub_registry_with_prefix(crate::server::METRICS_PREFIX));
        }
        let server = Server::bind(config, handler, readiness, &mut registry).await?;
        certificate.remove();
        let _ = metrics.publish(registry);
        info!(
            listen = %server.local_addr(),
            cluster_access = if cluster { "on" } else { "off" },
            cert_mode = if self_managed.is_some() { "self-managed" } else { "external" },
            "rdma-stream-injector serving"
        );
        server.run(tasks.shutdown().clone()).await;
        drop(profiles);
        info!("rdma-stream-injector stopped");
        Ok(())
    })
    .await
}

/// Self-managed mode: CA in a Secret, our certificate in the `--tls-cert` folder, caBundle
/// patched, certificate renewed (tasks of `tasks`). `Ok(false)`: shut down before the
/// certificate was ready.
async fn self_managed_certs(
    plan: &SelfManaged,
    client: &kube::Client,
    ca_metrics: &certs::CaMetrics,
    tasks: &Tasks,
) -> Result<bool, RunError> {
    let shutdown = tasks.shutdown();
    let namespace = plan
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let cfg = certs::BootstrapConfig::new(&plan.service, &namespace, &plan.service, &plan.dir);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let boot = loop {
        match certs::bootstrap(client, &cfg).await {
            Ok(b) => break b,
            Err(e) if e.is_transient() => {
                let delay = backoff.next_delay();
                warn!(error = %Report(&e), retry_in = ?delay, "certificate bootstrap failed; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(false),
                    () = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    };
    info!(origin = ?boot.origin, "serving certificate issued");
    ca_metrics.in_use(&boot.ca);
    let ca = std::sync::Arc::new(boot.ca);
    let (ca_tx, ca_rx) = tokio::sync::watch::channel(ca.clone());
    let (bundled_tx, bundled_rx) = tokio::sync::watch::channel(None);
    tasks.spawn(
        "ca bundle",
        certs::run_ca_bundle_controller(
            client.clone(),
            plan.webhook_config.clone(),
            certs::rotation::bundle_targets(ca_rx.clone(), tasks),
            bundled_tx,
            shutdown.clone(),
        ),
    );
    tasks.spawn(
        "serving certificate renewal",
        certs::run_serving_cert_renewal(
            certs::renew::CaFeed {
                ca: ca_rx,
                bundled: bundled_rx,
                propagation: certs::renew::DEFAULT_PROPAGATION,
            },
            ca,
            cfg.identity.clone(),
            cfg.cert_dir.clone(),
            boot.serving,
            shutdown.clone(),
        ),
    );
    tasks.spawn(
        "ca follower",
        certs::run_ca_follower(
            client.clone(),
            cfg.namespace.clone(),
            cfg.ca_secret.clone(),
            ca_tx,
            ca_metrics.clone(),
            shutdown.clone(),
        ),
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn serve(argv: &[&str]) -> ServeArgs {
        let argv = ["rdma-stream-injector", "serve"]
            .into_iter()
            .chain(argv.iter().copied());
        match Args::try_parse_from(argv).unwrap().command {
            Command::Serve(serve) => serve,
            _ => panic!("not serve"),
        }
    }

    const TLS: [&str; 4] = ["--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"];

    #[test]
    fn external_certificates_and_defaults() {
        let p = serve(&TLS).plan().unwrap();
        assert_eq!(p.server.listen, SocketAddr::from(([0, 0, 0, 0], 8443)));
        assert_eq!(p.server.tls_cert, Path::new("/tls/tls.crt"));
        assert_eq!(p.server.admission.body_limit, 4 * 1024 * 1024);
        assert_eq!(p.server.admission.deadline, Duration::from_secs(4));
        assert_eq!(p.admin, None);
        assert!(p.cluster);
        assert_eq!(p.self_managed, None);
        assert_eq!(p.shutdown_delay, Duration::from_secs(5));
    }

    #[test]
    fn flags_reach_the_plan() {
        let mut argv = TLS.to_vec();
        argv.extend([
            "--admin-listen",
            "0.0.0.0:9443",
            "--cluster-access",
            "off",
            "--request-timeout-ms",
            "900",
            "--shutdown-delay-ms",
            "0",
            "--config",
            "/etc/profiles.yaml",
        ]);
        let p = serve(&argv).plan().unwrap();
        assert_eq!(p.admin, Some(([0, 0, 0, 0], 9443).into()));
        assert!(!p.cluster);
        assert_eq!(p.server.admission.deadline, Duration::from_millis(900));
        assert_eq!(p.shutdown_delay, Duration::ZERO);
        assert_eq!(p.profiles.as_deref(), Some(Path::new("/etc/profiles.yaml")));
    }

    #[test]
    fn self_managed_certificates_go_to_the_tls_cert_folder() {
        let mut argv = TLS.to_vec();
        argv.extend(["--cert-mode", "self-managed", "--namespace", "rdma"]);
        let p = serve(&argv).plan().unwrap();
        assert_eq!(
            p.self_managed,
            Some(SelfManaged {
                dir: "/tls".into(),
                service: "rdma-stream-injector".into(),
                namespace: Some("rdma".into()),
                webhook_config: "rdma-stream-injector".into(),
            })
        );
    }

    #[test]
    fn self_managed_certificates_need_the_cluster_and_the_standard_names() {
        let usage = |argv: &[&str]| match serve(argv).plan() {
            Err(RunError::Usage(message)) => message,
            other => panic!("{other:?}"),
        };
        let mut argv = TLS.to_vec();
        argv.extend(["--cert-mode", "self-managed", "--cluster-access", "off"]);
        assert_eq!(
            usage(&argv),
            "--cert-mode self-managed needs --cluster-access on"
        );
        let message = usage(&[
            "--tls-cert",
            "/tls/cert.pem",
            "--tls-key",
            "/tls/tls.key",
            "--cert-mode",
            "self-managed",
        ]);
        assert!(
            message.contains("point --tls-cert and --tls-key there"),
            "{message}"
        );
        let message = usage(&[
            "--tls-cert",
            "/a/tls.crt",
            "--tls-key",
            "/b/tls.key",
            "--cert-mode",
            "self-managed",
        ]);
        assert!(message.contains("/a/tls.crt"), "{message}");
    }
}

//! The chart's `lookup`s against a fake API server: `helm template --dry-run=server` renders
//! with a cluster, as `helm install` and `helm upgrade` do, so the objects the chart looks up
//! can be served as an earlier install left them.
//!
//! The fake answers discovery (the kinds the kubevirt value set renders), the GETs of the
//! Secrets it holds, and 404 to every other GET (Helm checks that nothing it would create
//! exists); any write fails the test.

// An integration test: its helpers panic to fail the test, as its `#[test]` functions may.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_streams_chart_tests::{
    HELM_TIMEOUT, NAMESPACE, RELEASE, Rendered, decode_base64, helm, named, parse_peer_keys, run,
    template_args, value_set,
};
use rdma_streams_testkit::within;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(240);

/// (group, resource, kind, namespaced) of every kind the kubevirt value set renders.
const KINDS: &[(&str, &str, &str, bool)] = &[
    ("", "namespaces", "Namespace", false),
    ("", "nodes", "Node", false),
    ("", "secrets", "Secret", true),
    ("", "configmaps", "ConfigMap", true),
    ("", "services", "Service", true),
    ("", "serviceaccounts", "ServiceAccount", true),
    ("apps", "deployments", "Deployment", true),
    ("apps", "daemonsets", "DaemonSet", true),
    (
        "policy",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
    ),
    (
        "rbac.authorization.k8s.io",
        "clusterroles",
        "ClusterRole",
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
    ),
    ("rbac.authorization.k8s.io", "roles", "Role", true),
    (
        "rbac.authorization.k8s.io",
        "rolebindings",
        "RoleBinding",
        true,
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        false,
    ),
];

/// A fake API server on 127.0.0.1 holding some Secrets of the release namespace.
struct FakeApi {
    url: String,
    /// `METHOD path` of every request, in order.
    log: Arc<Mutex<Vec<String>>>,
}

impl FakeApi {
    fn start(secrets: Vec<Value>) -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let secrets: Arc<BTreeMap<String, Value>> = Arc::new(
            secrets
                .into_iter()
                .map(|s| {
                    let path = format!(
                        "/api/v1/namespaces/{NAMESPACE}/secrets/{}",
                        s["metadata"]["name"].as_str().unwrap()
                    );
                    (path, s)
                })
                .collect(),
        );
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = Arc::clone(&log);
        // Serves until the test process ends.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (secrets, log) = (Arc::clone(&secrets), Arc::clone(&log2));
                std::thread::spawn(move || serve(stream, &secrets, &log));
            }
        });
        FakeApi { url, log }
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// `helm template` of the kubevirt value set plus `extra`, against this server.
    fn render(&self, extra: &[&str]) -> Result<Rendered, String> {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\n\
                 clusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
                 users: [{{name: fake, user: {{token: fake}}}}]\n\
                 contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: {NAMESPACE}}}}}]\n\
                 current-context: fake\n",
                self.url
            ),
        )
        .unwrap();
        let helm = helm().expect("helm");
        let mut args = template_args(value_set("kubevirt"), extra);
        args.extend(
            [
                "--dry-run=server",
                "--disable-openapi-validation",
                "--kubeconfig",
                &kubeconfig.display().to_string(),
            ]
            .map(String::from),
        );
        // client-go caches discovery under $HOME/.kube/cache: keep it in the temporary dir.
        let out = run(
            Command::new(&helm).args(&args).env("HOME", dir.path()),
            HELM_TIMEOUT,
        );
        if out.status.success() {
            Ok(Rendered::parse(&out.stdout).unwrap())
        } else {
            Err(out.stderr)
        }
    }
}

fn serve(stream: TcpStream, secrets: &BTreeMap<String, Value>, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("");
        let path = target.split('?').next().unwrap_or("").to_string();
        log.lock().unwrap().push(format!("{method} {path}"));
        let (code, answer) = if method == "GET" {
            answer(&path, secrets)
        } else {
            (
                405,
                status(405, "MethodNotAllowed", "the fake API server is read-only"),
            )
        };
        let text = answer.to_string();
        let reason = if code == 200 { "OK" } else { "Error" };
        let head = format!(
            "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            text.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(text.as_bytes()).is_err()
        {
            return;
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn resource_list(group: &str) -> Value {
    let resources: Vec<Value> = KINDS
        .iter()
        .filter(|(g, ..)| *g == group)
        .map(|(_, name, kind, namespaced)| {
            json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind,
                   "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        })
        .collect();
    let group_version = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/v1")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
           "resources": resources})
}

fn answer(path: &str, secrets: &BTreeMap<String, Value>) -> (u16, Value) {
    let mut groups: Vec<&str> = KINDS
        .iter()
        .map(|(g, ..)| *g)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    match path {
        "/version" => (
            200,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}),
        ),
        "/api" => (200, json!({"kind": "APIVersions", "versions": ["v1"]})),
        "/apis" => (
            200,
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups.iter().map(|g| json!({
                "name": g,
                "versions": [{"groupVersion": format!("{g}/v1"), "version": "v1"}],
                "preferredVersion": {"groupVersion": format!("{g}/v1"), "version": "v1"},
            })).collect::<Vec<_>>()}),
        ),
        "/api/v1" => (200, resource_list("")),
        _ => {
            if let Some(group) = path
                .strip_prefix("/apis/")
                .and_then(|p| p.strip_suffix("/v1"))
                .filter(|g| groups.contains(g))
            {
                return (200, resource_list(group));
            }
            match secrets.get(path) {
                Some(secret) => (200, secret.clone()),
                None => (404, status(404, "NotFound", &format!("{path} not found"))),
            }
        }
    }
}

/// A Secret as `helm install` of this release left it (Helm's ownership metadata), with the
/// keys file `keys`.
fn secret(name: &str, data: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": "2d3c4b5a-0000-4000-8000-000000000002",
            "resourceVersion": "815",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": RELEASE,
                            "meta.helm.sh/release-namespace": NAMESPACE},
        },
        "type": "Opaque",
        "data": data,
    })
}

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Two keys of 32 bytes (the first signs) and a comment, as an admin rotating keys leaves them.
const ROTATING: &str = "# rotation in progress: new key second\n\
     qN3J0mJ0W1f0G8m4y6xHq3m3YtqC1p0a9mVxQ3e2Xf8=\n\
     \n\
     Zm9yIHRlc3RzIG9ubHk6IDMyIGJ5dGVzIG9mIGEga2V5IQ==\n";

#[test]
fn chart_peer_keys_are_kept_on_upgrade() {
    within(LIMIT, || {
        if helm().is_none() {
            return;
        }
        assert_eq!(parse_peer_keys(ROTATING).unwrap().len(), 2);
        let name = named("gateway-peer-keys");
        let served = b64(ROTATING);
        let api = FakeApi::start(vec![secret(&name, json!({"keys": served}))]);
        let r = api.render(&[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            r.get("Secret", &name)["data"]["keys"],
            served,
            "the Secret's keys, byte for byte"
        );
        let lookup = format!("GET /api/v1/namespaces/{NAMESPACE}/secrets/{name}");
        assert!(api.requests().contains(&lookup), "{:?}", api.requests());
        assert!(
            api.requests().iter().all(|r| r.starts_with("GET ")),
            "{:?}",
            api.requests()
        );

        // First install: no Secret yet, so one fresh key.
        let api = FakeApi::start(vec![]);
        let r = api.render(&[]).unwrap_or_else(|e| panic!("{e}"));
        let file = decode_base64(r.get("Secret", &name)["data"]["keys"].as_str().unwrap()).unwrap();
        let keys = parse_peer_keys(std::str::from_utf8(&file).unwrap()).unwrap();
        assert_eq!(keys.len(), 1);
        assert!(api.requests().contains(&lookup));
    });
}

#[test]
fn an_admins_peer_keys_secret_is_checked_where_helm_can_see_it() {
    within(LIMIT, || {
        if helm().is_none() {
            return;
        }
        let existing = ["--set", "gateway.peerAuth.existingSecret=corp-gw-keys"];
        let render_with =
            |data: Value| FakeApi::start(vec![secret("corp-gw-keys", data)]).render(&existing);
        let r = render_with(json!({"keys": b64(ROTATING)})).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.find("Secret", "corp-gw-keys").is_none(), "never rendered");
        // Not there (yet): rendered; the gateway pods wait for the Secret.
        FakeApi::start(vec![])
            .render(&existing)
            .unwrap_or_else(|e| panic!("{e}"));

        let short = "c2hvcnQ=\n";
        let cases: &[(&str, Value, &str)] = &[
            (
                "no keys entry",
                json!({"peer-keys": b64(ROTATING)}),
                "gateway.peerAuth.existingSecret: Secret rdma-streams/corp-gw-keys has no data key \"keys\"",
            ),
            (
                "a short key",
                json!({"keys": b64(&format!("{ROTATING}{short}"))}),
                "line 5 of keys holds 5 bytes; a key needs at least 32 random bytes",
            ),
            (
                "not base64",
                json!({"keys": b64("not a key at all\n")}),
                "line 1 of keys is not a standard base64 key",
            ),
            (
                "unpadded",
                json!({"keys": b64("qN3J0mJ0W1f0G8m4y6xHq3m3YtqC1p0a9mVxQ3e2Xf8\n")}),
                "line 1 of keys is not a standard base64 key",
            ),
            (
                "comments only",
                json!({"keys": b64("# nothing yet\n\n")}),
                "holds no key in keys",
            ),
        ];
        for (case, data, message) in cases {
            let error = render_with(data.clone()).expect_err(case);
            assert!(error.contains(message), "{case}: {error}");
        }
    });
}

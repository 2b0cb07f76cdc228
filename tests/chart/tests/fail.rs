//! Bad value combinations fail at render time, each with a message that says what to change.

use std::time::Duration;

use rdma_streams_chart_tests::{chart_dir, helm, helm_run, render_error, value_set};
use rdma_streams_testkit::within;

const LIMIT: Duration = Duration::from_secs(240);

/// (case, extra helm flags, a fragment the error must contain)
const CASES: &[(&str, &[&str], &str)] = &[
    (
        "cert-manager mode without cert-manager",
        &["--set", "injector.certs.mode=cert-manager"],
        "injector.certs.mode=cert-manager needs cert-manager in the cluster: install it and set certManager.enabled=true",
    ),
    (
        "unknown certificate mode",
        &["--set", "injector.certs.mode=self-signed"],
        r#"injector.certs.mode must be one of helm, cert-manager, injector; got "self-signed""#,
    ),
    (
        "injector certificates without cluster access",
        &[
            "--set",
            "injector.certs.mode=injector",
            "--set",
            "injector.clusterAccess=false",
        ],
        "injector.certs.mode=injector (the injector's --cert-mode self-managed) needs injector.clusterAccess=true",
    ),
    (
        "no injector replica",
        &["--set", "injector.replicas=0"],
        "injector.replicas must be at least 1",
    ),
    (
        "negative replicas",
        &["--set", "injector.replicas=-2"],
        "injector.replicas must be at least 1",
    ),
    (
        "PDB that blocks every drain",
        &["--set", "injector.podDisruptionBudget.maxUnavailable=0"],
        "injector.podDisruptionBudget.maxUnavailable must be at least 1",
    ),
    (
        "unknown delivery mode",
        &["--set", "shim.delivery=copy"],
        r#"shim.delivery must be one of init-copy, image-volume, host-path; got "copy""#,
    ),
    (
        "host-path root outside the allowed roots",
        &[
            "--set",
            "shim.delivery=host-path",
            "--set",
            "shim.hostPath.root=/usr/local/rdma",
        ],
        r#"shim.hostPath.root "/usr/local/rdma" is not equal to or below any of shim.hostPath.allowedRoots (/opt/rdma-streams)"#,
    ),
    (
        "host-path root that only shares a prefix",
        &[
            "--set",
            "shim.delivery=host-path",
            "--set",
            "shim.hostPath.root=/opt/rdma-streams-evil",
        ],
        "is not equal to or below any of shim.hostPath.allowedRoots",
    ),
    (
        "host-path root with ..",
        &[
            "--set",
            "shim.delivery=host-path",
            "--set",
            "shim.hostPath.root=/opt/rdma-streams/../../etc",
        ],
        "shim.hostPath.root must not contain . or .. components",
    ),
    (
        "system directory as an allowed root",
        &[
            "--set",
            "shim.hostPath.allowedRoots[0]=/var/lib/kubelet/pods",
        ],
        r#"shim.hostPath.allowedRoots: "/var/lib/kubelet/pods" is a system directory"#,
    ),
    (
        "top-level directory as an allowed root",
        &["--set", "shim.hostPath.allowedRoots[0]=/opt"],
        r#"shim.hostPath.allowedRoots: "/opt" is a top-level directory"#,
    ),
    (
        "shim policy without a way to deliver it",
        &["--set", "shim.policy.loopback=true"],
        "shim.policy is delivered only with shim.delivery=host-path and shim.hostPath.installer.enabled=true",
    ),
    (
        "image volumes on a cluster without them",
        &[
            "--set",
            "shim.delivery=image-volume",
            "--kube-version",
            "1.32.0",
        ],
        "shim.delivery=image-volume needs Kubernetes 1.33 or newer",
    ),
    (
        "LD_PRELOAD in the shim env",
        &["--set", "shim.env.LD_PRELOAD=/x.so"],
        "shim.env must not set LD_PRELOAD",
    ),
    (
        "request deadline not below the webhook timeout",
        &["--set", "webhook.timeoutSeconds=4"],
        "injector.requestTimeoutMs (4000) must be below webhook.timeoutSeconds (4 s)",
    ),
    (
        "webhook timeout out of range",
        &["--set", "webhook.timeoutSeconds=31"],
        "webhook.timeoutSeconds must be between 1 and 30; got 31",
    ),
    (
        "unknown failure policy",
        &["--set", "webhook.failurePolicy=Retry"],
        r#"webhook.failurePolicy must be one of Fail, Ignore; got "Retry""#,
    ),
    (
        "grace period shorter than the drain",
        &["--set", "injector.terminationGracePeriodSeconds=15"],
        "injector.terminationGracePeriodSeconds (15) must cover injector.shutdownDelayMs (5000 ms) plus the 15 s drain",
    ),
    (
        "unknown registration mode",
        &["--set", "devicePlugin.registration=auto"],
        r#"devicePlugin.registration must be one of kubelet-sock, plugin-watcher; got "auto""#,
    ),
    (
        "no device plugin pool",
        &["--set-json", "devicePlugin.pools=[]"],
        "devicePlugin.pools must name at least one pool",
    ),
    (
        "relative kubelet root",
        &["--set", "devicePlugin.kubeletRootDir=var/lib/kubelet"],
        "devicePlugin.kubeletRootDir must be an absolute, normalised path",
    ),
    (
        "default profile that does not exist",
        &["--set", "injector.defaultProfile=fast"],
        r#"injector.defaultProfile "fast" is neither injector.profile.name ("default") nor a key of injector.extraProfiles"#,
    ),
    (
        "extra profile hiding the chart's",
        &[
            "--set-json",
            r#"injector.extraProfiles={"default":{"shim":{"delivery":"init-copy"}}}"#,
        ],
        r#"injector.extraProfiles must not redefine "default""#,
    ),
    (
        "unknown anti-affinity",
        &["--set", "injector.antiAffinity=strict"],
        r#"injector.antiAffinity must be one of soft, hard, none; got "strict""#,
    ),
    (
        "unknown Pod Security action",
        &["--set", "injector.profile.podSecurity=ignore"],
        r#"injector.profile.podSecurity must be one of deny, degrade; got "ignore""#,
    ),
    (
        "gateway ports clash",
        &[
            "--set",
            "kubevirt.enabled=true",
            "--set",
            "gateway.adminPort=7471",
        ],
        "gateway.port and gateway.adminPort must differ",
    ),
    (
        "gateway without RDMA slots",
        &[
            "--set",
            "kubevirt.enabled=true",
            "--set",
            "gateway.rdmaResource.count=0",
        ],
        "gateway.rdmaResource.count must be at least 1",
    ),
    (
        "a relative node hook socket directory",
        &[
            "--set",
            "kubevirt.enabled=true",
            "--set",
            "gateway.nodeHooks.enabled=true",
            "--set",
            "gateway.nodeHooks.socketDir=plugins/gw",
        ],
        "at '/gateway/nodeHooks/socketDir': 'plugins/gw' does not match pattern '^/'",
    ),
    (
        "a peer keys Secret that cannot be a Secret's name",
        &[
            "--set",
            "kubevirt.enabled=true",
            "--set",
            "gateway.peerAuth.existingSecret=Gateway_Keys",
        ],
        "at '/gateway/peerAuth/existingSecret': 'Gateway_Keys' does not match pattern",
    ),
    (
        "a typo in a value name",
        &["--set", "injector.replica=3"],
        "additional properties 'replica' not allowed",
    ),
    (
        "a value of the wrong type",
        &["--set", "injector.clusterAccess=maybe"],
        "injector/clusterAccess",
    ),
];

#[test]
fn bad_value_combinations_fail_with_their_message() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        let mut wrong = Vec::new();
        for (case, extra, message) in CASES {
            let error = render_error(&helm, value_set("default"), extra);
            if !error.contains(message) {
                wrong.push(format!(
                    "{case}: expected {message:?}\n  got: {}",
                    error.trim()
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    });
}

#[test]
fn system_namespaces_are_refused_as_release_namespace() {
    within(LIMIT, || {
        let Some(helm) = helm() else { return };
        for ns in ["kube-system", "kube-public", "kube-node-lease"] {
            let args: Vec<String> = [
                "template",
                "rdma-streams",
                &chart_dir().display().to_string(),
                "--namespace",
                ns,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let out = helm_run(&helm, &args);
            assert!(!out.status.success(), "{ns} accepted");
            assert!(
                out.stderr.contains(&format!(
                    "install rdma-streams into a namespace of its own, not \"{ns}\""
                )),
                "{ns}: {}",
                out.stderr
            );
        }
    });
}

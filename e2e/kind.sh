#!/usr/bin/env bash
# e2e/kind.sh: the rdma-streams chart on a kind cluster, end to end.
#
#   1. builds the images (`make images`) and loads them into a new kind cluster
#      (`kind load docker-image`), with the app image the test pods run;
#   2. gives the node an RDMA "hardware" fixture: examples/sysfs/two-hca-node copied into the
#      node (`docker cp`), its /dev/infiniband entries replaced by real char device nodes
#      (uverbsN 231:192+N, umadN 231:N, issmN 231:64+N as in the fixture's sysfs `dev` files;
#      rdma_cm misc 10:<E2E_RDMA_CM_MINOR>), and the device plugin pointed at it
#      (RDMA_DP_SYSFS_ROOT, RDMA_DP_DEV_ROOT: the chart has no values for them, so the
#      DaemonSet is patched after `helm install`);
#   3. installs charts/rdma-streams with the loaded images (pullPolicy Never) and the bundle's
#      STREAMSHIM_PROVIDER and RDMAV_DRIVERS (read from the bundle image's bundle.env);
#   4. waits for the node to advertise rdma-streams.io/hca;
#   5. runs an opted-in pod and a plain pod and checks the injection: LD_PRELOAD, the resource,
#      IPC_LOCK, the status annotation, the shim mapped in the app process, the bundled
#      librdmacm resolving its libraries from the bundle, /dev/infiniband in the pod;
#   6. runs `rdma-stream-injector audit` (a host build, or E2E_INJECTOR_BIN) against the cluster:
#      nothing to report, then, with the plain pod's namespace labelled after the pod's
#      creation, that pod reported as not injected (exit 3);
#   7. scales the injector to zero: with failurePolicy Fail an opted-in pod is refused with the
#      webhook's message while a plain pod is admitted (objectSelector); with failurePolicy
#      Ignore the opted-in pod is admitted without the shim; then restores both and checks
#      injection works again;
#   8. restarts kubelet in the node and checks that the device plugin registers again
#      (its rdma_dp_registrations_total{result="ok"} grows) and allocatable comes back;
#   9. deletes the cluster (trap; KEEP=1 keeps it, and a cluster that existed before is never
#      deleted).
#
# Usage: e2e/kind.sh [-h|--help]
#
# Environment:
#   KIND_CLUSTER        cluster name (default rdma-streams-e2e); an existing cluster of that
#                       name is reused and kept
#   KIND_NODE_IMAGE     kind node image (default: kind's own)
#   KEEP=1              keep the cluster (and print how to reach it)
#   E2E_BUILD=0         do not run `make images`; use images already in docker
#   E2E_IMAGE_TAG       tag of the rdma-streams images (default e2e)
#   E2E_APP_IMAGE       glibc image of the test pods (default debian:bullseye-slim, glibc 2.31:
#                       the oldest the bundle promises); pulled on the host, loaded into kind
#   E2E_SHIM_DELIVERY   init-copy (default), image-volume (enables the ImageVolume gate) or
#                       host-path
#   E2E_RDMA_CM_MINOR   minor of the fake rdma_cm misc device (default 240: "local use")
#   E2E_TIMEOUT         seconds for each wait (default 180)
#   E2E_REQUIRE=1       a missing tool is an error (exit 77) instead of a skip (exit 0)
#   HELM                helm binary (default: .tools/bin/helm from `make deps`, else helm)
#   E2E_INJECTOR_BIN    rdma-stream-injector binary for the audit step (default: cargo build
#                       --release; without cargo the step is left out)
#
# Exit status: 0 passed, or a needed tool is missing (one `SKIP: ...` line); 77 that skip under
# E2E_REQUIRE=1; 1 a check failed; 2 usage or setup error.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly ROOT

usage() {
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

case ${1:-} in
-h | --help)
	usage
	exit 0
	;;
"") ;;
*)
	echo "kind.sh: unknown argument: $1 (see --help)" >&2
	exit 2
	;;
esac

readonly cluster=${KIND_CLUSTER:-rdma-streams-e2e}
readonly node_image=${KIND_NODE_IMAGE:-}
readonly keep=${KEEP:-0}
readonly build=${E2E_BUILD:-1}
readonly tag=${E2E_IMAGE_TAG:-e2e}
readonly app_image=${E2E_APP_IMAGE:-debian:bullseye-slim}
readonly delivery=${E2E_SHIM_DELIVERY:-init-copy}
readonly rdma_cm_minor=${E2E_RDMA_CM_MINOR:-240}
readonly wait_s=${E2E_TIMEOUT:-180}
readonly release=rdma-streams
readonly ns=rdma-streams
readonly app_ns=rdma-e2e
readonly node=$cluster-control-plane
readonly ctx=kind-$cluster
readonly fixture_src=$ROOT/examples/sysfs/two-hca-node
readonly fixture=/var/lib/rdma-streams-e2e/two-hca-node
readonly resource=rdma-streams.io/hca
readonly dp_admin_port=9101
readonly img_dp=rdma-streams/rdma-device-plugin:$tag
readonly img_inj=rdma-streams/rdma-stream-injector:$tag
readonly img_shim=rdma-streams/shim-bundle:$tag

skip() {
	echo "SKIP: $*"
	if [[ ${E2E_REQUIRE:-0} == 1 ]]; then
		exit 77
	fi
	exit 0
}

die() {
	echo "kind.sh: $*" >&2
	exit 2
}

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

step() {
	printf '\n==> %s\n' "$*"
}

ok() {
	echo "    ok: $*"
}

case $delivery in
init-copy | image-volume | host-path) ;;
*) die "E2E_SHIM_DELIVERY must be init-copy, image-volume or host-path, not '$delivery'" ;;
esac
[[ $wait_s =~ ^[1-9][0-9]*$ ]] || die "E2E_TIMEOUT must be a positive number of seconds, not '$wait_s'"
[[ $rdma_cm_minor =~ ^[0-9]+$ ]] || die "E2E_RDMA_CM_MINOR must be a number, not '$rdma_cm_minor'"

# ------------------------------------------------------------------------------------------
# Tools (nothing is changed before these checks pass)

for tool in docker kind kubectl; do
	command -v "$tool" >/dev/null ||
		skip "$tool not found; the kind e2e needs docker (with a running daemon), kind and kubectl"
done
docker info >/dev/null 2>&1 ||
	skip "the docker daemon is not reachable ('docker info' fails); the kind e2e needs a running docker"
helm=${HELM:-}
if [[ -z $helm || ! -x $helm ]]; then
	if [[ -x $ROOT/.tools/bin/helm ]]; then
		helm=$ROOT/.tools/bin/helm
	else
		helm=$(command -v helm || true)
	fi
fi
[[ -n $helm ]] || skip "helm not found; the kind e2e needs helm (make deps puts one in .tools/bin)"
for tool in make timeout; do
	command -v "$tool" >/dev/null || die "$tool not found"
done

k() {
	kubectl --context "$ctx" --request-timeout=30s "$@"
}

# wait_until DESCRIPTION COMMAND...: runs COMMAND every 2 s until it succeeds, at most E2E_TIMEOUT.
wait_until() {
	local what=$1 deadline=$((SECONDS + wait_s))
	shift
	echo "    waiting (at most ${wait_s}s): $what"
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			fail "timed out after ${wait_s}s waiting for: $what"
		fi
		sleep 2
	done
}

# ------------------------------------------------------------------------------------------
# Cleanup

work=$(mktemp -d /tmp/kind-e2e.XXXXXX)
created_cluster=0

diagnostics() {
	echo
	echo "---- diagnostics ----"
	k get nodes -o wide || true
	k get pods -A -o wide || true
	k -n "$app_ns" describe pods || true
	for component in device-plugin injector; do
		echo "---- logs: $component ----"
		k -n "$ns" logs -l "app.kubernetes.io/component=$component" --tail=40 --all-containers --prefix || true
	done
	k get events -A --sort-by=.lastTimestamp | tail -n 30 || true
}

cleanup() {
	local rc=$?
	set +e
	trap - EXIT
	if [[ $rc -ne 0 && $rc -ne 77 ]] && kind get clusters 2>/dev/null | grep -qx "$cluster"; then
		diagnostics
	fi
	if [[ $created_cluster == 1 ]]; then
		if [[ $keep == 1 ]]; then
			echo "kind.sh: KEEP=1: cluster $cluster kept (kubectl --context $ctx ...; kind delete cluster --name $cluster)"
		else
			echo "kind.sh: deleting cluster $cluster"
			timeout 300 kind delete cluster --name "$cluster" >/dev/null 2>&1 ||
				echo "kind.sh: could not delete cluster $cluster; kind delete cluster --name $cluster"
		fi
	fi
	rm -rf "$work"
	if [[ $rc -eq 0 ]]; then
		echo "PASS: kind e2e ($delivery delivery)"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------------------------------
step "images (tag $tag)"

if [[ $build == 1 ]]; then
	timeout 3600 make -C "$ROOT" --no-print-directory images IMAGE_REGISTRY= IMAGE_TAG="$tag" \
		IMAGES="rdma-device-plugin rdma-stream-injector shim-bundle" ||
		fail "make images failed"
fi
for image in "$img_dp" "$img_inj" "$img_shim"; do
	docker image inspect "$image" >/dev/null 2>&1 || fail "image $image not in docker (E2E_BUILD=0 needs it built)"
done
if ! docker image inspect "$app_image" >/dev/null 2>&1; then
	timeout 600 docker pull "$app_image" >/dev/null || fail "cannot pull the app image $app_image (E2E_APP_IMAGE)"
fi
# The bundle's own description of the environment pods need (bundle.env, its CMD prints it).
bundle_env=$(timeout 120 docker run --rm "$img_shim") || fail "cannot run $img_shim to read its bundle.env"
env_value() {
	sed -n "s/^$1=//p" <<<"$bundle_env"
}
preload=$(env_value LD_PRELOAD)
provider=$(env_value STREAMSHIM_PROVIDER)
drivers=$(env_value RDMAV_DRIVERS)
[[ -n $preload && -n $provider && -n $drivers ]] || fail "bundle.env of $img_shim lacks LD_PRELOAD, STREAMSHIM_PROVIDER or RDMAV_DRIVERS"
mount_path=${preload%/lib/libstreamshim.so}
[[ $mount_path != "$preload" ]] || fail "bundle.env LD_PRELOAD=$preload is not <mountPath>/lib/libstreamshim.so"
ok "bundle for $mount_path: STREAMSHIM_PROVIDER=$provider, $(tr ':' '\n' <<<"$drivers" | wc -l) verbs providers"

# ------------------------------------------------------------------------------------------
step "kind cluster $cluster"

if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
	echo "    reusing the existing cluster $cluster (it will be kept)"
else
	{
		echo "kind: Cluster"
		echo "apiVersion: kind.x-k8s.io/v1alpha4"
		if [[ $delivery == image-volume ]]; then
			echo "featureGates:"
			echo "  ImageVolume: true"
		fi
		echo "nodes:"
		echo "  - role: control-plane"
	} >"$work/kind.yaml"
	args=(create cluster --name "$cluster" --config "$work/kind.yaml" --wait "${wait_s}s")
	if [[ -n $node_image ]]; then
		args+=(--image "$node_image")
	fi
	created_cluster=1
	timeout $((wait_s + 300)) kind "${args[@]}" || fail "kind create cluster failed"
fi
k get node "$node" >/dev/null || fail "node $node not found in cluster $cluster"
ok "node $node, Kubernetes $(k get node "$node" -o jsonpath='{.status.nodeInfo.kubeletVersion}')"

step "load images into $cluster"
for image in "$img_dp" "$img_inj" "$img_shim" "$app_image"; do
	timeout 600 kind load docker-image --name "$cluster" "$image" >/dev/null || fail "kind load docker-image $image failed"
	ok "$image"
done

# ------------------------------------------------------------------------------------------
step "RDMA fixture in the node: $fixture"

timeout 60 docker exec "$node" sh -c "rm -rf '$fixture' && mkdir -p '$(dirname "$fixture")'" || fail "docker exec $node failed"
timeout 120 docker cp "$fixture_src" "$node:$fixture" >/dev/null || fail "docker cp of the fixture failed"
# Real char devices in place of the fixture's plain files: the container runtime stats the host
# paths Allocate returns and refuses anything that is not a device node.
mknod_script="set -e; cd '$fixture'"
for devfile in "$fixture_src"/sys/class/infiniband_verbs/uverbs*/dev "$fixture_src"/sys/class/infiniband_mad/*/dev; do
	name=$(basename "$(dirname "$devfile")")
	IFS=: read -r major minor <"$devfile"
	mknod_script+="; rm -f dev/infiniband/$name; mknod -m 0666 dev/infiniband/$name c $major $minor"
done
mknod_script+="; rm -f dev/infiniband/rdma_cm; mknod -m 0666 dev/infiniband/rdma_cm c 10 $rdma_cm_minor"
timeout 60 docker exec "$node" sh -c "$mknod_script" || fail "mknod in $node failed"
listing=$(timeout 30 docker exec "$node" ls -l "$fixture/dev/infiniband")
grep -q '^c.* 231, *192 .*uverbs0$' <<<"$listing" || fail "uverbs0 is not char device 231:192 in the node:"$'\n'"$listing"
ok "$(grep -c '^c' <<<"$listing") char devices in $fixture/dev/infiniband"

# ------------------------------------------------------------------------------------------
step "helm install $release (namespace $ns, shim delivery $delivery)"

k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
k label namespace "$ns" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null
cat >"$work/values.yaml" <<EOF
devicePlugin:
  image: {tag: "$tag", pullPolicy: Never}
  logFormat: text
injector:
  image: {tag: "$tag", pullPolicy: Never}
  logFormat: text
shim:
  delivery: $delivery
  image: {tag: "$tag", pullPolicy: Never}
  mountPath: "$mount_path"
  env:
    STREAMSHIM_MODE: proxy
    STREAMSHIM_PROVIDER: "$provider"
    RDMAV_DRIVERS: "$drivers"
EOF
timeout $((wait_s + 60)) "$helm" upgrade --install "$release" "$ROOT/charts/rdma-streams" \
	--kube-context "$ctx" --namespace "$ns" --values "$work/values.yaml" --timeout "${wait_s}s" ||
	fail "helm install failed"

selector() {
	echo "app.kubernetes.io/instance=$release,app.kubernetes.io/component=$1"
}
dp_ds=$(k -n "$ns" get daemonset -l "$(selector device-plugin)" -o name)
inj_deploy=$(k -n "$ns" get deployment -l "$(selector injector)" -o name)
webhook=$(k get mutatingwebhookconfiguration -l "$(selector injector)" -o name)
[[ -n $dp_ds && -n $inj_deploy && -n $webhook ]] || fail "the release lacks the device plugin, the injector or the webhook"
inj_replicas=$(k -n "$ns" get "$inj_deploy" -o jsonpath='{.spec.replicas}')

# The chart mounts the node's /sys and /dev/infiniband and has no values for other roots: point
# the plugin at the fixture, mounted at the same path as on the node, so that the host paths
# Allocate returns are the fixture's device nodes.
k -n "$ns" patch "$dp_ds" --type=strategic -p "$(
	cat <<EOF
{"spec":{"template":{"spec":{
  "volumes":[{"name":"e2e-fixture","hostPath":{"path":"$fixture","type":"Directory"}}],
  "containers":[{"name":"device-plugin",
    "env":[{"name":"RDMA_DP_SYSFS_ROOT","value":"$fixture/sys"},{"name":"RDMA_DP_DEV_ROOT","value":"$fixture/dev"}],
    "volumeMounts":[{"name":"e2e-fixture","mountPath":"$fixture","readOnly":true}]}]}}}}
EOF
)" >/dev/null
k -n "$ns" rollout status "$dp_ds" --timeout="${wait_s}s" || fail "device plugin rollout did not finish"
k -n "$ns" rollout status "$inj_deploy" --timeout="${wait_s}s" || fail "injector rollout did not finish"
ok "device plugin and injector ($inj_replicas replicas) ready"
if [[ $delivery == host-path ]]; then
	installer=$(k -n "$ns" get daemonset -l "$(selector shim-installer)" -o name)
	[[ -n $installer ]] || fail "host-path delivery but no shim installer DaemonSet"
	k -n "$ns" rollout status "$installer" --timeout="${wait_s}s" || fail "shim installer rollout did not finish"
	ok "shim installer copied the bundle to the node"
fi

# ------------------------------------------------------------------------------------------
step "node advertises $resource"

allocatable() {
	k get node "$node" -o jsonpath="{.status.allocatable.${resource//./\\.}}"
}
has_allocatable() {
	local n
	n=$(allocatable)
	[[ -n $n && $n != 0 ]]
}
wait_until "$resource allocatable on $node" has_allocatable
slots=$(allocatable)
ok "$resource: $slots allocatable"

# ------------------------------------------------------------------------------------------
step "injection: an opted-in pod and a plain pod in namespace $app_ns"

k create namespace "$app_ns" --dry-run=client -o yaml | k apply -f - >/dev/null

# pod_yaml NAME OPTED_IN(true|false) COMMAND
pod_yaml() {
	local labels=""
	if [[ $2 == true ]]; then
		labels='  labels: {rdma-streams.io/inject: "true"}'
	fi
	cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: $app_ns
$labels
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: $app_image
      imagePullPolicy: Never
      command:
        - sh
        - -c
        - |
          ${3//$'\n'/$'\n'          }
EOF
}

# shellcheck disable=SC2016 # expanded in the pod, not here
probe='echo "LD_PRELOAD=${LD_PRELOAD:-}"
if grep -q libstreamshim.so /proc/self/maps; then echo E2E_SHIM_LOADED; else echo E2E_SHIM_NOT_LOADED; fi
if [ -n "${STREAMSHIM_PROVIDER:-}" ]; then ldd "$STREAMSHIM_PROVIDER"; fi
ls /dev/infiniband 2>/dev/null | sed "s/^/E2E_DEV /"
echo E2E_PROBE_DONE
exec sleep 3600'

pod_yaml e2e-shimmed true "$probe" >"$work/shimmed.yaml"
pod_yaml e2e-plain false "$probe" >"$work/plain.yaml"
k apply -f "$work/shimmed.yaml" >/dev/null || fail "creating the opted-in pod failed"
k apply -f "$work/plain.yaml" >/dev/null || fail "creating the plain pod failed"
for pod in e2e-shimmed e2e-plain; do
	k -n "$app_ns" wait --for=condition=Ready "pod/$pod" --timeout="${wait_s}s" >/dev/null ||
		fail "pod $pod did not become Ready"
done
ok "both pods Ready"

jp() {
	k -n "$app_ns" get pod "$1" -o jsonpath="$2"
}
env_of() {
	jp "$1" "{.spec.containers[0].env[?(@.name==\"$2\")].value}"
}
check_eq() {
	local what=$1 want=$2 got=$3
	[[ $got == "$want" ]] || fail "$what: want '$want', got '$got'"
	ok "$what = $got"
}

check_eq "opted-in LD_PRELOAD" "$preload" "$(env_of e2e-shimmed LD_PRELOAD)"
check_eq "opted-in STREAMSHIM_PROVIDER" "$provider" "$(env_of e2e-shimmed STREAMSHIM_PROVIDER)"
check_eq "opted-in RDMAV_DRIVERS" "$drivers" "$(env_of e2e-shimmed RDMAV_DRIVERS)"
check_eq "opted-in limits[$resource]" 1 "$(jp e2e-shimmed "{.spec.containers[0].resources.limits.${resource//./\\.}}")"
check_eq "opted-in requests[$resource]" 1 "$(jp e2e-shimmed "{.spec.containers[0].resources.requests.${resource//./\\.}}")"
caps=$(jp e2e-shimmed '{.spec.containers[0].securityContext.capabilities.add}')
[[ $caps == *IPC_LOCK* ]] || fail "opted-in pod: IPC_LOCK not among the added capabilities ($caps)"
ok "opted-in capabilities.add = $caps"
status=$(jp e2e-shimmed '{.metadata.annotations.rdma-streams\.io/status}')
[[ $status == *'"default"'* ]] || fail "opted-in pod: status annotation missing or not profile default: '$status'"
ok "opted-in rdma-streams.io/status = $status"
if [[ $delivery == init-copy ]]; then
	check_eq "opted-in init container" rdma-streams-shim "$(jp e2e-shimmed '{.spec.initContainers[0].name}')"
fi

logs=$(k -n "$app_ns" logs e2e-shimmed)
grep -q E2E_PROBE_DONE <<<"$logs" || fail "the opted-in pod's probe did not finish:"$'\n'"$logs"
grep -qx E2E_SHIM_LOADED <<<"$logs" ||
	fail "libstreamshim.so is not mapped in the opted-in pod's processes ($delivery delivery):"$'\n'"$logs"
ok "libstreamshim.so loaded in $app_image"
grep -q "libibverbs.so.1 => $mount_path/lib/libibverbs.so.1" <<<"$logs" ||
	fail "the bundled librdmacm does not resolve libibverbs from the bundle:"$'\n'"$logs"
ok "bundled librdmacm resolves libibverbs.so.1 from $mount_path/lib"
grep -q '^E2E_DEV uverbs[0-9]' <<<"$logs" || fail "no /dev/infiniband/uverbsN in the opted-in pod:"$'\n'"$logs"
grep -q '^E2E_DEV rdma_cm$' <<<"$logs" || fail "no /dev/infiniband/rdma_cm in the opted-in pod:"$'\n'"$logs"
ok "device nodes in the pod: $(sed -n 's/^E2E_DEV //p' <<<"$logs" | tr '\n' ' ')"

check_eq "plain LD_PRELOAD" "" "$(env_of e2e-plain LD_PRELOAD)"
check_eq "plain status annotation" "" "$(jp e2e-plain '{.metadata.annotations.rdma-streams\.io/status}')"
check_eq "plain limits[$resource]" "" "$(jp e2e-plain "{.spec.containers[0].resources.limits.${resource//./\\.}}")"
grep -qx E2E_SHIM_NOT_LOADED <<<"$(k -n "$app_ns" logs e2e-plain)" || fail "the plain pod has the shim loaded"
ok "plain pod untouched"

# ------------------------------------------------------------------------------------------
step "audit: opted-in pods that were never injected"

# The audit runs on this machine with the kind context: E2E_INJECTOR_BIN, else a release build.
audit_bin=${E2E_INJECTOR_BIN:-}
if [[ -z $audit_bin ]] && command -v cargo >/dev/null; then
	timeout 1800 cargo build --quiet --release --manifest-path "$ROOT/Cargo.toml" -p rdma-stream-injector ||
		fail "building rdma-stream-injector for the audit failed"
	audit_bin=$ROOT/target/release/rdma-stream-injector
fi
if [[ -z $audit_bin ]]; then
	echo "  (no cargo and no E2E_INJECTOR_BIN: the audit step is left out)"
else
	inj_cm=$(k -n "$ns" get configmap -l "$(selector injector)" -o name)
	[[ -n $inj_cm ]] || fail "the release has no injector ConfigMap"
	run_audit() {
		"$audit_bin" audit --context "$ctx" --config-map "$ns/${inj_cm#configmap/}" -n "$app_ns"
	}
	audit_out=$(run_audit) || fail "audit with every opted-in pod injected failed:"$'\n'"$audit_out"
	ok "audit: nothing to report"
	# Labelling the namespace now opts e2e-plain in after its creation: never injected.
	k label namespace "$app_ns" rdma-streams.io/inject=enabled >/dev/null
	audit_rc=0
	audit_out=$(run_audit) || audit_rc=$?
	k label namespace "$app_ns" rdma-streams.io/inject- >/dev/null
	[[ $audit_rc == 3 && $audit_out == *e2e-plain*not_injected* ]] ||
		fail "audit after labelling the namespace: want exit 3 and e2e-plain not_injected, got $audit_rc:"$'\n'"$audit_out"
	ok "audit: a pod created before its namespace was labelled is reported (exit 3)"
fi

# ------------------------------------------------------------------------------------------
step "failure policies with the injector scaled to zero"

k -n "$ns" scale "$inj_deploy" --replicas=0 >/dev/null
no_injector_pods() {
	[[ -z $(k -n "$ns" get pods -l "$(selector injector)" -o name) ]]
}
wait_until "no injector pods" no_injector_pods

pod_yaml e2e-refused true "sleep 3600" >"$work/refused.yaml"
pod_yaml e2e-plain-2 false "sleep 3600" >"$work/plain-2.yaml"

if out=$(k create -f "$work/refused.yaml" 2>&1); then
	fail "failurePolicy Fail: the opted-in pod was admitted with no injector running"
fi
[[ $out == *"failed calling webhook"*"inject.rdma-streams.io"* ]] ||
	fail "failurePolicy Fail: the refusal does not name the webhook: $out"
ok "failurePolicy Fail: opted-in pod refused: $out"
k create -f "$work/plain-2.yaml" >/dev/null || fail "failurePolicy Fail: a plain pod was refused with no injector running"
ok "failurePolicy Fail: plain pod admitted (objectSelector and matchConditions keep it away from the webhook)"
k -n "$app_ns" delete pod e2e-plain-2 --wait=false >/dev/null

set_failure_policy() {
	local count patch="[" i
	count=$(k get "$webhook" -o jsonpath='{range .webhooks[*]}x{end}')
	for ((i = 0; i < ${#count}; i++)); do
		patch+="{\"op\":\"replace\",\"path\":\"/webhooks/$i/failurePolicy\",\"value\":\"$1\"},"
	done
	patch="${patch%,}]"
	k patch "$webhook" --type=json -p "$patch" >/dev/null
}
set_failure_policy Ignore
k create -f "$work/refused.yaml" >/dev/null || fail "failurePolicy Ignore: the opted-in pod was refused"
check_eq "failurePolicy Ignore: admitted pod's status annotation" "" \
	"$(jp e2e-refused '{.metadata.annotations.rdma-streams\.io/status}')"
check_eq "failurePolicy Ignore: admitted pod's LD_PRELOAD" "" "$(env_of e2e-refused LD_PRELOAD)"
k -n "$app_ns" delete pod e2e-refused --wait=false >/dev/null
set_failure_policy Fail

k -n "$ns" scale "$inj_deploy" --replicas="$inj_replicas" >/dev/null
k -n "$ns" rollout status "$inj_deploy" --timeout="${wait_s}s" || fail "injector did not come back"
pod_yaml e2e-dry-run true "sleep 3600" >"$work/dry-run.yaml"
injected_again() {
	local s
	s=$(k create --dry-run=server -f "$work/dry-run.yaml" -o jsonpath='{.metadata.annotations.rdma-streams\.io/status}')
	[[ -n $s ]]
}
wait_until "opted-in pods injected again (server-side dry run)" injected_again
ok "injector back ($inj_replicas replicas), failurePolicy Fail restored, injection works"

# ------------------------------------------------------------------------------------------
step "kubelet restart: the device plugin registers again"

dp_pod=$(k -n "$ns" get pods -l "$(selector device-plugin)" --field-selector "spec.nodeName=$node" -o jsonpath='{.items[0].metadata.name}')
[[ -n $dp_pod ]] || fail "no device plugin pod on $node"
registrations() {
	k get --raw "/api/v1/namespaces/$ns/pods/$dp_pod:$dp_admin_port/proxy/metrics" |
		awk '/^rdma_dp_registrations_total\{/ && /result="ok"/ {n += $NF} END {print n + 0}'
}
before=$(registrations) || fail "cannot read the device plugin's metrics"
[[ $before -ge 1 ]] || fail "the device plugin has not registered before the restart (registrations ok = $before)"
ok "registrations before: $before; allocatable before: $slots"
kubelet_since=$(timeout 30 docker exec "$node" systemctl show kubelet -p ActiveEnterTimestampMonotonic --value)
timeout 60 docker exec "$node" systemctl restart kubelet || fail "systemctl restart kubelet failed in $node"
kubelet_restarted() {
	local now
	now=$(timeout 30 docker exec "$node" systemctl show kubelet -p ActiveEnterTimestampMonotonic --value)
	[[ $now != "$kubelet_since" ]] && timeout 30 docker exec "$node" systemctl is-active --quiet kubelet
}
wait_until "kubelet active again" kubelet_restarted
registered_again() {
	local n
	n=$(registrations)
	[[ $n -gt $before ]]
}
wait_until "the device plugin's registrations to grow past $before" registered_again
node_ready() {
	[[ $(k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
}
wait_until "node $node Ready" node_ready
allocatable_back() {
	[[ $(allocatable) == "$slots" ]]
}
wait_until "$resource allocatable back to $slots" allocatable_back
ok "registrations after: $(registrations); $resource allocatable: $(allocatable)"
k -n "$app_ns" get pod e2e-shimmed >/dev/null || fail "the opted-in pod is gone after the kubelet restart"
ok "the opted-in pod survived the kubelet restart"

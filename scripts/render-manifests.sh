#!/usr/bin/env bash
# Render manifests/ (plain YAML for `kubectl apply`) from charts/rdma-streams, or check that
# manifests/ is what the chart renders now.
#
#   scripts/render-manifests.sh           write manifests/*.yaml   (make manifests)
#   scripts/render-manifests.sh --check   exit 1 if manifests/ is stale (make manifests-check)
#
# helm: $HELM, else .tools/bin/helm (make deps installs it).
#
# The manifests use the chart's defaults with two changes:
#   namespace.create=true      the Namespace "rdma-streams" is part of the file
#   injector.certs.mode=injector
#                              the injector keeps its own CA Secret and patches the webhook's
#                              caBundle at run time (--cert-mode self-managed), so the files
#                              hold no certificate and render the same every time. The chart's
#                              default (helm mode) generates a new CA on every `helm template`.
# and the KubeVirt variant also
#   gateway.peerAuth.existingSecret=rdma-streams-gateway-peer-keys
#                              the gateways' peer keys come from a Secret the admin creates
#                              before applying (docs/install.md): a key rendered into a
#                              checked-in file would be known to everyone who can read it, and
#                              the chart's own Secret would get a new key on every render
#                              (`helm template` cannot look the old one up).
set -euo pipefail
cd "$(dirname "$0")/.."

helm=${HELM:-$PWD/.tools/bin/helm}
if [ ! -x "$helm" ]; then
	echo "$0: helm not found at $helm (run make deps, or set HELM)" >&2
	exit 2
fi

# name of the file, then extra helm flags
variants=(
	"rdma-streams.yaml|"
	"rdma-streams-kubevirt.yaml|--set kubevirt.enabled=true --set gateway.peerAuth.existingSecret=rdma-streams-gateway-peer-keys"
)

render() {
	local out=$1 extra=$2
	local values=${extra//--set /}
	{
		echo "# rdma-streams $(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/rdma-streams/Chart.yaml): rendered from charts/rdma-streams by \`make manifests\`; do not edit."
		echo "# Values: the chart defaults, namespace.create=true, injector.certs.mode=injector${values:+, ${values// /, }}."
		echo "# Apply: kubectl apply -f manifests/$(basename "$out")"
		# shellcheck disable=SC2086 # $extra is a list of flags
		"$helm" template rdma-streams charts/rdma-streams \
			--namespace rdma-streams \
			--kube-version 1.30.0 \
			--set namespace.create=true \
			--set injector.certs.mode=injector \
			$extra
	} >"$out"
}

case "${1:-}" in
"")
	mkdir -p manifests
	for v in "${variants[@]}"; do
		render "manifests/${v%%|*}" "${v#*|}"
		echo "wrote manifests/${v%%|*}"
	done
	;;
--check)
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	for v in "${variants[@]}"; do
		render "$work/${v%%|*}" "${v#*|}"
	done
	if ! diff -ru manifests "$work" >"$work.diff" 2>&1; then
		sed "s|$work|(fresh render)|g" "$work.diff" | head -n 60 >&2
		rm -f "$work.diff"
		echo "manifests/ is stale: run \`make manifests\` and commit the result" >&2
		exit 1
	fi
	rm -f "$work.diff"
	echo "manifests/ is current"
	;;
*)
	echo "usage: $0 [--check]" >&2
	exit 2
	;;
esac

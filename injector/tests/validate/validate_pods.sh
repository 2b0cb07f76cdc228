#!/usr/bin/env bash
# Validate pod manifests against the published Kubernetes schemas, strictly (unknown fields are
# errors), at a minimum Kubernetes version and at the newest one kubernetes-validate ships.
#
#   validate_pods.sh [--min VERSION] DIR
#
#   DIR          directory of *.json, *.yaml and *.yml files (one or more objects each)
#   --min V      oldest Kubernetes version to check (default 1.30.0; pods using image
#                volumes need 1.33.0, the first version whose schema has them)
#
# The tool: $KUBERNETES_VALIDATE if set, else `kubernetes-validate` on PATH. Install it with
#   python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kubernetes-validate
# (PyPI package `kubernetes-validate`; `kubernetes-validate --help` names the newest version
# it ships as the default of -k, e.g. "Defaults to 1.37.0").
#
# kubernetes-validate (1.37.0) cannot report on an object without metadata.name (it fails with
# "could not be validated: 'name'"), and pods made by controllers only have generateName. So
# every object is first copied into a scratch directory, one JSON file each, with a name filled
# in where it is missing; the originals are never touched.
#
# Exit status: 0 when every object validates at both versions, 1 when one does not, 2 on usage
# errors, 127 when the tool is missing.
set -euo pipefail

usage() {
	echo "usage: $0 [--min VERSION] DIR" >&2
	exit 2
}

min=1.30.0
while [ $# -gt 0 ]; do
	case "$1" in
	--min)
		[ $# -ge 2 ] || usage
		min=$2
		shift 2
		;;
	-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
	-*) usage ;;
	*) break ;;
	esac
done
[ $# -eq 1 ] || usage
dir=$1
[ -d "$dir" ] || { echo "$0: $dir is not a directory" >&2; exit 2; }

kv=${KUBERNETES_VALIDATE:-$(command -v kubernetes-validate || true)}
if [ -z "$kv" ] || [ ! -x "$kv" ]; then
	echo "$0: kubernetes-validate not found (set KUBERNETES_VALIDATE or put it on PATH;" \
		"install: python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kubernetes-validate)" >&2
	exit 127
fi

newest=$("$kv" --help | tr '\n' ' ' | sed -n 's/.*Defaults to \([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
if [ -z "$newest" ]; then
	newest=$("$kv" --version | sed -n 's/^\([0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
fi
[ -n "$newest" ] || { echo "$0: cannot tell the newest version $kv ships" >&2; exit 2; }

# The tool's own interpreter has PyYAML (a dependency of kubernetes-validate); fall back to
# python3 on PATH (JSON files then work without PyYAML).
python=python3
shebang=$(head -n 1 "$kv" 2>/dev/null | sed -n 's/^#![[:space:]]*//p')
case "$shebang" in
*/env\ *) ;;
/*python*) [ -x "${shebang%% *}" ] && python=${shebang%% *} ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" - "$dir" "$work" <<'PY'
import json, os, sys

src, dst = sys.argv[1], sys.argv[2]
try:
    import yaml
except ImportError:
    yaml = None

count = 0
for entry in sorted(os.listdir(src)):
    path = os.path.join(src, entry)
    stem, ext = os.path.splitext(entry)
    if not os.path.isfile(path) or ext not in (".json", ".yaml", ".yml"):
        continue
    with open(path) as f:
        text = f.read()
    if ext == ".json":
        docs = [json.loads(text)]
    elif yaml is None:
        sys.exit("validate_pods.sh: PyYAML is needed for %s" % path)
    else:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    for i, doc in enumerate(docs):
        if isinstance(doc, dict):
            meta = doc.setdefault("metadata", {})
            if isinstance(meta, dict) and not meta.get("name"):
                meta["name"] = (meta.get("generateName") or "unnamed-") + "validated"
        out = os.path.join(dst, "%s.%d.json" % (stem, i))
        with open(out, "w") as f:
            json.dump(doc, f)
        count += 1
if count == 0:
    sys.exit("validate_pods.sh: no .json/.yaml/.yml objects in %s" % src)
PY

files=("$work"/*.json)
rc=0
for version in "$min" "$newest"; do
	if "$kv" --strict --quiet -k "$version" "${files[@]}"; then
		echo "validate_pods.sh: ${#files[@]} object(s) valid against Kubernetes $version (strict)"
	else
		echo "validate_pods.sh: validation against Kubernetes $version (strict) failed" >&2
		rc=1
	fi
done
exit "$rc"

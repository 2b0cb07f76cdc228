#!/usr/bin/env bash
# cargo-deny's gates (deny.toml: advisories, bans, licences, sources) over the workspace's whole
# crate graph, with the advisory database said out loud.
#
# The live RustSec database when github.com answers; else the snapshot whose path ADVISORY_DB
# names (a copy of github.com/rustsec/advisory-db with a SNAPSHOT.txt saying its upstream commit
# and date), copied into a throwaway git repository where cargo-deny reads it. Neither: the gate
# fails. It is never skipped.
#
# Usage: scripts/deny.sh            (CARGO, ADVISORY_DB from the environment)
#        ADVISORY_DB_OFFLINE=1 ...  (use the snapshot even when the network answers)
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
URL=https://github.com/rustsec/advisory-db
# Where cargo-deny 0.20 keeps the database of $URL under its db-path (a hash of the URL).
DB_DIR=advisory-db-3157b0e258782691

# Every crate of every target in deny.toml, so that `cargo metadata` can run offline.
$CARGO fetch --locked --quiet

if [ -z "${ADVISORY_DB_OFFLINE:-}" ] && timeout 20 git ls-remote --exit-code "$URL" HEAD >/dev/null 2>&1; then
	root="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
	export RDMA_STREAMS_ADVISORY_DB_ROOT="$root"
	$CARGO deny --locked fetch db
	db="$root/$DB_DIR"
	echo "cargo deny: advisories from the live RustSec database ($URL), commit $(git -C "$db" rev-parse --short=12 HEAD) of $(git -C "$db" show -s --format=%cs HEAD)"
	exec $CARGO deny --locked check --deny warnings
fi

snapshot=${ADVISORY_DB:-}
if [ -z "$snapshot" ] || [ ! -f "$snapshot/SNAPSHOT.txt" ] || [ ! -d "$snapshot/crates" ]; then
	echo "cargo deny: $URL is unreachable and ADVISORY_DB (${snapshot:-unset}) names no snapshot of it (a directory with SNAPSHOT.txt and crates/): no advisory check is possible; set ADVISORY_DB" >&2
	exit 1
fi
commit=$(grep -o 'commit [0-9a-f]\{40\}' "$snapshot/SNAPSHOT.txt" | head -1 | cut -d' ' -f2)
date=$(grep -o 'committed [0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}' "$snapshot/SNAPSHOT.txt" | head -1 | cut -d' ' -f2)
if [ -z "$commit" ] || [ -z "$date" ]; then
	echo "cargo deny: $snapshot/SNAPSHOT.txt names no upstream commit and date ('commit <40 hex>', 'committed YYYY-MM-DD')" >&2
	exit 1
fi
age=$(( ($(date -u +%s) - $(date -u -d "$date" +%s)) / 86400 ))

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/$DB_DIR"
cp -R "$snapshot/." "$root/$DB_DIR/"
(
	cd "$root/$DB_DIR"
	git init -q
	git add -A
	GIT_AUTHOR_DATE="${date}T00:00:00Z" GIT_COMMITTER_DATE="${date}T00:00:00Z" \
		git -c user.name=snapshot -c user.email=snapshot@localhost -c commit.gpgsign=false \
		commit -q -m "RustSec advisory-db $commit"
)
export RDMA_STREAMS_ADVISORY_DB_ROOT="$root"
echo "cargo deny: advisories from the snapshot $snapshot (RustSec commit ${commit:0:12} of $date, $age days old; $URL is unreachable)"
$CARGO deny --frozen check --deny warnings

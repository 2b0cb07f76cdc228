#!/usr/bin/env python3
"""Reads back the dependency list cargo-auditable embedded in each shipped artefact.

Usage: scripts/check-auditable.py Cargo.lock ARTEFACT=PACKAGE [ARTEFACT=PACKAGE ...]

For each artefact: its `.dep-v0` section (zlib-compressed JSON, the format Trivy, Grype and Syft
read) must exist, name PACKAGE as its root, list only crates that Cargo.lock holds at those
versions, and list every crate of Cargo.lock that PACKAGE links (its normal dependencies, as
`cargo tree` reports them). One line per artefact; exit 1 on the first artefact that fails.
"""

import json
import os
import subprocess
import sys
import tempfile
import tomllib
import zlib


def embedded(path):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dep-v0")
        run = subprocess.run(
            ["objcopy", "--dump-section", f".dep-v0={out}", path, os.path.join(tmp, "copy")],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"{path}: no .dep-v0 section (not built with cargo auditable?): {run.stderr.strip()}")
        with open(out, "rb") as f:
            return json.loads(zlib.decompress(f.read()))


def linked(package):
    """name@version of every crate `package` links (normal dependencies, no build or dev)."""
    tree = subprocess.run(
        ["cargo", "tree", "--locked", "-p", package, "-e", "normal", "--prefix", "none",
         "--format", "{p}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    crates = set()
    for line in tree.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("v"):
            crates.add(f"{parts[0]}@{parts[1][1:]}")
    return crates


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], "rb") as f:
        lock = {f"{p['name']}@{p['version']}" for p in tomllib.load(f)["package"]}
    for arg in sys.argv[2:]:
        path, _, package = arg.partition("=")
        packages = embedded(path)["packages"]
        names = {f"{p['name']}@{p['version']}" for p in packages}
        roots = [p["name"] for p in packages if p.get("root")]
        if roots != [package]:
            raise SystemExit(f"{path}: root {roots}, expected [{package!r}]")
        unknown = sorted(names - lock)
        if unknown:
            raise SystemExit(f"{path}: crates not in Cargo.lock: {unknown}")
        missing = sorted(linked(package) - names)
        if missing:
            raise SystemExit(f"{path}: linked crates not embedded: {missing}")
        build = sum(1 for p in packages if p.get("kind") == "build")
        print(f"{os.path.basename(path)}: {len(packages)} crates embedded ({build} build-time), root {package}")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Rewrite tools/image/requirements.lock: gpupack's runtime dependencies (the closure
# pip resolves for its wheel as manylinux wheels for CPython 3.11), each pinned to the
# version installed in this Python environment (the one the tests ran in) or, where
# none is, to the version pip resolved.
#
# Usage: tools/image/lock.sh      (after changing pyproject.toml's dependencies)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
python3 -m pip wheel -q --no-deps -w "${work}" "${root}"
python3 -m pip install -q --dry-run --ignore-installed --only-binary=:all: --target "${work}/t" \
    --implementation cp --python-version 3.11 --abi cp311 \
    --platform manylinux_2_36_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --report "${work}/report.json" "${work}"/gpupack-*.whl
python3 - "${work}/report.json" "${here}/requirements.lock" <<'PY'
import importlib.metadata as md
import json
import sys

report, lock = sys.argv[1], sys.argv[2]
header = [line for line in open(lock) if line.startswith("#")]
pins = []
for item in json.load(open(report))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name == "gpupack":
        continue
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        pass
    pins.append(f"{name}=={version}")
with open(lock, "w") as out:
    out.writelines(header)
    out.write("\n".join(sorted(pins, key=str.lower)) + "\n")
print(f"{lock}: {len(pins)} pins", file=sys.stderr)
PY

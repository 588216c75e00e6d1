"""The committed kubelet gRPC stubs are exactly what tools/proto/generate.py makes from k8s.io/kubelet
at the pinned Kubernetes version: regenerating them into a temporary directory changes no byte.

Needs Go and the Go module proxy (or a module cache that already holds k8s.io/kubelet at the pinned
version). CI has both (it builds Kubernetes), so this fails rather than skips when Go is missing.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "node" / "kubeletapi"
GENERATOR = ROOT / "tools" / "proto" / "generate.py"


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.fail("Go is not on PATH: tools/proto/generate.py fetches k8s.io/kubelet with `go mod download`. "
                    "Install Go (CI has it; tools/k8s/build.sh needs it too).")
    out = tmp_path / "kubeletapi"
    result = subprocess.run([sys.executable, str(GENERATOR), "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, f"tools/proto/generate.py exited {result.returncode}:\n{result.stderr[-3000:]}"

    committed, regenerated = _files(COMMITTED), _files(out)
    assert sorted(committed) == sorted(regenerated), (
        f"node/kubeletapi holds {sorted(committed)}, the generator writes {sorted(regenerated)}; "
        "run python3 tools/proto/generate.py and commit the result")
    changed = [name for name in committed if committed[name] != regenerated[name]]
    diff = "".join(
        line for name in changed[:2] for line in difflib.unified_diff(
            committed[name].decode(errors="replace").splitlines(keepends=True),
            regenerated[name].decode(errors="replace").splitlines(keepends=True),
            f"committed/{name}", f"regenerated/{name}", n=1))
    assert not changed, (f"regenerating changes {changed}: run python3 tools/proto/generate.py and commit "
                         f"the result (and check the pins it prints).\n{diff[:4000]}")

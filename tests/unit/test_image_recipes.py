"""The two image recipes (tools/image/build.sh, Containerfile) read the same inputs, and every
place that names gpupack's version names the same one."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "tools" / "image"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[<>=!;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_the_lock_pins_every_runtime_dependency_once() -> None:
    pins = [line.strip() for line in (IMAGE / "requirements.lock").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9_.+\-]*", p) for p in pins), pins
    names = [_name(p) for p in pins]
    assert len(names) == len(set(names))
    wanted = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert wanted <= set(names), f"run tools/image/lock.sh: {sorted(wanted - set(names))} not pinned"


def test_both_recipes_read_the_same_package_list_lock_and_finishing_script() -> None:
    containerfile = (ROOT / "Containerfile").read_text()
    build = (IMAGE / "build.sh").read_text()
    for shared in ("packages.txt", "requirements.lock", "finish-rootfs.sh"):
        assert f"tools/image/{shared}" in containerfile or f"/tmp/{shared}" in containerfile, shared
        assert f"/{shared}" in build, shared
    # Same Python: CPython 3.11 (Debian bookworm's) in both.
    assert "python:3.11-slim-bookworm" in containerfile and "debian:bookworm-slim" in containerfile
    assert "--python-version 3.11" in build and " bookworm " in build
    # Same user and entrypoint as the manifests expect.
    assert "USER 65532:65532" in containerfile and "--config.user 65532:65532" in build
    assert 'ENTRYPOINT ["/usr/local/bin/gpupack"]' in containerfile
    assert "--config.entrypoint /usr/local/bin/gpupack" in build


def test_the_chart_and_the_manifests_name_the_package_version() -> None:
    version = PYPROJECT["project"]["version"]
    chart = yaml.safe_load((ROOT / "manifests" / "helm" / "gpupack" / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    images = set()
    for path in (ROOT / "manifests").rglob("*.yaml"):
        if "helm" not in path.parts:
            images |= set(re.findall(r"image: (ghcr\.io/gpupack/gpupack:\S+)", path.read_text()))
    assert images == {f"ghcr.io/gpupack/gpupack:{version}"}
    from gpupack import __version__

    assert __version__ == version

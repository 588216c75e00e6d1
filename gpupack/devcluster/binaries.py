"""Find, or build on demand, the pinned kube-apiserver, kube-scheduler and etcd, helm, kustomize, Prometheus and Kueue.

kube-controller-manager and kwok are optional: only a control plane started with
them needs them (``ensure_binaries(controller_manager=True, kwok=True)`` builds
them), so a cache built before they were added keeps serving the callers that
need only the three, and ``gpupack dev cluster up`` without them builds nothing more.

The builds themselves are ``tools/k8s/build.sh`` and ``tools/go-tool.sh`` (Go,
pinned versions, cached by version under ``$GPUPACK_CACHE_DIR`` or
``~/.cache/gpupack``); this module only asks them where the binaries live and runs
them, streaming their progress, when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpupack.devcluster.errors import BuildFailed, ToolchainMissing

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "k8s" / "build.sh"
GO_TOOL_SCRIPT = REPO_ROOT / "tools" / "go-tool.sh"
NAMES = ("etcd", "kube-apiserver", "kube-scheduler")  # every control plane needs these
CONTROLLER_MANAGER = "kube-controller-manager"
KWOK = "kwok"  # sigs.k8s.io/kwok, from its own wrapper module tools/kwok
OPTIONAL_NAMES = (CONTROLLER_MANAGER, KWOK)  # built, and required, only when asked for
# build.sh exit status when Go is missing or too old.
_EXIT_NO_TOOLCHAIN = 3


@dataclass(frozen=True)
class Binaries:
    """Paths of the control-plane binaries: three always needed, kube-controller-manager and kwok optional."""

    bin_dir: Path

    @property
    def etcd(self) -> Path:
        return self.bin_dir / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.bin_dir / "kube-apiserver"

    @property
    def kube_scheduler(self) -> Path:
        return self.bin_dir / "kube-scheduler"

    @property
    def kube_controller_manager(self) -> Path:
        return self.bin_dir / CONTROLLER_MANAGER

    @property
    def kwok(self) -> Path:
        return self.bin_dir / KWOK

    def missing(self, optional: Sequence[str] = ()) -> list[str]:
        """The required binaries, and the ``optional`` ones asked for, that are not there."""
        return [n for n in (*NAMES, *optional) if not os.access(self.bin_dir / n, os.X_OK)]

    def require(self, name: str) -> Path:
        """The path of binary ``name``; :class:`BuildFailed` naming how to get it if it is missing."""
        path = self.bin_dir / name
        if os.access(path, os.X_OK):
            return path
        if os.environ.get("GPUPACK_K8S_BIN_DIR"):
            fix = f"put a {name} binary of the pinned version into GPUPACK_K8S_BIN_DIR={self.bin_dir}"
        else:
            fix = (f"run `tools/k8s/build.sh {name}` (needs Go >= 1.26; a few minutes on 2 cores; "
                   "builds only what is missing)")
        raise BuildFailed(f"{name} is not built ({path} is missing)", fix)


def cached_bin_dir() -> Path:
    """Where build.sh puts (or has put) the binaries of the pinned versions.

    ``GPUPACK_K8S_BIN_DIR`` overrides it, for prebuilt binaries.
    """
    override = os.environ.get("GPUPACK_K8S_BIN_DIR")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"],
        check=True, capture_output=True, text=True, timeout=30,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def ensure_binaries(
    progress: TextIO | None = None, build: bool = True, *, controller_manager: bool = False, kwok: bool = False
) -> Binaries:
    """The binaries, built first if they are not cached yet.

    ``controller_manager``, ``kwok``: kube-controller-manager, kwok are needed too
    (built if missing); otherwise they are neither built nor required. Build
    progress streams to ``progress`` (default stderr). Raises
    :class:`ToolchainMissing` or :class:`BuildFailed` with the fix.
    """
    binaries = Binaries(cached_bin_dir())
    optional = optional_names(controller_manager=controller_manager, kwok=kwok)
    wanted = (*NAMES, *optional)
    missing = binaries.missing(optional)
    if not missing:
        return binaries
    if os.environ.get("GPUPACK_K8S_BIN_DIR"):
        raise BuildFailed(
            f"GPUPACK_K8S_BIN_DIR={binaries.bin_dir} lacks {', '.join(missing)}",
            f"point GPUPACK_K8S_BIN_DIR at a directory holding {', '.join(wanted)}, "
            "or unset it to build them with tools/k8s/build.sh",
        )
    if not build:
        raise BuildFailed(
            f"control-plane binaries are not built yet ({', '.join(missing)} in {binaries.bin_dir})",
            f"run tools/k8s/build.sh {' '.join(missing)} (needs Go >= 1.26; about 10 minutes on 2 cores "
            "the first time)",
        )
    if shutil.which("go") is None:
        raise ToolchainMissing(
            f"the Go toolchain ('go') is not on PATH, so {', '.join(missing)} cannot be built",
            "install Go >= 1.26 and re-run; or set GPUPACK_K8S_BIN_DIR to prebuilt binaries; "
            "or, to skip the e2e tests deliberately, set GPUPACK_SKIP_E2E=1",
        )
    # Only what is missing and wanted: build.sh skips the binaries already cached.
    status, tail = _stream_build([str(BUILD_SCRIPT), *missing], f"{', '.join(missing)} into {binaries.bin_dir}",
                                 progress)
    if status == _EXIT_NO_TOOLCHAIN:
        raise ToolchainMissing(
            "tools/k8s/build.sh found no usable Go toolchain",
            "install Go >= 1.26 (see the build output above)",
            "\n".join(tail),
        )
    if status != 0 or binaries.missing(optional):
        raise BuildFailed(
            f"tools/k8s/build.sh failed with exit status {status}",
            "read the build output above; re-run tools/k8s/build.sh by hand to retry",
            "\n".join(tail),
        )
    return binaries


def optional_names(*, controller_manager: bool = False, kwok: bool = False) -> tuple[str, ...]:
    """The optional binaries a control plane with these parts needs."""
    return tuple(name for name, wanted in ((CONTROLLER_MANAGER, controller_manager), (KWOK, kwok)) if wanted)


def ensure_helm(progress: TextIO | None = None) -> Path:
    """The pinned helm binary (``GPUPACK_HELM`` overrides it), built first if not cached yet."""
    return ensure_go_tool("helm", "GPUPACK_HELM", progress)


def ensure_kustomize(progress: TextIO | None = None) -> Path:
    """The pinned kustomize binary (``GPUPACK_KUSTOMIZE`` overrides it), built first if not cached yet."""
    return ensure_go_tool("kustomize", "GPUPACK_KUSTOMIZE", progress)


def ensure_prometheus(progress: TextIO | None = None) -> Path:
    """The pinned Prometheus server (``GPUPACK_PROMETHEUS`` overrides it), built first if not cached yet: only
    the e2e test of the recommender's Prometheus source runs it (``tools/prometheus/build.sh``)."""
    return ensure_go_tool("prometheus", "GPUPACK_PROMETHEUS", progress)


KUEUE_BUILD_SCRIPT = REPO_ROOT / "tools" / "kueue" / "build.sh"


def ensure_kueue(progress: TextIO | None = None, build: bool = True) -> Path:
    """The pinned Kueue manager (``GPUPACK_KUEUE`` overrides it), built first if not cached yet, with its
    module's CRDs and webhook manifests beside it (``tools/kueue/build.sh``). ``build=False``: never
    build; :class:`BuildFailed` with the fix when it is missing."""
    override = os.environ.get("GPUPACK_KUEUE")
    if override:
        if not os.access(override, os.X_OK):
            raise BuildFailed(f"GPUPACK_KUEUE={override} is not an executable file",
                              "point GPUPACK_KUEUE at a kueue binary, or unset it to build one with tools/kueue/build.sh")
        return Path(override)
    out = subprocess.run(["bash", str(KUEUE_BUILD_SCRIPT), "--print-path"], check=True, capture_output=True,
                         text=True, timeout=30)
    path = Path(out.stdout.strip().splitlines()[-1])
    if os.access(path, os.X_OK) and (path.parent / "config" / "webhook" / "manifests.yaml").is_file():
        return path
    if not build:
        raise BuildFailed(f"Kueue is not built yet ({path} or its config/ folder is missing)",
                          "run tools/kueue/build.sh (needs Go >= 1.26; about 8 minutes on 2 cores the first time)")
    if shutil.which("go") is None:
        raise ToolchainMissing("the Go toolchain ('go') is not on PATH, so Kueue cannot be built",
                               "install Go >= 1.26 and re-run; or set GPUPACK_KUEUE to a built kueue binary")
    status, tail = _stream_build([str(KUEUE_BUILD_SCRIPT)], f"kueue into {path}", progress)
    if status != 0 or not os.access(path, os.X_OK):
        raise BuildFailed(f"tools/kueue/build.sh failed with exit status {status}",
                          "read the build output above; re-run tools/kueue/build.sh by hand to retry", "\n".join(tail))
    return path


def ensure_go_tool(tool: str, override_env: str, progress: TextIO | None = None) -> Path:
    """A Go command-line tool of ``tools/<tool>`` (``tools/go-tool.sh``), or the binary ``override_env`` names."""
    override = os.environ.get(override_env)
    if override:
        if not os.access(override, os.X_OK):
            raise BuildFailed(f"{override_env}={override} is not an executable file",
                              f"point {override_env} at a {tool} binary, or unset it to build one with "
                              f"tools/{tool}/build.sh")
        return Path(override)
    out = subprocess.run(["bash", str(GO_TOOL_SCRIPT), tool, "--print-path"], check=True, capture_output=True,
                         text=True, timeout=30)
    path = Path(out.stdout.strip().splitlines()[-1])
    if os.access(path, os.X_OK):
        return path
    if shutil.which("go") is None:
        raise ToolchainMissing(f"the Go toolchain ('go') is not on PATH, so {tool} cannot be built",
                               f"install Go >= 1.26 and re-run; or set {override_env} to a {tool} binary")
    status, tail = _stream_build([str(GO_TOOL_SCRIPT), tool], f"{tool} into {path}", progress)
    if status != 0 or not os.access(path, os.X_OK):
        raise BuildFailed(f"tools/{tool}/build.sh failed with exit status {status}",
                          f"read the build output above; re-run tools/{tool}/build.sh by hand to retry",
                          "\n".join(tail))
    return path


def _stream_build(command: list[str], what: str, progress: TextIO | None) -> tuple[int, list[str]]:
    """Run a build script, streaming its output (a first build takes minutes); its status and last lines."""
    out = progress or sys.stderr
    out.write(f"gpupack: building {what} (first time only)\n")
    out.flush()
    proc = subprocess.Popen(["bash", *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        out.write(line)
        out.flush()
        tail = (tail + [line.rstrip()])[-30:]
    return proc.wait(), tail

"""The record of a background control plane started by ``gpupack dev cluster up``.

``up`` returns while etcd, kube-apiserver and kube-scheduler keep running, so
``down`` and ``status`` (later, other processes) find them through a JSON file
in the state dir (``$GPUPACK_DEVCLUSTER_DIR``, default
``~/.cache/gpupack/devcluster``). Before signalling a recorded pid we check
that it still runs the recorded binary, so a recycled pid is never killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "state.json"


def state_dir() -> Path:
    override = os.environ.get("GPUPACK_DEVCLUSTER_DIR")
    if override:
        return Path(override)
    cache = os.environ.get("GPUPACK_CACHE_DIR") or str(Path.home() / ".cache" / "gpupack")
    return Path(cache) / "devcluster"


@dataclass(frozen=True)
class Component:
    name: str
    pid: int
    binary: str
    log: str


@dataclass(frozen=True)
class DevClusterRecord:
    """What a detached dev cluster leaves on disk so a later command can find and stop it."""

    workdir: str
    kubeconfig: str
    server: str
    ports: dict[str, int]
    components: tuple[Component, ...]
    started_at: float
    startup_seconds: float

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, directory: Path) -> DevClusterRecord | None:
        path = directory / STATE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            raw["components"] = tuple(Component(**c) for c in raw["components"])
            return cls(**raw)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"unreadable state file {path}: {exc}; delete it") from exc


def alive(component: Component) -> bool:
    """Whether ``component.pid`` still runs ``component.binary`` (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{component.pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{component.pid}/stat").read_text()
    except OSError:
        return False
    # A dead child not yet reaped is a zombie ("Z"): it runs nothing.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and cmdline.split(b"\0", 1)[0].decode(errors="replace") == component.binary


def stop_components(state: DevClusterRecord, grace_s: float = 10.0) -> list[str]:
    """Stop the recorded components, newest first; returns the names that were running."""
    stopped = []
    for comp in reversed(state.components):
        if not alive(comp):
            continue
        stopped.append(comp.name)
        _killpg(comp.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while alive(comp) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(comp):
            _killpg(comp.pid, signal.SIGKILL)
    return stopped


def remove(state: DevClusterRecord | None, directory: Path) -> None:
    """Delete the cluster's data and the state file."""
    if state is not None:
        shutil.rmtree(state.workdir, ignore_errors=True)
    (directory / STATE_FILE).unlink(missing_ok=True)


def _killpg(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # components lead their own process group
    except (ProcessLookupError, PermissionError):
        pass

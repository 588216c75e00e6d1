"""One lock for the MIG changes of a DRA node, shared by the kubelet plugin and the node agent.

They run in two containers of one pod and both change MIG instances: the plugin
creates (or adopts) an instance when it prepares a claim and destroys it at
unprepare; the agent destroys instances that no claim holds and that have been
idle for the SharingPolicy's idle time (``node.advertising.dra_reclaim``). Without
a common lock the agent could destroy an idle instance in the instant between the
plugin adopting it for a claim and journalling that it did, and the claim's
container would get a MIG device that no longer exists.

The lock is ``flock`` on ``<plugin state dir>/nvml.lock``, a host path both
containers mount (the agent read-only: ``flock`` needs no write access). The
plugin creates the file at start and holds the lock, blocking, around each
prepare, unprepare and recovery. The agent only tries: when the plugin holds it,
the agent destroys nothing this tick; when the file does not exist (no plugin has
started on this node) it destroys nothing either, since it cannot tell which
instances a claim is about to use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Final

LOCK_NAME: Final = "nvml.lock"


def lock_path(claims_dir: Path) -> Path:
    """The lock beside the plugin's journal directory (``<state dir>/claims``)."""
    return claims_dir.parent / LOCK_NAME


class NvmlChangeLock:
    """The plugin's side: the file is created at once, the lock taken (blocking) on ``with``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def __enter__(self) -> NvmlChangeLock:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


@contextlib.contextmanager
def try_hold(path: Path) -> Iterator[str | None]:
    """The agent's side: holds the lock for the ``with`` block and yields None, or yields why it
    could not (the block must then change nothing). Never waits, never creates the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield f"no {path}: the DRA kubelet plugin has not started on this node"
        return
    except OSError as exc:
        yield f"cannot open {path}: {exc}"
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "the DRA kubelet plugin is preparing or unpreparing a claim"
            return
        try:
            yield None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

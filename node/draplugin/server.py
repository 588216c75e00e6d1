"""Serving the plugin: the DRA socket, the registration socket, and a clean stop.

Start order matters to the kubelet: its plugin watcher calls ``GetInfo`` as soon
as the registration socket appears and then connects to the endpoint it names,
so the DRA socket is serving first. Stop order is the reverse: the registration
socket is removed first (the watcher deregisters the plugin when it goes), calls
in flight get ``grace`` seconds, then the DRA socket goes. A socket file left by
a killed plugin is replaced at start; anything else at that path is refused.

One plugin per state directory: :func:`lock_state_dir` holds an exclusive lock
for the life of the process (the kernel drops it when the process dies, however
it dies), so a second copy cannot interleave its NVML calls and journal writes
with the first's.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from node.draplugin.prepare import ClaimPreparer
from node.draplugin.service import MAX_HEALTH_STREAMS, DraService, HealthService, RegistrationService
from node.kubeletapi import dra_health_v1_pb2_grpc as dra_health_grpc
from node.kubeletapi import dra_v1_pb2_grpc as dra_grpc
from node.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc

log = logging.getLogger("gpupack.dra-plugin")
WORKERS = 4
"""gRPC worker threads for prepare and unprepare. They are serialized by the engine; a few workers
let calls for other claims queue rather than be refused. Each open health stream holds one more
(``MAX_HEALTH_STREAMS`` are added to the DRA socket's pool)."""


class StateDirBusy(Exception):
    """Another plugin process holds the state directory."""


def lock_state_dir(state_dir: Path) -> int:
    """Lock ``state_dir`` for this process; returns the descriptor to keep open. Raises :class:`StateDirBusy`."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "plugin.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise StateDirBusy(f"another gpupack DRA plugin (pid {holder}) holds {state_dir}") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def remove_socket(path: Path) -> None:
    """Remove the unix socket at ``path`` if there is one; refuse to remove anything else."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; not removing it", str(path))
    path.unlink(missing_ok=True)


def _bind(server: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_socket(path)
    try:
        port = server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot listen on {path}: {exc}", str(path)) from None
    if port == 0:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot listen on {path}", str(path))


class PluginServer:
    """Both sockets of one plugin."""

    def __init__(self, preparer: ClaimPreparer, plugin_socket: Path, registration_socket: Path,
                 health: HealthService | None = None) -> None:
        self.plugin_socket = plugin_socket
        self.registration_socket = registration_socket
        self.dra = DraService(preparer)
        self.health = health
        self.registration = RegistrationService(plugin_socket, health=health is not None)
        self._dra_server: Any = None
        self._registration_server: Any = None

    def start(self) -> None:
        self._dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS + MAX_HEALTH_STREAMS))
        dra_grpc.add_DRAPluginServicer_to_server(self.dra, self._dra_server)
        if self.health is not None:
            dra_health_grpc.add_DRAResourceHealthServicer_to_server(self.health, self._dra_server)
        _bind(self._dra_server, self.plugin_socket)
        self._dra_server.start()
        self._registration_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(self.registration, self._registration_server)
        _bind(self._registration_server, self.registration_socket)
        self._registration_server.start()
        log.info("serving DRA on %s, registration on %s", self.plugin_socket, self.registration_socket)

    def stop(self, grace_s: float) -> int:
        """Deregister, let calls in flight finish for up to ``grace_s``, and remove both sockets.

        Returns how many calls are still running (stuck in a slow NVML call): their
        threads cannot be stopped, so the caller should exit without waiting for them;
        the journal rolls back what they began at the next start."""
        _quietly(remove_socket, self.registration_socket)
        if self.health is not None:
            self.health.close()  # health streams never finish on their own: end them before the grace
        if self._registration_server is not None:
            self._registration_server.stop(None).wait()
        if self._dra_server is not None:
            self._dra_server.stop(grace_s).wait()
        _quietly(remove_socket, self.plugin_socket)
        unfinished = self.dra.in_flight
        log.info("stopped; sockets removed%s", f"; {unfinished} call(s) still running" if unfinished else "")
        return unfinished


def serve_until(server: PluginServer, stop: threading.Event, grace_s: float) -> int:
    """Serve until ``stop`` is set (a signal handler sets it), then stop cleanly; returns
    :meth:`PluginServer.stop`'s count of calls still running."""
    server.start()
    try:
        while not stop.wait(1.0):
            pass
    except BaseException:
        server.stop(grace_s)
        raise
    return server.stop(grace_s)


def _quietly(fn: Any, path: Path) -> None:
    try:
        fn(path)
    except OSError as exc:
        log.warning("cannot remove %s: %s", path, exc)

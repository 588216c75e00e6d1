"""The MPS control daemon of a DRA node, run and watched by the kubelet plugin.

A share's MPS limits (``node.draplugin.mps``) are read by the CUDA runtime of
each client process and enforced by the MPS server, which the MPS control
daemon (``nvidia-cuda-mps-control -d``) starts for the clients that connect
through its pipe directory. On the device-plugin backend the GPU Operator runs
that daemon with its device plugin; on a DRA node pool that plugin is off, so
with ``--run-mps-daemon`` gpupack's plugin runs it itself:

* **start**: ``nvidia-cuda-mps-control -d`` with ``CUDA_MPS_PIPE_DIRECTORY``
  (the directory the plugin's CDI specs hand every shared claim's containers,
  ``PluginSettings.mps_pipe_directory``) and ``CUDA_MPS_LOG_DIRECTORY``, and
  ``CUDA_VISIBLE_DEVICES`` set to the UUIDs of the node's GPUs with MIG off (the
  ones shared devices are published for); the daemon is up once its ``control``
  pipe exists in the pipe directory;
* **watch**: :meth:`MpsDaemon.check`, called by the plugin's watcher thread,
  starts the daemon again when its ``control`` pipe is gone (it died, or someone
  stopped it), and says so in the log;
* **stop**: ``quit`` on the control daemon's standard input, when the plugin
  stops (the clients' servers go with it; the kubelet stops pods before it
  stops the plugin on a drained node).

Nothing here changes GPU state: no compute mode, no MIG mode. A GPU whose MIG
mode changes while the daemon runs is not added to or taken from it until the
plugin restarts (the daemon's device list is fixed at start).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger("gpupack.dra-plugin")

CONTROL_PIPE: Final = "control"
"""What the control daemon creates in its pipe directory once it listens."""
DEFAULT_BINARY: Final = "nvidia-cuda-mps-control"


class MpsDaemonError(RuntimeError):
    """The daemon could not be started or stopped: what was run, and what it said."""


@dataclass
class MpsDaemon:
    """One control daemon for the node's MIG-off GPUs (see the module docstring)."""

    pipe_directory: Path
    log_directory: Path
    gpu_uuids: Sequence[str]
    binary: str = DEFAULT_BINARY
    start_timeout_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    starts: int = field(default=0, init=False)
    """Times the daemon was started (1 after :meth:`start`; more after restarts)."""

    @property
    def control_pipe(self) -> Path:
        return self.pipe_directory / CONTROL_PIPE

    def env(self) -> Mapping[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_directory),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_directory),
                "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_uuids)}

    def running(self) -> bool:
        return self.control_pipe.exists()

    def start(self) -> None:
        """Start the daemon unless it runs already; raises :class:`MpsDaemonError` when it does not
        come up within ``start_timeout_s``."""
        if self.running():
            log.info("MPS control daemon already runs (%s exists); using it", self.control_pipe)
            return
        self.pipe_directory.mkdir(parents=True, exist_ok=True)
        self.log_directory.mkdir(parents=True, exist_ok=True)
        # Its output goes to a file, not a pipe: a daemon that kept the pipe open would make us wait
        # for it to exit.
        said_path = self.log_directory / "start.log"
        try:
            with open(said_path, "w", encoding="utf-8") as said_file:
                done = subprocess.run([self.binary, "-d"], env=dict(self.env()), stdin=subprocess.DEVNULL,
                                      stdout=said_file, stderr=subprocess.STDOUT, timeout=self.start_timeout_s,
                                      check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsDaemonError(f"{self.binary} -d could not be run: {exc}") from None
        if done.returncode != 0:
            said = said_path.read_text(encoding="utf-8", errors="replace").strip()[-300:]
            raise MpsDaemonError(f"{self.binary} -d exited {done.returncode}: {said or 'no output'}")
        deadline = self.clock() + self.start_timeout_s
        while not self.running():
            if self.clock() >= deadline:
                raise MpsDaemonError(f"{self.binary} -d started but {self.control_pipe} did not appear within "
                                     f"{self.start_timeout_s:.0f} s (see {self.log_directory}/control.log)")
            self.sleep(0.05)
        self.starts += 1
        log.info("MPS control daemon started for %d GPU(s); pipes in %s", len(self.gpu_uuids), self.pipe_directory)

    def check(self) -> bool:
        """Start the daemon again if it is gone; True when it runs afterwards (a failed restart is logged
        and tried again at the next check)."""
        if self.running():
            return True
        log.warning("MPS control daemon is gone (%s missing): starting it again; until it runs, shares of a "
                    "GPU are not limited", self.control_pipe)
        try:
            self.start()
        except MpsDaemonError as exc:
            log.error("MPS control daemon not restarted: %s", exc)
            return False
        return True

    def stop(self) -> None:
        """``quit`` the daemon (nothing to do when it is not running)."""
        if not self.running():
            return
        try:
            subprocess.run([self.binary], input="quit\n", env=dict(self.env()), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, text=True, timeout=self.start_timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("MPS control daemon not stopped: %s", exc)
            return
        log.info("MPS control daemon stopped")


def watch(daemon: MpsDaemon, stop: threading.Event, every_s: float = 10.0) -> threading.Thread:
    """A daemon thread checking ``daemon`` every ``every_s`` until ``stop`` is set."""
    def loop() -> None:
        while not stop.wait(every_s):
            daemon.check()

    thread = threading.Thread(target=loop, name="mps-daemon-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["CONTROL_PIPE", "DEFAULT_BINARY", "MpsDaemon", "MpsDaemonError", "watch"]

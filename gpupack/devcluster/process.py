"""Run and supervise one control-plane process; wait for things with a deadline.

Every wait here has a timeout and, when it expires, says what it waited for and
shows the end of the component's log: a broken start-up fails in seconds with a
reason instead of hanging a test session.

Processes are started in their own session (process group) so that stopping
one also stops anything it spawned. When ``tie_to_parent`` is set, Linux
``PR_SET_PDEATHSIG`` makes the kernel kill the child when the process that
started it dies, even by SIGKILL, so a crashed or killed test run leaves no
stray etcd or kube-apiserver behind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupack.devcluster.errors import PortInUse, StartFailed

_PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 25


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)  # the kernel's default when the file cannot be read
LOWEST_PICKED_PORT = 10000  # below: ports that well-known and registered services tend to use
_handed_out: set[int] = set()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections and ``bind(0)`` (inclusive bounds)."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return low, high


def free_port(host: str = "127.0.0.1", *, ephemeral: tuple[int, int] | None = None,
              rng: random.Random | None = None) -> int:
    """A TCP port that is free on ``host`` right now, for a server about to be started.

    Picked at random *below* the kernel's ephemeral range: a port the kernel hands out
    (``bind(0)``) can be taken by any outgoing connection between picking it and the server
    binding it, which on a busy test machine happens (kube-apiserver once failed a CI run
    that way). Ports handed out earlier in this process are not picked again. Falls back to
    the kernel's pick when the range leaves no room below it."""
    low, _ = ephemeral or ephemeral_range()
    pick = rng or random.SystemRandom()
    if low - LOWEST_PICKED_PORT >= 1000:
        for _ in range(200):
            port = pick.randrange(LOWEST_PICKED_PORT, low)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        kernel_pick: int = sock.getsockname()[1]
    _handed_out.add(kernel_pick)
    return kernel_pick


def _bindable(host: str, port: int) -> bool:
    return _bind_error(host, port) is None


def _bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not bind ``host:port`` now, or None. Probes as servers bind
    (``SO_REUSEADDR``: a port left in TIME_WAIT by a process that just exited is free for them)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def check_port_free(port: int, what: str, host: str = "127.0.0.1") -> None:
    """Raise :class:`PortInUse` naming ``what`` needed the port and how to fix it.

    Other bind errors (permission, an address this host does not have) are raised as they are."""
    error = _bind_error(host, port)
    if error is None:
        return
    if error.errno != errno.EADDRINUSE:
        raise error
    raise PortInUse(
        f"{what} needs {host}:{port}, but another process is listening there",
        f"stop that process (see `ss -ltnp 'sport = :{port}'`), or choose another "
        "port, or leave the port unset so a free one is picked",
    ) from None


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(f"    | {line}" for line in text.splitlines()[-lines:])


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    # SIGKILL, not SIGTERM: kube-apiserver can hang in graceful shutdown once etcd
    # is gone, and the data is throw-away anyway.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class ManagedProcess:
    """One running component with its log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    tie_to_parent: bool = True
    env: Mapping[str, str] | None = None  # set on top of this process's environment
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
                preexec_fn=_die_with_parent if self.tie_to_parent else None,
            )

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def failure(self, cause: str, fix: str) -> StartFailed:
        """A StartFailed carrying this component's log tail (and port clash, if any)."""
        tail = log_tail(self.log_path)
        if "address already in use" in tail:
            return PortInUse(
                f"{self.name}: a port it binds is in use ({cause})",
                "stop the other process or retry; ports are picked free but can be taken "
                "between picking and binding",
                f"  log {self.log_path}:\n{tail}",
            )
        return StartFailed(f"{self.name}: {cause}", fix, f"  log {self.log_path}:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; idempotent."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=grace_s)
        # Anything the process left in its group goes too.
        _signal_group(self.popen.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_until(
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    process: ManagedProcess | None = None,
    interval_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Poll ``ready()`` until it is true; fail fast if ``process`` exits.

    Raises :class:`StartFailed` naming ``what`` after ``timeout_s`` seconds.
    """
    deadline = clock() + timeout_s
    while True:
        if ready():
            return
        if process is not None and not process.running():
            code = process.popen.returncode if process.popen else None
            raise process.failure(
                f"exited with status {code} while waiting for {what}",
                "read the log below; a stale data dir or a port clash are the usual causes",
            )
        if clock() >= deadline:
            if process is not None:
                raise process.failure(
                    f"timed out after {timeout_s:.0f}s waiting for {what}",
                    "the machine may be overloaded; raise GPUPACK_START_TIMEOUT or read the log",
                )
            raise StartFailed(f"timed out after {timeout_s:.0f}s waiting for {what}", "retry")
        time.sleep(interval_s)

"""DRA kubelet plugin settings: one documented group, every field settable from the environment.

``PluginSettings.from_env`` reads ``GPUPACK_DRA_<FIELD>`` (upper case:
``GPUPACK_DRA_CDI_DIR``); command-line flags win over the environment. The
directory defaults are the kubelet's and the container runtimes' standard paths,
so the DaemonSet needs no flags beyond the node name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from kube.settings import settings_from_env
from sharing.dra.names import DRIVER

ShareMode = Literal["mps", "time-slicing"]
SHARE_MODES: tuple[ShareMode, ...] = ("mps", "time-slicing")
PLUGIN_SOCKET: Final = "dra.sock"
REGISTRATION_SOCKET: Final = f"{DRIVER}-reg.sock"
MAX_SOCKET_PATH: Final = 107
"""``sun_path`` holds 108 bytes with its terminating NUL on Linux: a longer socket path cannot be bound."""


@dataclass(frozen=True)
class PluginSettings:
    node_name: str = ""
    """The Node this plugin serves (downward API). gpupack's pool is named after it: an allocation
    from another pool is refused."""
    plugin_dir: str = f"/var/lib/kubelet/plugins/{DRIVER}"
    """Where the DRA socket (``dra.sock``) lives: the kubelet's plugin directory for this driver
    (``kubeletplugin.KubeletPluginsDir``/<driver> in k8s.io/dynamic-resource-allocation)."""
    registration_dir: str = "/var/lib/kubelet/plugins_registry"
    """The kubelet's plugin watcher directory: the registration socket
    (``gpu.gpupack.io-reg.sock``) appearing here is how the kubelet finds the plugin."""
    cdi_dir: str = "/var/run/cdi"
    """Where CDI spec files go: containerd's and CRI-O's default transient CDI directory."""
    state_dir: str = ""
    """The claim journal (must survive plugin restarts: a host path). Empty: ``<plugin_dir>/state``,
    already a host path the DaemonSet mounts for the socket."""
    share_mode: ShareMode = "mps"
    """How this node's shared GPUs are shared: ``mps`` sets each claim's MPS limits, ``time-slicing``
    sets none (shares are counted by the scheduler, not enforced)."""
    mps_pipe_directory: str = ""
    """MPS: the control daemon's pipe directory, passed to clients (``CUDA_MPS_PIPE_DIRECTORY``)
    and bind-mounted into the container. Empty: not set (the daemon is run by something else that
    also arranges its clients' access, e.g. the GPU Operator's MPS support)."""
    run_mps_daemon: bool = False
    """MPS: run the MPS control daemon for the node's MIG-off GPUs (``node.draplugin.mps_daemon``),
    started with the plugin, started again if it goes, quit when the plugin stops. Needs
    ``share_mode`` mps and ``mps_pipe_directory``. Off: something else runs it (the GPU Operator's
    MPS support), or shares are time-sliced in effect."""
    mps_control_binary: str = "nvidia-cuda-mps-control"
    """MPS: the control daemon's program (the NVIDIA container toolkit mounts it with the driver)."""
    mps_log_directory: str = ""
    """MPS: the daemon's log directory. Empty: ``<state dir>/mps-log``."""
    simulate: str = ""
    """``MODEL:COUNT`` to use the SIMULATED NVML backend (machines without GPUs)."""
    state_file: str = ""
    """Simulated backend only: its JSON state file, so a restarted plugin sees the same GPUs."""
    simulate_delay_seconds: float = 0.0
    """Simulated backend only: seconds each GPU-instance create/destroy takes (kill tests, demos)."""
    claims_file: str = ""
    """Read ResourceClaims from this JSON/YAML file instead of the API server (simulation and
    tests, where no API server holds the claims). Empty: the API server."""
    health_interval_seconds: float = 30.0
    """How often the device health stream the kubelet watches (``v1.DRAResourceHealth``) is sent
    again; each report tells the kubelet to read the device Unknown after three intervals without
    one. The node's GPUNode (the agent's faults) is read once per interval while a claim is
    prepared, never otherwise. 0: no health service (the kubelet is not offered one)."""
    health_stale_seconds: float = 180.0
    """A GPUNode whose heartbeat is older than this reports every device Unknown: the agent that
    would see a fault has stopped (it writes its status at least every 60 s by default)."""
    gpunode_file: str = ""
    """Read the node's GPUNode from this JSON/YAML file instead of the API server (simulation and
    tests). Empty: the API server; with ``claims_file`` and no API server, no health service."""
    shutdown_grace_seconds: float = 10.0
    """On SIGTERM, how long calls in flight may take to finish before the sockets close. A prepare
    cut short is rolled back from the journal at the next start, so this bounds only latency."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> PluginSettings:
        """Defaults, then ``GPUPACK_DRA_*`` variables, then non-None ``overrides`` (``kube.settings``)."""
        return settings_from_env(cls, "GPUPACK_DRA_", env, overrides)

    def validate(self) -> None:
        if self.share_mode not in SHARE_MODES:
            raise ValueError(f"share_mode {self.share_mode!r} is not one of {', '.join(SHARE_MODES)}")
        if self.simulate_delay_seconds < 0:
            raise ValueError(f"simulate_delay_seconds must not be negative, got {self.simulate_delay_seconds}")
        if self.health_interval_seconds < 0:
            raise ValueError(f"health_interval_seconds must not be negative, got {self.health_interval_seconds}")
        if self.health_stale_seconds <= 0:
            raise ValueError(f"health_stale_seconds must be positive, got {self.health_stale_seconds}")
        if self.shutdown_grace_seconds < 0:
            raise ValueError(f"shutdown_grace_seconds must not be negative, got {self.shutdown_grace_seconds}")
        for name in ("plugin_dir", "registration_dir", "cdi_dir"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        for socket in (self.plugin_socket, self.registration_socket):
            if len(str(socket).encode()) > MAX_SOCKET_PATH:
                raise ValueError(f"socket path {socket} is longer than {MAX_SOCKET_PATH} bytes, which a unix "
                                 "socket cannot have; use a shorter directory")
        if self.mps_pipe_directory and not Path(self.mps_pipe_directory).is_absolute():
            raise ValueError(f"mps_pipe_directory must be an absolute path, got {self.mps_pipe_directory!r}")
        if self.run_mps_daemon and (self.share_mode != "mps" or not self.mps_pipe_directory):
            raise ValueError("run_mps_daemon needs share_mode mps and an mps_pipe_directory (the directory the "
                             "daemon listens in and every shared claim's containers are given)")

    @property
    def plugin_socket(self) -> Path:
        """The DRA service's socket: the endpoint the registration names."""
        return Path(self.plugin_dir).absolute() / PLUGIN_SOCKET

    @property
    def registration_socket(self) -> Path:
        return Path(self.registration_dir).absolute() / REGISTRATION_SOCKET

    @property
    def state_path(self) -> Path:
        return (Path(self.state_dir) if self.state_dir else Path(self.plugin_dir) / "state").absolute()

    @property
    def mps_log_path(self) -> Path:
        return Path(self.mps_log_directory).absolute() if self.mps_log_directory else self.state_path / "mps-log"

    @property
    def claims_dir(self) -> Path:
        """The journal: one file per claim."""
        return self.state_path / "claims"

"""Node-agent settings: one documented group, every field settable from the environment.

Each field says its unit and why its default is what it is. ``AgentSettings.from_env``
reads ``GPUPACK_AGENT_<FIELD>`` (upper case); the CLI overrides on top.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from kube.settings import settings_from_env
from sharing.dra.share_policy import SHARES
from sharing.api.keys import GPU_OPERATOR_NAMESPACE, MIG_PARTED_CONFIGMAP

LayoutApplyMode = Literal["direct", "operator"]
"""How the agent applies a MIG layout: NVML directly, or through the GPU Operator's mig-manager."""
LAYOUT_APPLY_MODES: tuple[LayoutApplyMode, ...] = ("direct", "operator")
Backend = Literal["device-plugin", "dra"]
"""Who hands the node's GPUs to containers (ARCHITECTURE.md, "Two backends, chosen per node pool")."""
BACKENDS: tuple[Backend, ...] = ("device-plugin", "dra")


@dataclass(frozen=True)
class AgentSettings:
    node_name: str = ""
    """Kubernetes Node (and GPUNode) name this agent serves; from the downward API."""
    mode: LayoutApplyMode = "direct"
    """``direct``: the agent calls NVML to reshape. ``operator``: it writes a mig-parted
    config and lets the GPU Operator's mig-manager apply it."""
    backend: Backend = "device-plugin"
    """``device-plugin``: the NVIDIA device plugin hands out GPUs (the agent writes its sharing
    config and labels). ``dra``: gpupack's DRA driver ``gpu.gpupack.io`` does; the agent publishes
    the node's ResourceSlices (``node.advertising.dra``) and writes no device-plugin config or
    label. A GPU is owned by one backend, never both; the default keeps existing nodes as they are."""
    simulate: str = ""
    """``MODEL:COUNT`` to use the SIMULATED NVML backend (machines without GPUs)."""
    state_file: str = ""
    """Simulated backend only: JSON state, so a restarted agent sees the same GPUs."""
    simulate_delay_seconds: float = 0.0
    """Simulated backend only: seconds each GPU-instance create/destroy takes (demos, kill tests)."""
    usage_trace: str = ""
    """Simulated backend only: a GenTD26 usage-trace folder whose pods' duty cycle and memory the
    simulated GPU processes play (docs/node-agent.md, "Playing a usage trace"); empty: none."""
    usage_time_scale: float = 60.0
    """Trace seconds played per second of the clock. 60 (one trace minute a second) plays the 22.8
    hours of GenTD26 in 22.8 minutes, a 57 s step every 0.95 s: an agent polling about once a second
    sees nearly every step, one polling every 5 s (the default) about one step in five."""
    usage_trace_start: float = 0.0
    """Unix time at which the trace's first step plays, so the nodes of one replay share a timeline;
    0: the node's own, kept in its state file from its first play (else when the agent starts)."""
    usage_trace_pods: str = ""
    """A CSV ``pod,container_ip`` naming the trace pod each pod (``namespace/name``) plays; the
    other pods take trace pods in order of appearance. Empty: all do."""
    usage_trace_clock: bool = False
    """With ``usage_trace``: time the pods' use histories (``status.usage``) on the trace's clock
    (``sharing.usage.trace_clock``: ``usage_time_scale`` times faster than the wall's from
    ``usage_trace_start``), so a replay's right-sizer keeps its hour of history, its half-life and
    its hourly peaks in trace time; the controller then runs with the same scale and start."""
    poll_seconds: float = 5.0
    """Seconds between NVML reads; NVML reads are cheap, the API patches are rate-limited."""
    usage_sample_seconds: float = 0.0
    """Also sample the pods' GPU use this often *between* ticks (NVML only, no API call but the
    usage publication when due), so a memory peak shorter than a tick is not missed; 0: once per
    tick. While it is on, the agent waits between ticks by sleeping, not on a GPUNode watch: a spec
    change is seen at the next tick, at most ``poll_seconds`` later."""
    min_patch_seconds: float = 2.0
    """Minimum seconds between two status patches of the GPUNode (API server load)."""
    heartbeat_seconds: float = 60.0
    """Status is re-patched at least this often even if nothing changed (staleness signal)."""
    idle_seconds: float = 300.0
    """Default idle time before an instance may be destroyed, when no SharingPolicy says."""
    retry_seconds: float = 60.0
    """Wait before retrying a reconfiguration that was rolled back."""
    max_nvml_errors: int = 5
    """NVML errors a rollback tolerates before the journal ends Failed (and a human looks)."""
    advertise_timeout_seconds: float = 300.0
    """How long to wait for the Node's allocatable to show a new layout."""
    device_plugin_namespace: str = GPU_OPERATOR_NAMESPACE
    device_plugin_selector: str = "app=nvidia-device-plugin-daemonset"
    """Label selector of the NVIDIA device-plugin pods (the GPU Operator's default)."""
    pause_device_plugin: bool = True
    """Set ``nvidia.com/gpu.deploy.device-plugin=false`` while reshaping, as mig-manager does,
    so no pod is handed an instance that is about to be destroyed. Always off on the ``dra``
    backend, where no device plugin runs (and its label is not the agent's to write)."""
    emulate_device_plugin: bool = False
    """SIMULATION: advertise resources on the Node as the device plugin and GFD would."""
    mig_parted_configmap: str = MIG_PARTED_CONFIGMAP
    """Operator mode: ConfigMap (in ``device_plugin_namespace``) mig-manager reads."""
    device_plugin_configmap: str = "gpupack-device-plugin-config"
    """ConfigMap named in ClusterPolicy ``devicePlugin.config.name``; one key per node."""
    mig_config_timeout_seconds: float = 900.0
    """Operator mode: give up waiting for ``nvidia.com/mig.config.state`` after this long."""
    metrics_port: int = 9402
    """Prometheus port; 0 disables. (9400 is dcgm-exporter's, 9401 the webhook's.)"""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """Kubelet PodResources API (which pod holds which device); unreachable: /proc cgroups are used."""
    dcgm_exporter_url: str = ""
    """Optional dcgm-exporter metrics URL for per-MIG-instance activity; empty: not used."""
    pod_usage: bool = True
    """Attribute the GPUs' use to pods every poll and export it as per-pod Prometheus metrics
    (``node.usage``; docs/node-agent.md, "Per-pod GPU use"). On by default: it costs one NVML
    per-process read per GPU with processes and writes nothing to the API server. Off: no such
    reads and no per-pod series."""
    usage_publish_seconds: float = 300.0
    """How often, at most, the per-pod use histories are written to this node's GPUNode
    (``status.usage``, ``node.usage.publication``), and only when they changed. Five minutes: the
    recommender wants hours of history, and at 10,000 pods one write per node per five minutes
    is a few writes a second for the API server, where a sample a minute per pod would be 170."""
    namespace: str = "gpupack-system"
    """gpupack's namespace (from the downward API): where the XID table ConfigMap lives."""
    unhealthy_taint_effect: str = "NoSchedule"
    """Effect of the ``gpupack.io/gpu-unhealthy`` taint while every GPU of the node is unhealthy
    (``NoSchedule``, ``PreferNoSchedule``, ``NoExecute``, or ``none`` for no taint). ``NoSchedule``
    keeps CPU-only pods off too, as GPU nodes usually do; ``NoExecute`` also evicts running pods."""
    dra_whole_gpu: bool = False
    """``dra`` backend: also offer each MIG-enabled GPU as one whole device (kind ``gpu``, which
    excludes every MIG placement of it), while no instance is on it. The kubelet plugin serves a
    claim allocated it with the GPU's full-size MIG instance (every compute and memory slice), MIG
    mode unchanged (docs/dra.md): the whole GPU's compute and memory, with MIG's limits (no
    peer-to-peer). Off by default: the full-size placement (``7g.80gb`` on an H100) already offers
    the same instance as a MIG device."""
    dra_claims_dir: str = "/var/lib/kubelet/plugins/gpu.gpupack.io/state/claims"
    """``dra`` backend: the kubelet plugin's claim journal (``gpupack dra-plugin serve``'s
    ``<state dir>/claims``; the default is the plugin's default), read only, to tell a workload a
    claim put on a device from one that runs there outside DRA (such devices are withdrawn). A
    directory that does not exist means nothing is known and nothing is withdrawn for it."""
    dra_resync_seconds: float = 300.0
    """``dra`` backend: seconds between re-reads of the node's ResourceSlices from the API server,
    which repair a slice someone else changed or deleted. Between them the agent compares with
    what it last wrote, so a node whose GPUs do not change costs the API server nothing."""

    def __post_init__(self) -> None:
        if self.backend == "dra" and self.pause_device_plugin:
            # No device plugin to pause: its label must stay untouched (one backend per GPU).
            object.__setattr__(self, "pause_device_plugin", False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AgentSettings:
        """Defaults, then ``GPUPACK_AGENT_*`` variables, then non-None ``overrides`` (``kube.settings``)."""
        _refuse_share_steps(os.environ if env is None else env)
        return settings_from_env(cls, "GPUPACK_AGENT_", env, overrides)

    def validate(self) -> None:
        if self.mode not in LAYOUT_APPLY_MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(LAYOUT_APPLY_MODES)}")
        for name in ("poll_seconds", "min_patch_seconds", "heartbeat_seconds", "advertise_timeout_seconds",
                     "usage_publish_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.usage_sample_seconds < 0:
            raise ValueError(f"usage_sample_seconds must not be negative (0: once per tick), got {self.usage_sample_seconds}")
        if self.idle_seconds < 0 or self.retry_seconds < 0:
            raise ValueError("idle_seconds and retry_seconds must not be negative")
        if self.unhealthy_taint_effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute", "none"):
            raise ValueError(f"unhealthy_taint_effect {self.unhealthy_taint_effect!r} is not one of NoSchedule, "
                             "PreferNoSchedule, NoExecute, none")
        if self.usage_time_scale <= 0:
            raise ValueError(f"usage_time_scale must be above 0 (trace seconds per second), "
                             f"got {self.usage_time_scale}")
        if self.usage_trace_start < 0:
            raise ValueError(f"usage_trace_start must be a Unix time (0: the node's own), got {self.usage_trace_start}")
        if (self.usage_trace or self.usage_trace_pods) and not self.simulate:
            raise ValueError("usage_trace and usage_trace_pods are for simulated nodes only (with simulate)")
        if self.usage_trace_clock and not self.usage_trace:
            raise ValueError("usage_trace_clock times use on a usage trace's clock: set usage_trace too")
        if self.usage_trace_pods and not self.usage_trace:
            raise ValueError("usage_trace_pods maps pods to a usage trace's pods: set usage_trace too")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port {self.metrics_port} out of range 0..65535")
        self._validate_backend()

    def _validate_backend(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.backend != "dra":
            return
        if self.emulate_device_plugin:
            raise ValueError("emulate_device_plugin is for the device-plugin backend; the dra backend publishes "
                             "ResourceSlices instead (a GPU is owned by one backend, never both)")
        if self.mode != "direct":
            raise ValueError("the dra backend needs mode direct: mig-manager (operator mode) applies whole-node "
                             "configs and restarts the device plugin, while DRA claims create MIG instances one by one")
        if self.dra_resync_seconds <= 0:
            raise ValueError(f"dra_resync_seconds must be positive, got {self.dra_resync_seconds}")

    def with_(self, **changes: Any) -> AgentSettings:
        return replace(self, **changes)


_FIXED_SHARE_STEPS: Final = {
    "GPUPACK_AGENT_DRA_SHARE_MILLI_STEP": SHARES.milli_step,
    "GPUPACK_AGENT_DRA_SHARE_MEMORY_STEP_MIB": SHARES.memory_step_bytes // 2**20,
}


def _refuse_share_steps(env: Mapping[str, str]) -> None:
    """The DRA share unit was an agent setting; it is the release's now (``sharing.dra.share_policy.SHARES``),
    because the webhook and controller round shares with it too. A variable still set to anything
    else is refused, not ignored: ignored, the node would quietly publish another unit than asked."""
    for variable, fixed in _FIXED_SHARE_STEPS.items():
        raw = env.get(variable)
        if raw is not None and raw.strip() != str(fixed):
            raise ValueError(f"{variable}={raw!r}: the DRA share unit is no longer a node setting; every node "
                             f"publishes {SHARES.milli_step} milli and {SHARES.memory_step_bytes // 2**20} MiB steps, "
                             "the ones the webhook and controller round with (docs/dra.md, \"Request policy\"). "
                             "Unset it.")

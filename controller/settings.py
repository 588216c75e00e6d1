"""The controller's settings: one documented group, every field also an environment variable.

``GPUPACK_CONTROLLER_<FIELD>`` (upper case) overrides a default; a command-line
option overrides both.
"""

from __future__ import annotations

import math

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kube.settings import settings_from_env
from sharing.api.keys import GPU_OPERATOR_NAMESPACE, MIG_PARTED_CONFIGMAP
from sharing.usage.recommender import RecommenderSettings

ENV_PREFIX = "GPUPACK_CONTROLLER_"
USAGE_SOURCES = ("agents", "prometheus")
"""Where the right-sizer may read per-pod GPU use (``ControllerSettings.usage_source``)."""


def _default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ControllerSettings:
    batch_seconds: float = 0.5
    """After the first change is seen, wait this long for more before planning, so a
    burst of pods is planned (and reshapes GPUs) once. Short: the published dynamic
    MIG partitioner batches 10-60 s, which is most of its pod-to-running time."""
    resync_seconds: float = 10.0
    """Plan even without events this often: idle timers and windows expire silently."""
    min_cycle_seconds: float = 0.5
    """At most one cycle per this long, however often the watch caches change: in a large
    cluster something changes every few milliseconds (pods arriving, agents reporting), and
    each cycle plans every change since the previous one at once. With ``batch_seconds``, the
    delay a change waits for its cycle is at most about the sum of the two."""
    cache_sync_seconds: float = 60.0
    """How long the first cycle waits for the watch caches' first lists; a cache not listed
    by then is read by direct lists until it is (a cluster of thousands of pods lists in seconds)."""
    policy: str = "gpupack"
    """Packing policy of ``sharing.packing`` used to place shared pods."""
    metrics_port: int = 8080
    """Prometheus ``/metrics`` port (0: do not serve)."""
    identity: str = field(default_factory=_default_identity)
    """Leader-election identity: unique per replica (pod name in a Deployment)."""
    lease_namespace: str = "gpupack-system"
    lease_name: str = "gpupack-controller"
    lease_seconds: float = 15.0
    """Lease duration; a standby takes over this long after the leader went silent."""
    write_workers: int = 8
    """Pods pinned and ungated in parallel: each release is two round trips, and a burst
    of hundreds of pods would otherwise wait on them one by one."""
    mig_mode_changes: bool = False
    """Let the planner turn MIG on for idle full GPUs. Needs a GPU reset, which only the
    agent's operator mode (mig-manager) performs; off so a direct-mode agent is never
    asked for a change it must refuse (the agent would answer LayoutRefused on every cycle)."""
    namespaces: str = ""
    """Comma-separated namespaces whose pods this controller places; empty: all. For a
    scoped install (and tests sharing a cluster); capacity held by other pods still counts."""
    log_level: str = "info"
    agent_stale_seconds: float = 180.0
    """A GPUNode whose agent has not written its status for this long is stale: the planner
    neither places pods on it nor waits for capacity being created there. Three of the
    agent's 60 s heartbeats, so one slow patch is not mistaken for a dead agent."""
    evict_on_gpu_fault: bool = False
    """Evict the pods of a failed GPU or MIG instance through the Eviction API (PodDisruptionBudgets
    honoured) when a controller other than a DaemonSet will recreate them elsewhere. Off by default:
    a pod may still run on a GPU with, say, a pending page retirement, and only its owner knows
    whether a restart costs more than the risk (``controller.planning.evictions``)."""
    recommend: bool = True
    """Run the right-sizer's recommender (issue 35): read the per-pod use the node agents publish,
    and keep one ``GPURecommendation`` per workload (``controller.recommending``). Acting on it
    is opt-in per namespace or SharingPolicy (``rightSizing.mode``)."""
    recommend_seconds: float = 60.0
    """Seconds between two recommender cycles. A minute: agents publish every five, and a history
    needs hours before the first recommendation, so a shorter interval only costs CPU."""
    recommend_min_observed_seconds: float = RecommenderSettings().min_observed_s
    """History a workload container needs before its first recommendation: the recommender's
    ``min_observed_s`` (an hour; its docstring gives the reason), the one default the simulator
    measured. Tests shorten it."""
    usage_time_scale: float = 1.0
    """A live usage replay's clock (``sharing.usage.trace_clock``): the recommender reads time as
    ``usage_clock_start + (now - usage_clock_start) x usage_time_scale``, the clock the agents time
    the histories by when they play a trace with ``--usage-trace-clock``, so its hour of history,
    half-life and hourly peaks keep their meaning in trace time. 1: the wall's (any real cluster).
    With the agents' source only (Prometheus's series are timed by the wall)."""
    usage_clock_start: float = 0.0
    """Unix time at which the replay's trace clock and the wall's read the same (the agents'
    ``--usage-trace-start``)."""
    recommendation_refresh_seconds: float = 600.0
    """A recommendation whose size, mode and condition are unchanged is rewritten (its observed
    time and confidence) at most this often, so a steady cluster costs few writes."""
    mig_parted_namespace: str = GPU_OPERATOR_NAMESPACE
    mig_parted_configmap: str = MIG_PARTED_CONFIGMAP
    """GPU Operator mode: the ConfigMap (in ``mig_parted_namespace``) mig-manager reads. The
    controller is its only gpupack writer: it publishes the configs node agents ask for in
    their GPUNode status (``controller.writes.mig_configs``)."""
    usage_source: str = "agents"
    """Where the right-sizer reads per-pod GPU use: ``agents`` (gpupack's node agents) or
    ``prometheus`` (a Prometheus server that already scrapes per-pod GPU series, from the agents
    or dcgm-exporter: ``controller.usage_prometheus``; docs/right-sizing.md). The recommender loop
    builds its source from it (``controller.recommending.usage_source_for``)."""
    prometheus_url: str = ""
    """With ``usage_source=prometheus``: the server's base URL (``http://host:9090``; its
    ``/api/v1/query_range`` is read)."""
    prometheus_selector: str = ""
    """Extra label matchers for the series read, e.g. ``job="gpupack-node-agent"``: where
    dcgm-exporter's whole-GPU series share the names, select the agents' per-pod shares."""
    prometheus_lookback_seconds: float = 86400.0
    """How far back the first read goes (and a read after an outage at most): a day, the
    recommender's memory-peak window, so a restarted controller recommends from what it missed."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ControllerSettings:
        """Defaults, then ``GPUPACK_CONTROLLER_*`` variables, then non-None ``overrides`` (``kube.settings``)."""
        return settings_from_env(cls, ENV_PREFIX, env, overrides)

    @property
    def namespace_list(self) -> tuple[str, ...]:
        return tuple(n.strip() for n in self.namespaces.split(",") if n.strip())

    def validate(self) -> None:
        if self.batch_seconds < 0 or self.resync_seconds <= 0:
            raise ValueError("batch_seconds must be >= 0 and resync_seconds > 0")
        if self.min_cycle_seconds < 0 or self.cache_sync_seconds < 0:
            raise ValueError("min_cycle_seconds and cache_sync_seconds must be >= 0")
        if not 1 <= self.write_workers <= 64:
            raise ValueError(f"write_workers must be 1..64, got {self.write_workers}")
        if not self.agent_stale_seconds > 0:
            raise ValueError(f"agent_stale_seconds must be a positive number, got {self.agent_stale_seconds}")
        if self.lease_seconds < 3:
            raise ValueError(f"lease_seconds must be at least 3, got {self.lease_seconds}")
        if self.recommend_seconds <= 0 or self.recommendation_refresh_seconds < 0:
            raise ValueError("recommend_seconds must be positive and recommendation_refresh_seconds not negative")
        if not (math.isfinite(self.usage_time_scale) and self.usage_time_scale > 0):
            raise ValueError(f"usage_time_scale must be a number above 0, got {self.usage_time_scale}")
        if self.usage_time_scale != 1.0 and self.usage_source != "agents":
            raise ValueError("usage_time_scale is a replay's clock for the agents' usage source; Prometheus "
                             "times its series by the wall")
        if self.recommend_min_observed_seconds < 0:
            raise ValueError(f"recommend_min_observed_seconds must not be negative, got "
                             f"{self.recommend_min_observed_seconds}")
        if self.usage_source not in USAGE_SOURCES:
            raise ValueError(f"usage_source must be one of {', '.join(USAGE_SOURCES)}, got {self.usage_source!r}")
        if self.usage_source == "prometheus" and not self.prometheus_url.startswith(("http://", "https://")):
            raise ValueError("usage_source prometheus needs prometheus_url, http(s)://host:port, got "
                             f"{self.prometheus_url!r}")
        if not self.prometheus_lookback_seconds >= 0:
            raise ValueError(f"prometheus_lookback_seconds must be >= 0, got {self.prometheus_lookback_seconds}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be 0..65535, got {self.metrics_port}")
        from sharing.packing.registry import canonical_policy_name

        canonical_policy_name(self.policy)

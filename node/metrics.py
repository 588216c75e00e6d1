"""Prometheus metrics of the node agent (own registry, served on ``metrics_port``).

Label conventions: ``gpu`` is the NVML index, ``gi`` a MIG GPU-instance id (empty
for a fault on the whole GPU), both as decimal strings. The node is not a label:
the scrape attaches it (the dashboard and the alert rules group by ``node`` and
``instance``).

Health (``observe_health``, fed each tick with the ``node.health`` tracker's
report): ``gpupack_gpu_healthy``, ``gpupack_mig_instance_healthy``,
``gpupack_gpu_xid_errors_total``, ``gpupack_gpu_fault_seconds``,
``gpupack_node_gpu_degraded`` (docs/health-metrics.md).

Per-pod use (``observe_pod_usage``, fed each poll with ``node.usage.attribution``'s
uses), named as NVIDIA's dcgm-exporter names the same quantity (its default counters,
``etc/default-counters.csv``: ``DCGM_FI_DEV_GPU_UTIL`` in %, ``DCGM_FI_DEV_FB_USED`` in
MiB; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` as a ratio, its profiling field) and labelled as
it labels a pod's series: ``gpu``, ``UUID`` (the GPU's), ``GPU_I_ID`` (empty off MIG),
``namespace``, ``pod``, ``container``. Unlike dcgm-exporter, each value is the pod's own
share of a shared GPU, not the whole device's. A use that cannot be attributed has no
utilisation series; ``gpupack_pod_gpu_use_attributed`` says which are, and
``gpupack_pod_gpu_memory_attributed`` whether the memory alone is (an MPS client's is, its compute
is not: docs/node-agent.md, "Per-pod GPU use"). Series of pods that went are removed.

Per-pod memory limits (``observe_pod_limits``, fed each poll with
``node.usage.publication.UsageAggregator.limits``; dcgm-exporter has no such quantity, hence
``gpupack_`` names), labelled ``namespace``, ``pod``, ``container`` only (a limit is the pod
container's, whichever GPU): ``gpupack_pod_gpu_memory_limit_hits_total``, the memory-limit hits
the agent counted (one per episode, ``node.usage.publication``), and
``gpupack_pod_gpu_memory_limit_bytes``, the limit in force. The controller's Prometheus source
reads both (``controller.state.prometheus_usage``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from node.health.tracker import HealthReport
from node.base.snapshot import NodeSnapshot
from node.usage.attribution import PodGpuUse
from node.usage.publication import PodLimit

POD_LABELS = ["gpu", "UUID", "GPU_I_ID", "namespace", "pod", "container"]
"""dcgm-exporter's labels of a pod's series (the node comes from the scrape, as for every series here)."""
LIMIT_LABELS = ["namespace", "pod", "container"]
"""Labels of a pod container's memory-limit series."""

XID_KINDS = ("application", "unhealthy", "unknown")
"""``kind`` of ``gpupack_gpu_xid_errors_total``: the application's fault (device stays healthy), an XID
the table marks as a device fault, an XID the table does not know (also a device fault)."""


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.backend = Gauge("gpupack_agent_backend_info", "NVML backend in use (1).", ["kind"], registry=r)
        self.nvml_up = Gauge("gpupack_agent_nvml_up", "1 if NVML answered the last read.", registry=r)
        self.gpus = Gauge("gpupack_agent_gpus", "GPUs NVML reports on this node.", registry=r)
        self.instances = Gauge("gpupack_agent_mig_instances", "MIG instances by GPU and profile.",
                               ["gpu", "profile"], registry=r)
        self.in_use = Gauge("gpupack_agent_mig_instances_in_use", "MIG instances with a process or pod.",
                            ["gpu", "profile"], registry=r)
        self.util = Gauge("gpupack_agent_gpu_utilization_percent",
                          "GPU utilisation (absent on MIG-enabled GPUs: NVML does not report it).",
                          ["gpu"], registry=r)
        self.memory = Gauge("gpupack_agent_gpu_memory_used_mib", "GPU memory used by processes, MiB.",
                            ["gpu"], registry=r)
        self.reconfigurations = Counter("gpupack_agent_reconfigurations", "Finished MIG reconfigurations.",
                                        ["outcome"], registry=r)
        self.reconfigure_seconds = Histogram(
            "gpupack_agent_reconfiguration_seconds", "Journal start to Node allocatable updated.",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600), registry=r)
        self.nvml_errors = Counter("gpupack_agent_nvml_errors", "NVML errors by code name.", ["code"], registry=r)
        self.patches = Counter("gpupack_agent_status_patches", "GPUNode status patches sent.", registry=r)
        self.usage_patches = Counter("gpupack_agent_usage_patches",
                                     "GPUNode status.usage writes (per-pod use histories).", registry=r)
        self.api_errors = Counter("gpupack_agent_api_errors", "Kubernetes API errors.", ["status"], registry=r)
        self.consecutive_failures = Gauge(
            "gpupack_agent_consecutive_failures", "Agent ticks failed in a row (API server or NVML down).", registry=r)
        self.backoff_seconds = Gauge(
            "gpupack_agent_backoff_seconds", "Pause before the next attempt after a failure; 0 while healthy.", registry=r)
        # Health (node.health): see observe_health.
        self.gpu_healthy = Gauge(
            "gpupack_gpu_healthy",
            "1 if the GPU has no fault on the whole GPU, 0 while one lasts (XID, ECC, pending retirement or "
            "remapping, lost GPU; ended only by a reset, a reboot or an admin's acknowledgement). "
            "Faults of single MIG instances are in gpupack_mig_instance_healthy.",
            ["gpu", "uuid"], registry=r)
        self.instance_healthy = Gauge(
            "gpupack_mig_instance_healthy",
            "1 if the MIG instance (GPU-instance id gi) has no fault of its own, 0 while one lasts; "
            "only for instances that exist.", ["gpu", "gi"], registry=r)
        self.xid_errors = Counter(
            "gpupack_gpu_xid_errors",
            "Critical XID errors NVML reported, by code and kind: application (the workload's error, the "
            "device stays healthy), unhealthy (raised a fault; further XIDs on an already faulted device "
            "are not counted), unknown (not in the XID table: raises a fault too).",
            ["gpu", "xid", "kind"], registry=r)
        self.fault_seconds = Gauge(
            "gpupack_gpu_fault_seconds",
            "Seconds since the fault in force began, per GPU (gi empty) or MIG instance, by reason; "
            "the series goes when the fault ends.", ["gpu", "gi", "reason"], registry=r)
        self.degraded = Gauge(
            "gpupack_node_gpu_degraded",
            "1 while a GPU or MIG instance has a fault the device plugin keeps advertising: the node is "
            "labelled degraded and gpupack keeps new pods off it; else 0.", registry=r)
        # Per-pod use: see observe_pod_usage. Each gauge: (dcgm-exporter's name, help).
        (self.pod_gpu_util, self.pod_engine_active, self.pod_fb_used, self.pod_attributed,
         self.pod_memory_attributed) = (
            Gauge(name, text, POD_LABELS, registry=r) for name, text in (
                ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %) of the pod: the GPU's own on a GPU the pod holds "
                 "alone, the sum of its processes' SM samples on a shared GPU."),
                ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active, of the MIG instance "
                 "the pod holds (from dcgm-exporter)."),
                ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB) by the pod: the GPU's on a GPU the pod "
                 "holds alone, its processes' elsewhere."),
                ("gpupack_pod_gpu_use_attributed", "1 if the pod's use of this GPU or MIG instance is measured, 0 if "
                 "it cannot be attributed (the agent logs why; such a pod is never resized)."),
                ("gpupack_pod_gpu_memory_attributed", "1 if the pod's memory on this GPU or MIG instance is "
                 "measured (its peaks and limit hits are learned even when its compute is not, as for an MPS "
                 "client), 0 if not."),
            ))
        self.pod_limit_hits = Counter(
            "gpupack_pod_gpu_memory_limit_hits",
            "GPU memory-limit hits of the pod container this agent counted: samples at 98 % or more of its "
            "limit after one below (one per episode; an OOM seen from outside).", LIMIT_LABELS, registry=r)
        self.pod_limit_bytes = Gauge(
            "gpupack_pod_gpu_memory_limit_bytes",
            "GPU memory limit in force of the pod container: its MIG instance's, its allocation's on a shared "
            "GPU, else the GPU's.", LIMIT_LABELS, registry=r)
        self._hits: dict[tuple[str, ...], tuple[str, int]] = {}
        """Labels of each hit counter -> (its pod's uid, the count it holds)."""
        self._series: dict[Gauge, set[tuple[str, ...]]] = {}
        """Label values set per gauge kept by ``_sync`` (health, per-pod use), so series that went can be removed."""
        self._gpu_uuids: dict[int, str] = {}
        self._instances: frozenset[tuple[int, int]] = frozenset()
        """Devices of the last snapshot NVML answered: kept while NVML is down, so faults stay visible."""

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)

    def observe(self, snapshot: NodeSnapshot, busy_gi: dict[int, frozenset[int]]) -> None:
        self.backend.labels(snapshot.backend).set(1)
        self.nvml_up.set(0 if snapshot.error else 1)
        self.gpus.set(len(snapshot.gpus))
        self.instances.clear()
        self.in_use.clear()
        for gpu in snapshot.gpus:
            index = str(gpu.info.index)
            for inst in gpu.instances:
                self.instances.labels(index, inst.profile).inc()
                if inst.gi_id in busy_gi.get(gpu.info.index, frozenset()):
                    self.in_use.labels(index, inst.profile).inc()
            if gpu.utilization is not None:
                self.memory.labels(index).set(gpu.utilization.memory_used_mib)
                if gpu.utilization.gpu_percent is not None:
                    self.util.labels(index).set(gpu.utilization.gpu_percent)

    def observe_health(self, report: HealthReport, snapshot: NodeSnapshot, now: float) -> None:
        """Health metrics from one tick's report (``HealthMonitor.last``); ``now``: Unix time. Pure with respect
        to the API; call once per tick (the XID counter counts what ``report`` says began in that tick).

        GPUs and instances are those of ``snapshot``; while NVML does not answer (``snapshot.error``) the
        last ones seen stay, so a fault's 0 does not vanish with the outage. Each gauge is set series by
        series and only the ones that went are removed (no ``clear()``: a scrape never sees a gap).
        """
        if snapshot.error is None:
            self._gpu_uuids = {g.info.index: g.info.uuid for g in snapshot.gpus}
            self._instances = frozenset((g.info.index, i.gi_id) for g in snapshot.gpus for i in g.instances)
        faults = report.faults
        self._sync(self.gpu_healthy, {(str(index), uuid): 0.0 if (index, None) in faults else 1.0
                                      for index, uuid in self._gpu_uuids.items()})
        self._sync(self.instance_healthy, {(str(index), str(gi)): 0.0 if (index, gi) in faults else 1.0
                                           for index, gi in self._instances})
        self._sync(self.fault_seconds, {
            (str(index), "" if gi is None else str(gi), fault.reason): max(0.0, now - _unix(fault.since))
            for (index, gi), fault in faults.items()})
        self.degraded.set(1 if report.degraded else 0)
        for event in report.application_xids:
            self.xid_errors.labels(str(event.gpu_index), str(event.xid), "application").inc()
        for event in report.unknown_xids:  # each also began (or joined) a fault "UnknownXid": counted here only
            self.xid_errors.labels(str(event.gpu_index), str(event.xid), "unknown").inc()
        for (index, _gi), fault in report.began:
            if fault.xid is not None and fault.reason != "UnknownXid":
                self.xid_errors.labels(str(index), str(fault.xid), "unhealthy").inc()

    def observe_pod_usage(self, uses: Sequence[PodGpuUse]) -> None:
        """Per-pod use of one poll: each series set, those of pods or devices that went removed."""
        util: dict[tuple[str, ...], float] = {}
        active: dict[tuple[str, ...], float] = {}
        memory: dict[tuple[str, ...], float] = {}
        attributed: dict[tuple[str, ...], float] = {}
        memory_attributed: dict[tuple[str, ...], float] = {}
        for use in uses:
            labels = ("" if use.gpu is None else str(use.gpu), use.gpu_uuid, "" if use.gi_id is None else str(use.gi_id),
                      use.namespace, use.name, use.container)
            attributed[labels] = 1.0 if use.attributed else 0.0
            memory_attributed[labels] = 1.0 if use.memory_attributed else 0.0
            if use.memory_used_mib is not None:
                memory[labels] = float(use.memory_used_mib)
            if use.sm_percent is not None and use.attributed:
                if use.source == "instance":
                    active[labels] = use.sm_percent / 100.0
                else:
                    util[labels] = use.sm_percent
        self._sync(self.pod_gpu_util, util)
        self._sync(self.pod_engine_active, active)
        self._sync(self.pod_fb_used, memory)
        self._sync(self.pod_attributed, attributed)
        self._sync(self.pod_memory_attributed, memory_attributed)

    def observe_pod_limits(self, limits: Sequence[PodLimit]) -> None:
        """Each pod container's memory limit and hit counter (module docstring); those of pods that went
        removed. A counter is set up at 0 with its pod, so its first hit is an increase Prometheus sees."""
        counts: dict[tuple[str, ...], tuple[str, int]] = {}
        limit_bytes: dict[tuple[str, ...], float] = {}
        for row in limits:
            namespace, _, name = row.pod.partition("/")
            series: tuple[str, ...] = (namespace, name, row.container)
            counts[series] = (row.uid, row.hits)
            if row.limit_bytes is not None:
                limit_bytes[series] = float(row.limit_bytes)
        for labels, (uid, _count) in self._hits.items():
            if labels not in counts or counts[labels][0] != uid:
                self.pod_limit_hits.remove(*labels)  # gone, or another pod of the name: its counter starts anew
        for labels, (uid, count) in counts.items():
            before = self._hits.get(labels)
            counted = before[1] if before is not None and before[0] == uid else 0
            self.pod_limit_hits.labels(*labels).inc(max(0, count - counted))
        self._hits = counts
        self._sync(self.pod_limit_bytes, limit_bytes)

    def _sync(self, gauge: Gauge, wanted: Mapping[tuple[str, ...], float]) -> None:
        for labels in self._series.get(gauge, set()) - set(wanted):
            gauge.remove(*labels)
        for labels, value in wanted.items():
            gauge.labels(*labels).set(value)
        self._series[gauge] = set(wanted)


def _unix(when: datetime) -> float:
    """Unix time of ``when``; a naive datetime is read as UTC (how the GPUNode status stores it)."""
    return (when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)).timestamp()

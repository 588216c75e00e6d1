"""The recommender loop: from the use the agents publish to one ``GPURecommendation`` per workload.

Every ``recommend_seconds`` (on the elected leader only, beside the planning loop) one
:meth:`RecommenderCycle.run`:

1. the first time, reads every ``GPURecommendation`` once: what was written (so only changes
   are written again) and each one's ``status.checkpoint``, the history of pods that have gone,
   given back to the usage source (a restarted or new leader goes on where the last one was);
2. lets the usage source bring each workload container's history up to now: the node agents'
   (``controller.usage_source.AgentsSource``, from the GPUNodes in the watch caches) or a
   Prometheus server's (``controller.usage_prometheus``), as ``usage_source`` in the settings
   chooses (:func:`usage_source_for`); the cycle sees only the ``UsageSource`` protocol;
3. asks the recommender (``sharing.usage.recommender``) for each workload container's size, and
   the right-sizing mode of its namespace (``sharing.rules.right_sizing``: SharingPolicies and the
   namespace's label);
4. writes each workload's object through ``controller.writes.recommendations``: created when
   missing, its status patched only when it changed.

Writes are independent: one failure is counted and logged, and retried next cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from controller.kube import Kube
from controller.metrics import ControllerMetrics
from controller.settings import ControllerSettings
from controller.state.workload_histories import GonePart
from controller.usage_prometheus import PrometheusUsageSource
from controller.usage_source import AgentsSource, UsageSource
from controller.writes.recommendations import ContainerInput, needs_write, new_object, status_for
from kube.errors import KubeError
from sharing.api.crd import GPURecommendation, read_policies
from sharing.api.fields import as_map
from sharing.api.workload import WorkloadRef, recommendation_name
from sharing.rules.right_sizing import right_sizing_for
from sharing.usage.compact import decode
from sharing.usage.recommender import Recommender, RecommenderSettings, WorkloadKey

log = logging.getLogger("gpupack.controller")
MIB = 1024 * 1024


@dataclass
class RecommenderReport:
    """What one cycle did."""

    workloads: int = 0
    recommended: int = 0
    """Workload containers with a recommendation."""
    waiting: int = 0
    """Workload containers still short of the minimum history."""
    written: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Write:
    """One workload's object to create (when missing) and status to write."""

    ref: WorkloadRef
    status: dict[str, Any]


def usage_source_for(settings: ControllerSettings, kube: Kube, recommender: RecommenderSettings) -> UsageSource:
    """The source ``settings.usage_source`` names: ``agents`` or ``prometheus`` (``settings.prometheus_*``)."""
    if settings.usage_source == "prometheus":
        return PrometheusUsageSource(settings.prometheus_url, selector=settings.prometheus_selector,
                                     lookback_s=settings.prometheus_lookback_seconds, gpunodes=kube.list_gpunodes,
                                     settings=recommender)
    if settings.usage_source == "agents":
        return AgentsSource(kube.list_gpunodes, recommender)
    raise ValueError(f"usage_source must be agents or prometheus, got {settings.usage_source!r}")


class RecommenderCycle:
    """The recommender's state between cycles: the histories, the source, what was written."""

    def __init__(self, kube: Kube, settings: ControllerSettings, metrics: ControllerMetrics | None = None,
                 clock: Callable[[], float] = time.time, source: UsageSource | None = None) -> None:
        """``source``: where use is read; None: the one ``settings.usage_source`` names."""
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.clock = clock
        self.recommender = Recommender(RecommenderSettings(min_observed_s=settings.recommend_min_observed_seconds))
        self.source = source or usage_source_for(settings, kube, self.recommender.settings)
        self.written: dict[tuple[str, str], dict[str, Any]] = {}
        """(namespace, name) -> the status last written (or read at start)."""
        self.restored = False

    def _restore(self) -> None:
        parts: list[GonePart] = []
        for obj in self.kube.list_recommendations():
            meta = as_map(obj.get("metadata"))
            try:
                rec = GPURecommendation.model_validate(obj)
            except ValueError as exc:
                log.warning("GPURecommendation %s/%s unreadable, rewritten: %s", meta.get("namespace"),
                            meta.get("name"), exc)
                continue
            namespace = str(meta.get("namespace") or "")
            self.written[(namespace, rec.metadata.name)] = dict(as_map(obj.get("status")))
            ref = rec.spec.target_ref
            for checkpoint in rec.status.checkpoint if rec.status else []:
                try:
                    history, _ = decode(checkpoint, self.recommender.settings)
                except ValueError as exc:
                    log.warning("checkpoint of %s/%s not restored: %s", namespace, rec.metadata.name, exc)
                    continue
                key = WorkloadKey(namespace, ref.kind, ref.name, checkpoint.container_name)
                parts.append(GonePart(key, history, checkpoint.pods, checkpoint.gpu_memory_mib))
        self.source.restore(parts)
        self.restored = True

    def plan(self, pods: Mapping[str, Mapping[str, Any]], policies: list[dict[str, Any]],
             namespaces: list[dict[str, Any]], now_s: float, report: RecommenderReport) -> list[Write]:
        """Feed the source and decide every workload's status; the writes that changed something."""
        self.source.feed(self.recommender, pods, now_s)
        valid = [(p.name, p.spec) for p in read_policies(policies) if p.spec is not None]
        labels = {str(as_map(n.get("metadata")).get("name")): dict(as_map(as_map(n.get("metadata")).get("labels")))
                  for n in namespaces}
        kept = self.source.workloads
        live, memory = kept.live_pods(), kept.gpu_memory_mib()
        workloads: dict[WorkloadRef, list[ContainerInput]] = {}
        for key in sorted(self.recommender.histories):
            if key not in live and key not in kept.gone:
                continue
            history = self.recommender.histories[key]
            ref = WorkloadRef(key.namespace, key.kind, key.name)
            workloads.setdefault(ref, []).append(ContainerInput(
                name=key.container, recommendation=self.recommender.recommend(key),
                pods=live.get(key, 0) + kept.gone_pods.get(key, 0), gpu_memory_bytes=memory.get(key, 0) * MIB,
                observed_s=max(0.0, history.last_s - history.first_s) if history.samples else 0.0,
                gone=kept.checkpoint(key), gone_pods=kept.gone_pods.get(key, 0)))
        now = datetime.fromtimestamp(now_s, timezone.utc)
        writes = []
        for ref, containers in sorted(workloads.items()):
            report.workloads += 1
            report.recommended += sum(1 for c in containers if c.recommendation is not None)
            report.waiting += sum(1 for c in containers if c.recommendation is None)
            mode = right_sizing_for(valid, ref.namespace, labels.get(ref.namespace)).mode
            previous = self.written.get((ref.namespace, recommendation_name(ref)))
            status = status_for(containers, mode, self.source.source, self.recommender.settings.min_observed_s,
                                previous or {}, now)
            # A workload whose pods have all gone keeps its last object; it is rewritten only if that changes.
            refresh = (self.settings.recommendation_refresh_seconds
                       if any(WorkloadKey(ref.namespace, ref.kind, ref.name, c.name) in live for c in containers)
                       else float("inf"))
            if needs_write(previous, status, now, refresh):
                writes.append(Write(ref, status))
        return writes

    def run(self) -> RecommenderReport:
        began = time.perf_counter()
        report = RecommenderReport()
        try:
            if not self.restored:
                self._restore()
            pods = {f"{as_map(p.get('metadata')).get('namespace')}/{as_map(p.get('metadata')).get('name')}": p
                    for p in self.kube.list_pods()}
            policies, namespaces = self.kube.list_policies(), self.kube.list_namespaces()
        except KubeError as exc:
            report.errors.append(f"read: {exc}")
            self.metrics.reconcile_errors.labels("recommender-read").inc()
            log.warning("recommender: reads failed, no recommendation this cycle: %s", exc)
            return report
        writes = self.plan(pods, policies, namespaces, self.clock(), report)
        for write in writes:
            self._write(write, report)
        m = self.metrics
        m.recommended_workloads.labels("recommended").set(report.recommended)
        m.recommended_workloads.labels("waiting").set(report.waiting)
        m.unattributed_pods.set(len(self.source.unattributed))
        report.seconds = time.perf_counter() - began
        m.recommender_seconds.observe(report.seconds)
        return report

    def _write(self, write: Write, report: RecommenderReport) -> None:
        name = recommendation_name(write.ref)
        where = (write.ref.namespace, name)
        try:
            if where not in self.written:
                try:
                    self.kube.create_recommendation(write.ref.namespace, new_object(write.ref))
                    self.metrics.recommendation_writes.labels("create").inc()
                except KubeError as exc:
                    if exc.status != 409:  # created by an earlier leader: write its status
                        raise
            try:
                self.kube.patch_recommendation_status(write.ref.namespace, name, write.status)
            except KubeError as exc:
                if not exc.not_found:
                    raise
                self.written.pop(where, None)  # deleted meanwhile: created again next cycle
                return
            self.metrics.recommendation_writes.labels("status").inc()
            self.written[where] = write.status
            report.written.append(f"{write.ref.namespace}/{name}")
        except KubeError as exc:
            self.metrics.reconcile_errors.labels("recommendation").inc()
            report.errors.append(f"{write.ref.namespace}/{name}: {exc}")
            log.warning("GPURecommendation %s/%s not written: %s", write.ref.namespace, name, exc)


class RecommenderLoop:
    """Runs a :class:`RecommenderCycle` every ``recommend_seconds`` while ``is_leader()``."""

    def __init__(self, cycle: RecommenderCycle, is_leader: Callable[[], bool]) -> None:
        self.cycle = cycle
        self.is_leader = is_leader
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="gpupack-recommender", daemon=True)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        interval = self.cycle.settings.recommend_seconds
        while not self._stop.wait(interval):
            if not self.is_leader():
                self.cycle.restored = False  # a new term reads the objects afresh (another leader wrote them)
                continue
            try:
                self.cycle.run()
            except Exception:  # noqa: BLE001 - a bug in one cycle must not end the recommender
                self.cycle.metrics.reconcile_errors.labels("recommender").inc()
                log.exception("recommender cycle failed; next in %.0f s", interval)


__all__ = ["RecommenderCycle", "RecommenderLoop", "RecommenderReport", "Write", "usage_source_for"]

"""Which pods the ``Recreate`` updater evicts this cycle: far from their recommendation, within budget.

Issue 35 item 3: in a namespace whose right-sizing mode is ``Recreate``
(``sharing.rules.right_sizing``, ``evicts``), a pod far from its workload's ``GPURecommendation``
is evicted through the Eviction API, and its controller recreates it; the webhook sizes the
replacement from the recommendation (``Initial``'s logic). This module chooses; the cycle
(``controller.reconcile``) posts the evictions through the controller's one eviction writer.

* **Far** is the product's one rule, ``sharing.usage.updater.is_far``, on candidates built by
  ``controller.planning.right_size_candidates``; :func:`~sharing.usage.updater.choose_moves`
  orders them (at risk of an OOM first, then those that free the most memory) and applies the
  budget.
* **Budget**: at most ``max_evictions_per_hour`` evictions per workload in any rolling hour
  (the strictest bound of the policies that cover the namespace). Evictions are remembered in
  the controller's memory (:class:`EvictionMemory`). A new leader, or one that lost the Lease
  for a while, does not know what another evicted: while its memory covers less than the hour,
  every pod of the workload created in the uncovered part counts as a replacement of an
  eviction. That over-counts scale-ups and rollouts (a workload then waits up to an hour after a
  failover), never under-counts, and needs no extra read or grant (reading Events back would
  need ``list`` on events).
* **Never the last ready replica**: a pod is evicted only while another pod of its workload is
  Ready and not terminating, counting the evictions chosen before it in the same cycle. So a
  workload of one replica never moves by eviction. A Deployment's only pod, Ready, is returned
  in :attr:`EvictionPlan.rollouts` instead, within the same budget: the controller moves it by a
  rollout where the Deployment would bring the new pod up first
  (``controller.planning.right_size_rollouts``).
* Only pods a controller other than a DaemonSet recreates elsewhere
  (``controller.planning.evictions.recreated_elsewhere``), bound to a node, not terminating.

A PodDisruptionBudget is the API server's to enforce: an eviction it forbids answers 429
(``controller.planning.evictions.eviction_outcome``), the pod stays, nothing is spent of the
budget, and the next cycle tries again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from controller.planning.evictions import Eviction, recreated_elsewhere
from controller.planning.right_size_candidates import PodCandidate, RecommendationKey, pod_candidate
from kube.times import parse_time
from sharing.api.crd import SharingPolicySpec
from sharing.api.recommendation import RecommendationReading
from sharing.api.fields import as_list, as_map
from sharing.api.workload import WorkloadRef, workload_of
from sharing.rules.right_sizing import RightSizing, right_sizing_for
from sharing.usage.sizing import Size
from sharing.usage.updater import UpdaterSettings, at_risk, choose_moves, is_far

WINDOW = timedelta(hours=1)
"""The budget's window: ``maxEvictionsPerHour`` is counted over the last hour."""
MEMORY_GAP = timedelta(minutes=1)
"""Cycles further apart than this may have had another leader between them: the memory restarts."""

_STAMP = timedelta(seconds=1)
"""The resolution of an object's ``creationTimestamp``."""

Reason = Literal["at-risk", "far"]
"""Why a pod is evicted: its memory limit is below the recommendation (an OOM may come), or it
is otherwise far from it (``sharing.usage.updater``)."""


@dataclass(frozen=True)
class RightSizeEviction:
    """A pod to evict, and what its Events and metrics say."""

    eviction: Eviction
    workload: WorkloadRef
    recommendation: str
    reason: Reason
    container: str
    current: Size
    target: Size


@dataclass(frozen=True)
class EvictionPlan:
    evictions: tuple[RightSizeEviction, ...] = ()
    held: tuple[str, ...] = ()
    """``namespace/pod: why`` for far pods left this cycle (their workload's last ready replica)."""
    rollouts: tuple[RightSizeEviction, ...] = ()
    """Far pods, within budget, that are their Deployment's only ready replica: not evicted, but
    moved by a rollout where the Deployment surges (``controller.planning.right_size_rollouts``)."""


@dataclass
class EvictionMemory:
    """The evictions this controller made, per workload, over the last hour (module docstring)."""

    since: datetime | None = None
    """Since when the memory holds every eviction of this controller's workloads."""
    last_cycle: datetime | None = None
    times: dict[WorkloadRef, list[datetime]] = field(default_factory=dict)

    def begin_cycle(self, now: datetime) -> None:
        """Forget what is older than the window; start afresh after a gap (another leader may have acted)."""
        if self.since is None or self.last_cycle is None or now - self.last_cycle > MEMORY_GAP:
            self.since, self.times = now, {}
        self.last_cycle = now
        self.times = {w: kept for w, ts in self.times.items() if (kept := [t for t in ts if now - t < WINDOW])}

    def record(self, workload: WorkloadRef, when: datetime) -> None:
        self.times.setdefault(workload, []).append(when)

    def spent(self, workload: WorkloadRef, pods: Sequence[Mapping[str, Any]], now: datetime) -> int:
        """Evictions of ``workload`` in the last hour: remembered ones, plus its pods (``pods``)
        created in the part of the hour the memory does not cover."""
        start = now - WINDOW
        remembered = sum(1 for t in self.times.get(workload, ()) if t > start)
        since = self.since or now
        if since <= start:
            return remembered
        created = (parse_time(as_map(p.get("metadata")).get("creationTimestamp")) for p in pods)
        # creationTimestamp is whole seconds: a pod stamped within the second before ``since`` may
        # have been created after it, and is known to be no replacement.
        return remembered + sum(1 for c in created if c is not None and start < c and c + _STAMP < since)


def namespace_modes(policies: Sequence[tuple[str, SharingPolicySpec]],
                    namespace_labels: Mapping[str, Mapping[str, str]],
                    namespaces: Collection[str]) -> dict[str, RightSizing]:
    """The right-sizing of each of ``namespaces`` (labels unknown: None, policies' rules decide)."""
    return {ns: right_sizing_for(policies, ns, namespace_labels.get(ns)) for ns in sorted(set(namespaces))}


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Ready condition True and not terminating: a replica that serves."""
    if as_map(pod.get("metadata")).get("deletionTimestamp"):
        return False
    conditions = as_list(as_map(pod.get("status")).get("conditions"))
    return any(as_map(c).get("type") == "Ready" and as_map(c).get("status") == "True" for c in conditions)


def _movable(pod: Mapping[str, Any]) -> bool:
    meta, spec, status = as_map(pod.get("metadata")), as_map(pod.get("spec")), as_map(pod.get("status"))
    return (not meta.get("deletionTimestamp") and bool(spec.get("nodeName"))
            and status.get("phase") not in ("Succeeded", "Failed") and recreated_elsewhere(pod))


def plan_evictions(pods: Mapping[str, Mapping[str, Any]], modes: Mapping[str, RightSizing],
                   recommendations: Mapping[RecommendationKey, RecommendationReading], memory: EvictionMemory,
                   now: datetime, settings: UpdaterSettings = UpdaterSettings(),
                   gpu_memory: Mapping[str, int] | None = None) -> EvictionPlan:
    """The evictions of this cycle (module docstring). ``pods``: live pod objects by ``namespace/name``;
    ``modes``: the right-sizing per namespace (a namespace missing is ``Off``); ``gpu_memory``: node ->
    its GPUs' memory in bytes, what a pod on a device-plugin node holds is judged by
    (``controller.planning.right_size_candidates``)."""
    by_workload: dict[WorkloadRef, list[tuple[str, Mapping[str, Any]]]] = {}
    for key, pod in sorted(pods.items()):
        namespace = key.partition("/")[0]
        if namespace in modes and modes[namespace].evicts:
            by_workload.setdefault(workload_of(pod), []).append((key, pod))
    evictions: list[RightSizeEviction] = []
    rollouts: list[RightSizeEviction] = []
    held: list[str] = []
    for namespace in sorted({w.namespace for w in by_workload}):
        budget = UpdaterSettings(settings.memory_slack, settings.memory_risk_slack, settings.compute_slack,
                                 modes[namespace].max_evictions_per_hour, WINDOW.total_seconds())
        workloads = {w: members for w, members in by_workload.items() if w.namespace == namespace}
        ready = {w: sum(1 for _, p in members if is_ready(p)) for w, members in workloads.items()}
        found: dict[str, PodCandidate] = {}
        for workload, members in workloads.items():
            for key, pod in members:
                if not _movable(pod):
                    continue
                if (c := pod_candidate(key, pod, workload, recommendations, budget, gpu_memory)) is None:
                    continue
                if not is_far(c.candidate.current, c.candidate.target, budget):
                    continue
                if ready[workload] - is_ready(pod) < 1 and not _rolls_out(workload, pod, members):
                    # Left out before the budget, so its slot goes to another pod of the workload.
                    held.append(f"{key}: the last ready replica of {workload} (no other pod of it is Ready)")
                    continue
                found[key] = c
        spent = {c.candidate.workload: memory.spent(c.workload, [p for _, p in workloads[c.workload]], now)
                 for c in found.values()}
        for chosen in choose_moves([c.candidate for c in found.values()], spent, budget):
            pc, pod = found[chosen.pod], pods[chosen.pod]
            serving = is_ready(pod)
            if ready[pc.workload] - serving >= 1:
                ready[pc.workload] -= serving
                evictions.append(_eviction(pc, pod, budget))
            elif _rolls_out(pc.workload, pod, workloads[pc.workload]):
                rollouts.append(_eviction(pc, pod, budget))  # its Deployment may replace it make-before-break
            else:  # the evictions chosen before it took the others
                held.append(f"{chosen.pod}: the last ready replica of {pc.workload} (no other pod of it is Ready)")
    return EvictionPlan(tuple(evictions), tuple(held), tuple(rollouts))


def _rolls_out(workload: WorkloadRef, pod: Mapping[str, Any], members: Sequence[tuple[str, Mapping[str, Any]]]) -> bool:
    """The only pod of a Deployment, Ready: a rollout may replace it without a gap (``right_size_rollouts``)."""
    live = [p for _, p in members if not as_map(p.get("metadata")).get("deletionTimestamp")]
    return workload.kind == "Deployment" and is_ready(pod) and live == [pod]


def _eviction(pc: PodCandidate, pod: Mapping[str, Any], settings: UpdaterSettings) -> RightSizeEviction:
    c = pc.candidate
    namespace, _, name = c.pod.partition("/")
    risk = at_risk(c.current, c.target, settings)
    why = (f"container {pc.container!r} holds {c.current.milli} milli and {_gib(c.current.memory_bytes)} "
           f"of GPU memory; "
           f"GPURecommendation {pc.recommendation} recommends {c.target.milli} milli and "
           f"{_gib(c.target.memory_bytes)}" + (" (its memory limit is below the recommendation: an OOM may come)"
                                                  if risk else ""))
    node = str(as_map(pod.get("spec")).get("nodeName") or "")
    return RightSizeEviction(Eviction(namespace, name, node, why), pc.workload, pc.recommendation,
                             "at-risk" if risk else "far", pc.container, c.current, c.target)


def _gib(memory_bytes: int) -> str:
    return f"{memory_bytes / 2**30:.1f} GiB"


__all__ = ["EvictionMemory", "EvictionPlan", "MEMORY_GAP", "Reason", "RightSizeEviction", "WINDOW", "is_ready",
           "namespace_modes", "plan_evictions"]

"""Per-pod use aggregated on the node and published compactly (issue 35, item 1).

Every poll's attributed use (``node.usage.attribution``) is added to one history per pod
container: the right-sizer's own (``sharing.usage.recommender.ContainerHistory``: a decaying
histogram of the duty cycle, hourly memory peaks, sample times and count) plus its memory-limit
hits. The agent writes them to its GPUNode's ``status.usage`` at most every
``usage_publish_seconds`` and only when they changed (``node.agent``), in the VPA checkpoint's
compact form (``sharing.usage.compact``): a few hundred bytes per pod, not a sample per minute.

**A memory-limit hit** is a sample in which the pod's GPU memory use reaches at least
``HIT_RATIO`` (98 %) of its limit, after a sample below it: one hit per episode, not one per
sample, so a pod that sits at its limit counts once until it falls back. A pod's limit is:

* a whole GPU: the GPU's memory;
* a MIG instance: the instance's memory (its profile's);
* a shared GPU (MPS, a DRA share): the memory the ``gpupack.io/allocation`` record gave the
  container (the webhook's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, the DRA claim's capacity), else
  the GPU's memory (time-slicing enforces none).

**Unattributed**, per signal (``node.usage.attribution`` gives a reason for each):

* a pod whose **memory** cannot be read as its own (or a pod holding several GPU devices, or with
  several GPU containers) is published with the reason in ``unattributed`` and contributes
  nothing: it is never sized;
* a pod whose **compute** cannot be read as its own but whose memory can (an MPS client: NVML
  names only the MPS server's SM samples, benchmarks/nvml_usage_check.md) is published with the
  reason in ``computeUnattributed``: its memory peaks and memory-limit hits are added (they are
  observed, not guessed), its duty samples are not, so its history has no duty weight and no
  sample count, first or last time (those measure the compute observed: the recommender's
  ``min_observed_s`` and confidence read them, and compute sized from none would be a guess).
  The controller merges such a history into its workload's like any other: compute comes from
  the workload's pods that were measured (e.g. while they held a GPU alone), memory from all.

Each mark is sticky for the pod's life: a history with holes where a signal was unknown would
understate it. When a pod's compute becomes unattributed, the duty samples it had are dropped
too, as today a pod's whole history is when it becomes unattributed.

A restarted agent reads its histories back from its GPUNode (:meth:`UsageAggregator.restore`),
so nothing but the minutes since the last publication is lost. A pod that had hit its limit is
taken to be still at it, so the episode in force is not counted twice; a new one needs a sample
below the limit first.

The hits and the limit in force are also the agent's per-pod metrics (:meth:`UsageAggregator.limits`,
``node.metrics``), so a Prometheus source sees them too: counted here once, exported and published
from the same count. The counter holds the hits this agent counted (a restarted agent's starts
again from 0, as a counter does; the published count goes on from the restored one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mig.errors import UnknownProfileError
from node.base.snapshot import NodeSnapshot
from node.usage.attribution import PodGpuUse
from sharing.api.allocation import AllocationError, Allocation
from sharing.api.crd import MAX_USAGE_PODS, NodeUsage, PodUsage
from sharing.api.fields import as_map
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.usage.compact import LimitHits, decode, encode
from sharing.usage.pod_history import add_sample
from sharing.usage.recommender import ContainerHistory, RecommenderSettings

log = logging.getLogger("gpupack.agent")
MIB = 1024 * 1024
HIT_RATIO = 0.98
"""Use at or above this share of the limit is a hit (module docstring): CUDA allocators grow in
chunks, so a pod refused memory rarely shows exactly 100 %."""

PodKey = tuple[str, str, str]
"""(``namespace/name``, pod uid, container)"""


@dataclass
class _Pod:
    history: ContainerHistory
    hits: LimitHits
    unattributed: str = ""
    """Why nothing of the pod's use is published as its own (its memory is not known)."""
    compute_unattributed: str = ""
    """Why the pod's compute is not its own: its history holds memory only."""
    at_limit: bool = False
    gpu_memory_mib: int = 0
    limit_mib: int | None = None
    """The memory limit in force at the last sample (None: not known yet)."""
    restored_hits: int = 0
    """Hits read back from the GPUNode (``restore``): counted by an earlier agent, not by this one."""


@dataclass(frozen=True)
class PodLimit:
    """A pod container's memory limit and the hits this agent counted (the agent's per-pod metrics)."""

    pod: str
    """``namespace/name``"""
    uid: str
    container: str
    hits: int
    """Hits since this agent started: a counter's value (``restore``'s are not in it)."""
    limit_bytes: int | None


def allocated_memory(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(``namespace/name``, container) -> the GPU memory the pod's allocation record gave it, in bytes."""
    out: dict[tuple[str, str], int] = {}
    for pod in pods:
        meta = as_map(pod.get("metadata"))
        text = as_map(meta.get("annotations")).get(ALLOCATION_ANNOTATION)
        if text is None:
            continue
        try:
            allocation = Allocation.from_annotation(text)
        except AllocationError:
            continue  # the controller reports bad records; here the GPU's memory stands in
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        for container in allocation.containers:
            if container.memory_bytes is not None:
                out[(key, container.name)] = container.memory_bytes
    return out


def limit_mib(use: PodGpuUse, snapshot: NodeSnapshot, allocated: Mapping[tuple[str, str], int]) -> int | None:
    """The memory limit of ``use`` in MiB (module docstring); None when its device is unknown."""
    gpu = next((g for g in snapshot.gpus if g.info.uuid == use.gpu_uuid), None)
    if gpu is None:
        return None
    if use.gi_id is not None:
        inst = next((i for i in gpu.instances if i.gi_id == use.gi_id), None)
        if inst is None or gpu.model is None:
            return None
        try:
            return gpu.model.profile(inst.profile).memory_mib
        except UnknownProfileError:
            return None
    if use.source == "processes" and (use.pod, use.container) in allocated:
        return min(gpu.info.memory_total_mib, -(-allocated[(use.pod, use.container)] // MIB))
    return gpu.info.memory_total_mib


class UsageAggregator:
    """The node's per-pod histories (module docstring); mutable, updated once per poll."""

    def __init__(self, settings: RecommenderSettings = RecommenderSettings()) -> None:
        self.settings = settings
        self.pods: dict[PodKey, _Pod] = {}

    def _pod(self, key: PodKey) -> _Pod:
        found = self.pods.get(key)
        if found is None:
            found = self.pods[key] = _Pod(ContainerHistory(self.settings), LimitHits())
        return found

    def observe(self, uses: Sequence[PodGpuUse], uids: Mapping[str, str], snapshot: NodeSnapshot,
                allocated: Mapping[tuple[str, str], int], now_s: float) -> None:
        """One poll: add each pod's sample; forget pods that are no longer on the node (``uids``)."""
        devices: dict[str, int] = {}
        for use in uses:
            devices[use.pod] = devices.get(use.pod, 0) + 1
        for use in uses:
            pod = self._pod((use.pod, uids.get(use.pod, ""), use.container))
            reason = use.memory_unattributed
            if not reason and devices[use.pod] > 1:
                reason = f"the pod holds {devices[use.pod]} GPU devices; a size is for one"
            if not reason and not use.container:
                reason = "several of the pod's containers ask for GPUs; the split between them is unknown"
            if not reason and use.memory_used_mib is None:
                reason = "its memory was not read"
            if reason:
                pod.unattributed = pod.unattributed or reason
            if pod.unattributed:
                continue
            assert use.memory_used_mib is not None
            compute = use.unattributed or ("its compute was not read" if use.sm_percent is None else "")
            pod.history = add_sample(pod.history, self.settings, now_s, None if compute else use.sm_percent,
                                     use.memory_used_mib * MIB, was_memory_only=bool(pod.compute_unattributed))
            pod.compute_unattributed = pod.compute_unattributed or compute
            limit = limit_mib(use, snapshot, allocated)
            if limit is None:
                continue
            pod.limit_mib = limit
            pod.gpu_memory_mib = max(pod.gpu_memory_mib, self._device_memory(use, snapshot))
            at_limit = use.memory_used_mib >= HIT_RATIO * limit
            if at_limit and not pod.at_limit:
                pod.hits.hit(now_s, limit * MIB)
            pod.at_limit = at_limit
        here = {(pod, uid) for pod, uid in uids.items()}
        for key in [k for k in self.pods if (k[0], k[1]) not in here]:
            del self.pods[key]

    @staticmethod
    def _device_memory(use: PodGpuUse, snapshot: NodeSnapshot) -> int:
        gpu = next((g for g in snapshot.gpus if g.info.uuid == use.gpu_uuid), None)
        return 0 if gpu is None else gpu.info.memory_total_mib

    def limits(self) -> list[PodLimit]:
        """Every pod container whose memory is its own: its limit and the hits this agent counted."""
        return [PodLimit(pod, uid, container, state.hits.count - state.restored_hits,
                         None if state.limit_mib is None else state.limit_mib * MIB)
                for (pod, uid, container), state in sorted(self.pods.items()) if not state.unattributed]

    def usage(self, now: datetime | None = None) -> NodeUsage:
        """What to publish: every pod container, sorted, at most ``MAX_USAGE_PODS``."""
        pods = []
        for (pod, uid, container), state in sorted(self.pods.items()):
            value = encode(state.history, state.hits, state.gpu_memory_mib)
            pods.append(PodUsage(pod=pod, uid=uid, container=container, unattributed=state.unattributed,
                                 compute_unattributed=state.compute_unattributed, **dict(value)))
        return NodeUsage(published_time=now, pods=pods[:MAX_USAGE_PODS], left_out=max(0, len(pods) - MAX_USAGE_PODS))

    def restore(self, status: Mapping[str, Any]) -> int:
        """Read back the histories a previous agent published (``status`` of the GPUNode); how many."""
        raw = as_map(status).get("usage")
        if not raw:
            return 0
        try:
            usage = NodeUsage.model_validate(raw)
        except ValueError as exc:
            log.warning("status.usage of this GPUNode unreadable, per-pod histories start afresh: %s", exc)
            return 0
        for record in usage.pods:
            try:
                history, hits = decode(record, self.settings)
            except ValueError as exc:
                log.warning("usage of %s not restored: %s", record.pod, exc)
                continue
            # A pod that hit its limit before may still sit there: its episode is not counted again.
            self.pods[(record.pod, record.uid, record.container)] = _Pod(
                history, hits, record.unattributed, record.compute_unattributed, at_limit=hits.count > 0,
                gpu_memory_mib=record.gpu_memory_mib, restored_hits=hits.count)
        return len(usage.pods)

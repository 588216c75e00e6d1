"""Where the controller's recommender reads the use: one protocol, and the node agents' source.

A :class:`UsageSource` brings the recommender's histories (``sharing.usage.recommender``) up to
now. Two exist: the node agents' (:class:`AgentsSource`, here), which reads the histories each
agent aggregated and published in its GPUNode's ``status.usage`` (``node.usage.publication``),
and a Prometheus server's (``controller.usage_prometheus``), for clusters that already scrape
per-pod GPU series. The recommender loop (``controller.recommending``) is written against the
protocol only; ``--usage-source`` chooses which one it gets.

Both keep one history per live pod container and hand them to one bookkeeping
(``controller.state.workload_histories``): the history of a workload's pods that have **gone**
is folded into its gone part (a rollout must not forget its use), which the recommender loop
keeps in the ``GPURecommendation``'s ``status.checkpoint`` and gives back to a new leader
(:meth:`UsageSource.restore`).

:class:`AgentsSource` takes each live pod's history as its agent published it (each pod's
workload from its object, ``sharing.api.workload.workload_of``; a pod no longer listed keeps the
workload it had). A pod's memory-limit hits raise the memory at once (``Recommender.record_oom``,
at the last hit's limit). Records marked unattributed are never sized; they are counted. A
GPUNode's records are decoded again only when it publishes anew. A record whose compute alone is
unattributed (``computeUnattributed``: an MPS client) holds memory peaks and limit hits but no duty
samples, and is merged like any other: the workload's compute, observed time and confidence come
from its measured pods' duty samples, its memory from all its pods.

What is lost: the minutes since a pod's last publication when it goes, and a pod that went
while no controller was leading (its history was on its node, not yet in a checkpoint).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from sharing.api.crd import NodeUsage, PodUsage, RecommendationSource
from sharing.api.fields import as_map
from sharing.api.workload import WorkloadRef, workload_of
from controller.state.workload_histories import GonePart, PodHistory, PodKey, WorkloadHistories
from sharing.usage.compact import decode
from sharing.usage.pod_history import record_hit
from sharing.usage.recommender import ContainerHistory, Recommender, RecommenderSettings, WorkloadKey

log = logging.getLogger("gpupack.controller")


class UsageSource(Protocol):
    """Feeds the recommender (contract of issue 35's right-sizer)."""

    source: RecommendationSource
    workloads: WorkloadHistories
    """Live pods and gone parts per workload container, as of the last ``feed``."""
    unattributed: dict[str, str]
    """``namespace/name`` -> why its use is not sized (the last ``feed``; for the metric)."""

    def feed(self, recommender: Recommender, pods: Mapping[str, Mapping[str, Any]], now_s: float) -> None:
        """Bring the recommender's histories up to ``now_s`` from this source. ``pods``: live pod objects
        by ``namespace/name`` (to find each pod's workload with ``sharing.api.workload.workload_of``)."""

    def restore(self, parts: Iterable[GonePart]) -> None:
        """A leader's term begins: start from the checkpoints' gone parts, and read every live pod's
        history from the source again at the next ``feed``."""


def with_hits(record: PodUsage, settings: RecommenderSettings) -> ContainerHistory:
    """The record's history, its last memory-limit hit raising the memory as ``Recommender.record_oom`` does."""
    history, hits = decode(record, settings)
    if hits.count and hits.last_s is not None and hits.last_limit_bytes is not None:
        record_hit(history, settings, hits.last_s, hits.last_limit_bytes)
        history.ooms = hits.count  # record_hit counted the last hit once more
    return history


class AgentsSource:
    """The node agents' published histories (module docstring)."""

    source: RecommendationSource = "Agents"

    def __init__(self, gpunodes: Callable[[], Sequence[Mapping[str, Any]]], settings: RecommenderSettings) -> None:
        self.gpunodes = gpunodes
        self.settings = settings
        self._decoded: dict[str, tuple[str, list[tuple[PodUsage, ContainerHistory | None]]]] = {}
        """GPUNode name -> (its ``publishedTime``, its records with their histories; None: unreadable)."""
        self.workloads = WorkloadHistories(settings)
        self.unattributed: dict[str, str] = {}
        """``namespace/name`` -> why its use is not sized (this cycle)."""
        self.unreadable = 0

    def restore(self, parts: Iterable[GonePart]) -> None:
        """The checkpoints' gone parts (the recommender loop reads them once per term); the live pods'
        histories are on their GPUNodes, read at every feed."""
        self.workloads.reset(parts)

    def _records(self) -> list[tuple[PodUsage, ContainerHistory | None]]:
        out: list[tuple[PodUsage, ContainerHistory | None]] = []
        seen: set[str] = set()
        for obj in self.gpunodes():
            name = str(as_map(obj.get("metadata")).get("name") or "")
            raw = as_map(as_map(obj.get("status")).get("usage"))
            seen.add(name)
            if not raw:
                self._decoded.pop(name, None)
                continue
            stamp = str(raw.get("publishedTime") or "")
            cached = self._decoded.get(name)
            if cached is None or cached[0] != stamp or not stamp:
                cached = self._decoded[name] = (stamp, self._decode(name, raw))
            out.extend(cached[1])
        for name in [n for n in self._decoded if n not in seen]:
            del self._decoded[name]
        return out

    def _decode(self, node: str, raw: Mapping[str, Any]) -> list[tuple[PodUsage, ContainerHistory | None]]:
        try:
            usage = NodeUsage.model_validate(raw)
        except ValidationError as exc:
            log.warning("GPUNode %s: status.usage unreadable, its pods' use is not counted: %s", node, exc)
            return []
        out: list[tuple[PodUsage, ContainerHistory | None]] = []
        for record in usage.pods:
            if record.unattributed:
                out.append((record, None))
                continue
            try:
                out.append((record, with_hits(record, self.settings)))
            except ValueError as exc:
                log.warning("GPUNode %s: usage of %s unreadable: %s", node, record.pod, exc)
                out.append((record, None))
        return out

    def _workload(self, record: PodUsage, pods: Mapping[str, Mapping[str, Any]]) -> WorkloadKey | None:
        obj = pods.get(record.pod)
        uid = as_map(obj.get("metadata")).get("uid") if obj is not None else None
        if obj is not None and (not record.uid or uid == record.uid):
            ref: WorkloadRef = workload_of(obj)
            return WorkloadKey(ref.namespace, ref.kind, ref.name, record.container)
        previous = self.workloads.live.get((record.pod, record.uid, record.container))
        return None if previous is None else previous.key

    def feed(self, recommender: Recommender, pods: Mapping[str, Mapping[str, Any]], now_s: float) -> None:
        live: dict[PodKey, PodHistory] = {}
        self.unattributed, self.unreadable = {}, 0
        for record, history in self._records():
            if history is None:
                if record.unattributed:
                    self.unattributed[record.pod] = record.unattributed
                else:
                    self.unreadable += 1
                continue
            key = self._workload(record, pods)
            if key is not None:
                live[(record.pod, record.uid, record.container)] = PodHistory(key, history, record.gpu_memory_mib)
        # A record no longer published: the pod has gone (folded into its workload's gone part).
        self.workloads.update(live, recommender)


__all__ = ["AgentsSource", "UsageSource", "with_hits"]

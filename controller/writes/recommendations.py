"""The ``GPURecommendation`` of each workload: what the controller's recommender writes (pure).

One object per workload (``sharing.api.workload.recommendation_name``, in the workload's
namespace), created with its ``spec.targetRef``; its ``status`` carries

* per container with enough history, the size (``sharing.usage.sizing.size_for``: ``gpuMilli``
  and ``gpuMemory``) and the history behind it (observed time, confidence, memory-limit hits,
  pods);
* the right-sizing mode in force for the workload's namespace (``sharing.rules.right_sizing``);
* the condition ``RecommendationProvided``: True (``Recommended``) once every container has a
  size, False (``NotEnoughHistory``) before the recommender's minimum, or (``NoUse``) while no
  attributed use is known;
* ``checkpoint``: the history of the workload's pods that have gone, per container
  (``controller.usage_source``), compact (``sharing.usage.compact``).

**When to write** (:func:`needs_write`): when anything but the times, the observed seconds and
the confidence changed, or when those have not been refreshed for ``refresh_s``: a history
grows every minute, and rewriting every workload every minute for it would cost the API server
more than the recommendations are worth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kube.conditions import Cond, merge_conditions
from kube.times import format_time, parse_time
from sharing.api.crd import (
    API_VERSION,
    ContainerCheckpoint,
    ContainerRecommendation,
    GPURecommendationStatus,
    RecommendationSource,
    RightSizingMode,
    UsageHistory,
    to_wire,
)
from sharing.api.fields import as_list, as_map
from sharing.api.workload import WorkloadRef, recommendation_name
from sharing.api.recommendation import PROVIDED_CONDITION
from sharing.dra.wire import quantity
from sharing.usage.recommender import Recommendation
from sharing.usage.sizing import size_for

PROVIDED = PROVIDED_CONDITION
MIB = 1024 * 1024


@dataclass(frozen=True)
class ContainerInput:
    """One container of a workload as the recommender sees it this cycle."""

    name: str
    recommendation: Recommendation | None
    """None before the recommender's minimum history."""
    pods: int
    """Pods (live and gone) whose use the history holds."""
    gpu_memory_bytes: int
    """The GPU memory the container's pods ran on (the size's cap); 0 when unknown."""
    observed_s: float = 0.0
    """The history's span so far (for the message before a recommendation)."""
    gone: UsageHistory | None = None
    """The history of its pods that have gone, compact; None when none has."""
    gone_pods: int = 0


def container_status(container: ContainerInput) -> ContainerRecommendation | None:
    rec = container.recommendation
    if rec is None:
        return None
    cap = container.gpu_memory_bytes or rec.memory_bytes
    size = size_for(rec, max(cap, 1))
    return ContainerRecommendation(
        container_name=container.name, gpu_milli=size.milli,
        gpu_memory=quantity(math.ceil(size.memory_bytes / MIB) * MIB), observed_seconds=int(rec.observed_s),
        confidence_days=round(rec.confidence_days, 3), ooms=rec.ooms, pods=container.pods)


def status_for(containers: Sequence[ContainerInput], mode: RightSizingMode, source: RecommendationSource,
               min_observed_s: float, previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The wire form of the workload's status (validated against the API model)."""
    sized = [c for c in (container_status(c) for c in sorted(containers, key=lambda c: c.name)) if c is not None]
    waiting = [c for c in containers if c.recommendation is None]
    if not containers:
        cond = Cond(PROVIDED, "False", "NoUse", "no attributed GPU use of this workload's pods is known")
    elif waiting:
        observed = ", ".join(f"{c.name or '(pod)'} {c.observed_s / 60:.0f} min" for c in waiting)
        cond = Cond(PROVIDED, "False", "NotEnoughHistory",
                    f"history observed: {observed}; a recommendation needs {min_observed_s / 60:.0f} min")
    else:
        cond = Cond(PROVIDED, "True", "Recommended", f"{len(sized)} container(s) sized from their observed use")
    checkpoint = [ContainerCheckpoint(container_name=c.name, pods=c.gone_pods, **dict(c.gone))
                  for c in sorted(containers, key=lambda c: c.name) if c.gone is not None and c.name]
    status = GPURecommendationStatus.model_validate({
        "source": source, "mode": mode, "containers": [to_wire(c) for c in sized],
        "lastUpdateTime": format_time(now),
        "conditions": merge_conditions(as_list(previous.get("conditions")), [cond], None, now),
        "checkpoint": [to_wire(c) for c in checkpoint],
    })
    return to_wire(status)


def needs_write(previous: Mapping[str, Any] | None, wanted: Mapping[str, Any], now: datetime,
                refresh_s: float) -> bool:
    """Whether to write ``wanted`` over ``previous`` (module docstring); None: no object yet."""
    if previous is None:
        return True
    if _meaning(previous) != _meaning(wanted):
        return True
    last = parse_time(str(previous.get("lastUpdateTime") or ""))
    return last is None or (now - last).total_seconds() >= refresh_s


_GROWING = ("observedSeconds", "confidenceDays")


def _meaning(status: Mapping[str, Any]) -> list[Any]:
    containers = [{k: v for k, v in as_map(c).items() if k not in _GROWING} for c in as_list(status.get("containers"))]
    conditions = [{k: v for k, v in as_map(c).items() if k in ("type", "status", "reason")}
                  for c in as_list(status.get("conditions"))]
    return [status.get("source"), status.get("mode"), containers, conditions, status.get("checkpoint") or []]


def new_object(ref: WorkloadRef) -> dict[str, Any]:
    """The object to create for a workload that has none (its status is written after)."""
    return {"apiVersion": API_VERSION, "kind": "GPURecommendation",
            "metadata": {"name": recommendation_name(ref), "namespace": ref.namespace},
            "spec": {"targetRef": {"kind": ref.kind, "name": ref.name}}}


__all__ = ["PROVIDED", "ContainerInput", "container_status", "needs_write", "new_object", "status_for"]

"""Right-sizing ``Initial``: a new pod asks for what its workload is recommended, not what it wrote.

Where a namespace's right-sizing mode sizes new pods (``Initial`` or ``Recreate``:
``sharing.rules.right_sizing.RightSizing.sizes_new_pods``), :func:`size_pod` replaces each gpupack
container's ``gpupack.io/gpu-milli`` and ``gpupack.io/gpu-memory`` with its workload's
recommendation (``sharing.api.recommendation``) *before* the decision
(``sharing.admission.decision.decide``), so the sized pod takes its share by the normal path: an
MPS share with its memory limit, the smallest covering MIG profile, or a DRA share. The webhook
records what it changed on the pod (``sharing.api.right_sized``).

What is sized, and what is not:

* Only containers that ask gpupack for a share (``gpupack.io/gpu-milli``, and
  ``gpupack.io/gpu-memory`` if any): a pod opts in to gpupack by asking so, and a whole GPU asked
  through gpupack is ``gpupack.io/gpu-milli: 1000``. Plain ``nvidia.com/gpu`` requests are out of
  scope: the webhook is not even called for them (its ``matchConditions``), they pass through
  untouched by design (docs/architecture.md), and turning one into a share would impose an MPS
  memory limit (an OOM where the pod had none) the pod's owner never agreed to.
* A container is sized only from a recommendation for its own name, of the pod's own workload
  (``sharing.api.workload.workload_of``; the object's ``spec.targetRef`` must name it), whose
  condition ``RecommendationProvided`` is ``True`` (the recommender withholds it until it has
  enough history). Other containers of the pod keep their request.
* Memory is the recommendation's, never less: it is the peak plus the recommender's margin, and
  an MPS memory limit below use is an OOM. Where it is more than the pool's largest GPU holds,
  the pod is not sized at all (sizing it down would go below the recommendation, sizing it up
  would make a pod no node can hold): it keeps its own request, and the review's message says why.
* Compute is the recommendation's predicted use (at least 1 milli, at most one GPU), a duty cycle:
  the container carries it as ``ContainerRequest.predicted_milli``, and its ``milli`` becomes what
  shared placement counts, ``ceil(predicted / compute_overcommit)`` where the namespace's policy
  over-commits compute (``sharing.rules.right_sizing.accounted_milli``; the predicted use itself
  where it does not). The decision then gives a right-sized MPS share no SM cap and a MIG instance
  that covers the predicted use (``sharing.admission.decision``).
* Sizing may raise a request as well as lower it: an OOM raises the recommendation at once, and
  the next pod of the workload gets the larger limit (the Autopilot method, issue 35).
* A pod labelled ``gpupack.io/skip=true`` never gets here (the webhook leaves it untouched), and
  a namespace in ``Off`` is never sized.

Pure: the recommendations come through a :data:`RecommendationLookup` (the webhook's watch cache,
``webhook.recommendation_watch``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from sharing.api.recommendation import PROVIDED_CONDITION, RecommendationReading
from sharing.api.request import MAX_MILLI, ContainerRequest, PodRequest
from sharing.api.right_sized import RightSizedFrom, SizedContainer
from sharing.api.workload import WorkloadRef, recommendation_name, workload_of
from sharing.admission.options import fmt_bytes
from sharing.rules.right_sizing import RightSizing

_MIB: Final = 1024**2

RecommendationLookup = Callable[[str, str], RecommendationReading | None]
"""The recommendation named ``name`` in ``namespace`` (arguments in that order), if one is known.
Where the caller has none (``None`` instead of a lookup), no pod is sized: the recommendations are
not known yet."""


@dataclass(frozen=True)
class Sized:
    """The request to decide, and what sizing did to it."""

    request: PodRequest
    """The sized request; the pod's own when nothing was sized."""
    record: RightSizedFrom | None = None
    """What was sized (the ``gpupack.io/right-sized-from`` record); None when nothing was."""
    note: str = ""
    """Why the pod was or was not sized, for the review's message; empty where right-sizing is off."""


def size_pod(request: PodRequest, pod: Mapping[str, Any], right_sizing: RightSizing,
             lookup: RecommendationLookup | None, largest_gpu_mib: int) -> Sized:
    """``request`` (parsed from ``pod``) sized from its workload's recommendation (module docstring).

    ``largest_gpu_mib``: the memory of the largest GPU of the pool the pod goes to (0:
    unknown, as in a pool with no node yet; then no bound is applied here, and the decision gates
    the pod until capacity comes)."""
    if not right_sizing.sizes_new_pods:
        return Sized(request)
    largest_memory_bytes = largest_gpu_mib * _MIB
    own = workload_of(pod)
    # The review's namespace is authoritative: a pod's own metadata.namespace may be empty on create.
    workload = WorkloadRef(request.namespace, own.kind, own.name)
    name = recommendation_name(workload)
    why = f"right-sizing {right_sizing.mode} ({right_sizing.source})"
    if lookup is None:
        return Sized(request, note=f"{why}: the webhook holds no GPURecommendations (not listed yet, or it "
                                   "serves an inventory file); not sized")
    found = lookup(request.namespace, name)
    if found is None:
        return Sized(request, note=f"{why}: no GPURecommendation {name!r} for {workload}; not sized")
    if found.target != workload:
        return Sized(request, note=f"{why}: GPURecommendation {name!r} is for {found.target}, not {workload}; "
                                   "not sized")
    if not found.provided:
        return Sized(request, note=f"{why}: GPURecommendation {name!r} has no {PROVIDED_CONDITION}=True yet "
                                   "(not enough history); not sized")
    sized: list[ContainerRequest] = []
    changes: list[SizedContainer] = []
    for container in request.containers:
        size = found.size_of(container.name)
        if size is None or size.memory_bytes < 1:
            sized.append(container)
            continue
        if largest_memory_bytes and size.memory_bytes > largest_memory_bytes:
            return Sized(request, note=(
                f"{why}: GPURecommendation {name!r} gives container {container.name!r} "
                f"{fmt_bytes(size.memory_bytes)} of GPU memory, more than the largest GPU "
                f"({fmt_bytes(largest_memory_bytes)}) holds; not sized"))
        milli = min(MAX_MILLI, max(1, size.milli))
        accounted = right_sizing.accounted_milli(milli)
        sized.append(replace(container, milli=accounted, memory_bytes=size.memory_bytes, predicted_milli=milli))
        changes.append(SizedContainer(container.name, container.milli, container.memory_bytes, milli,
                                      size.memory_bytes, accounted))
    if not changes:
        names = ", ".join(repr(c.name) for c in request.containers)
        return Sized(request, note=f"{why}: GPURecommendation {name!r} recommends nothing for container(s) "
                                   f"{names}; not sized")
    record = RightSizedFrom(name, found.generation, found.updated, tuple(changes), right_sizing.compute_overcommit)
    told = "; ".join(f"{c.name}: {c.asked_milli}m/{_asked(c.asked_memory_bytes)} -> "
                     f"{c.milli}m/{fmt_bytes(c.memory_bytes)}{_accounted(c)}" for c in changes)
    return Sized(replace(request, containers=tuple(sized)), record,
                 f"{why}: sized from GPURecommendation {name!r} (generation {found.generation}): {told}")


def _accounted(container: SizedContainer) -> str:
    if container.accounted == container.milli:
        return ""
    return f" (predicted; {container.accounted}m accounted)"


def _asked(memory: int | None) -> str:
    return "policy default" if memory is None else fmt_bytes(memory)


__all__ = ["RecommendationLookup", "Sized", "size_pod"]

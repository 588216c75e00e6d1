"""Live pods and their ``GPURecommendation`` as the updater's candidates (the adapter of ``Recreate``).

The product's one rule for "far from its recommendation" is ``sharing.usage.updater`` (the
simulator calls it too). It judges a :class:`~sharing.usage.updater.Candidate`: a pod, its
workload, its size now and the recommended one, each a :class:`~sharing.usage.sizing.Size`.
This module builds those from what the API server holds, and nothing else:

* **the size now** is what the pod was admitted with: per GPU container, its trusted
  ``gpupack.io/allocation`` record (``controller.state.pods.read_record``), else its own
  ``gpupack.io/gpu-milli`` / ``gpu-memory`` limits (``sharing.api.request.parse_pod``). A record
  without a memory figure holds its MIG profile's memory, or without a profile the whole GPU's
  of its ``gpuModel``; a container whose memory is still unknown is not judged (nothing is
  resized on a guess). A container the webhook right-sized has, beside the allocation record,
  its ``gpupack.io/right-sized-from`` record (``sharing.api.right_sized``): its size now is that
  record's predicted ``milli`` and ``memoryBytes``, not the allocation's ``milli``, which is the
  *accounted* milli under compute over-commit (``ceil(predicted / computeOvercommit)``) and would
  otherwise read as far below the recommendation it was sized from;
* **the target** is the container's entry in the workload's ``GPURecommendation``
  (``sharing.api.workload.recommendation_name``), only while its condition
  ``RecommendationProvided`` is ``True`` and its ``targetRef`` names this workload. A
  recommended ``gpuMilli`` of 0 counts as 1, the least a request may ask (as
  ``sharing.usage.sizing.size_for`` rounds);
* **on the device-plugin backend, what the pod holds**, where its node's GPU memory is known
  (``gpu_memory``): a pod admitted ``whole`` holds the whole GPU, whatever memory its record
  was sized to (no MPS limit binds it), and a target that no split into two replicas holds is
  a whole GPU too, as the webhook would admit it (``sharing.usage.sizing.replica_share_of``).
  Judged on the record and the raw recommendation instead, a pod on a whole GPU recommended
  more than half of one was moved to another whole GPU, gaining nothing, and again each time its
  recommendation grew past the memory its record named (11 of the 21 moves of a live replay
  of 8 trace pods, benchmarks/usage_live.md); and one recommended less than half of one read as not far from a record
  that named what it was sized to, so it kept its whole GPU;
* **one candidate per pod.** The updater judges a container; a pod is evicted whole, so the pod
  is represented by its most pressing container (one at risk of an OOM first, then one far
  from its target), and its workload key names no container (``container=""``): the budget
  is per workload, not per container.

What a shared function would need, so this adapter could go: ``sharing.usage.updater`` taking a
pod's containers (a mapping container -> (current, target)) and a workload key without a
container. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.state.pods import read_record
from mig.catalog import find_model
from sharing.api.allocation import Allocation
from sharing.api.fields import as_list, as_map
from sharing.api.keys import RIGHT_SIZED_ANNOTATION
from sharing.api.recommendation import RecommendationError, RecommendationReading, read_recommendation
from sharing.api.request import AdmissionRefusal, parse_pod
from sharing.api.right_sized import RightSizedError, RightSizedFrom
from sharing.api.workload import WorkloadRef, recommendation_name
from sharing.usage.recommender import WorkloadKey
from sharing.usage.sizing import Size, replica_share_of, whole_gpu
from sharing.usage.updater import Candidate, UpdaterSettings, at_risk, is_far

"""The condition a recommendation must carry ``True`` before anything acts on it."""

RecommendationKey = tuple[str, str]
"""(namespace, name) of a ``GPURecommendation``."""


@dataclass(frozen=True)
class PodCandidate:
    """A pod the updater may judge, with what the controller needs to evict it and say why."""

    candidate: Candidate
    workload: WorkloadRef
    recommendation: str
    """The ``GPURecommendation``'s name (in the pod's namespace)."""
    container: str
    """The container that represents the pod (module docstring)."""


def read_recommendations(objects: Iterable[Mapping[str, Any]]) -> tuple[dict[RecommendationKey, RecommendationReading],
                                                                         list[str]]:
    """The ``GPURecommendation`` objects by (namespace, name), read by the one reader
    (``sharing.api.recommendation``); and, for each one left out because it does not validate, why."""
    out: dict[RecommendationKey, RecommendationReading] = {}
    problems: list[str] = []
    for obj in objects:
        try:
            reading = read_recommendation(obj)
        except RecommendationError as exc:
            # The caller's log line names the kind already: ``namespace/name: why``.
            problems.append(str(exc).removeprefix("GPURecommendation "))
            continue
        out[(reading.namespace, reading.name)] = reading
    return out, problems


def targets(recommendation: RecommendationReading, workload: WorkloadRef) -> dict[str, Size]:
    """Per container, the recommended size; empty unless the recommendation is provided for ``workload``."""
    if recommendation.target != workload or not recommendation.provided:
        return {}
    return {s.container: Size(max(1, s.milli), s.memory_bytes) for s in recommendation.sizes}


def _record_sizes(allocation: Allocation) -> dict[str, Size]:
    model = find_model(allocation.gpu_model) if allocation.gpu_model else None
    out: dict[str, Size] = {}
    for c in allocation.containers:
        memory = c.memory_bytes
        if memory is None and model is not None:
            profile = c.profile if c.profile and model.has_profile(c.profile) else None
            memory = model.profile(profile).memory_bytes if profile else model.memory_mib * 1024 * 1024
        if memory is not None:
            out[c.name] = Size(c.milli, memory)
    return out


def current_sizes(pod: Mapping[str, Any]) -> dict[str, Size]:
    """Per GPU container, the size the pod was admitted with (module docstring); empty when unknown."""
    _, allocation, _ = read_record(pod)
    if allocation is not None:
        return {**_record_sizes(allocation), **_right_sized(pod)}
    try:
        request = parse_pod(dict(pod))
    except AdmissionRefusal:
        return {}
    if request is None:
        return {}
    return {c.name: Size(c.milli, c.memory_bytes) for c in request.containers if c.memory_bytes is not None}


def _right_sized(pod: Mapping[str, Any]) -> dict[str, Size]:
    """The predicted sizes of the containers the webhook right-sized (read only beside a trusted
    allocation record, which only the webhook writes with it); empty when there is no readable record."""
    text = as_map(as_map(pod.get("metadata")).get("annotations")).get(RIGHT_SIZED_ANNOTATION)
    if text is None:
        return {}
    try:
        record = RightSizedFrom.from_annotation(text)
    except RightSizedError:
        return {}
    return {c.name: Size(c.milli, c.memory_bytes) for c in record.containers}


def _pressing(pairs: list[tuple[str, Size, Size]], settings: UpdaterSettings) -> tuple[str, Size, Size]:
    """The container that represents the pod: at risk first, then far, then the first."""
    for test in (at_risk, is_far):
        for name, current, target in pairs:
            if test(current, target, settings):
                return name, current, target
    return pairs[0]


def pod_candidate(key: str, pod: Mapping[str, Any], workload: WorkloadRef,
                  recommendations: Mapping[RecommendationKey, RecommendationReading],
                  settings: UpdaterSettings, gpu_memory: Mapping[str, int] | None = None) -> PodCandidate | None:
    """The pod as the updater's candidate, or None when it has no recommendation or no known size.
    ``gpu_memory``: node -> its GPUs' memory in bytes (module docstring, the device-plugin backend)."""
    name = recommendation_name(workload)
    recommendation = recommendations.get((workload.namespace, name))
    if recommendation is None:
        return None
    wanted = targets(recommendation, workload)
    sizes = current_sizes(pod)
    pairs = [(c, sizes[c], wanted[c]) for c in _container_names(pod) if c in sizes and c in wanted]
    if not pairs:
        return None
    pairs = _as_held(pod, pairs, gpu_memory or {})
    container, current, target = _pressing(pairs, settings)
    budget_key = WorkloadKey(workload.namespace, workload.kind, workload.name, "")
    return PodCandidate(Candidate(key, budget_key, current, target), workload, name, container)


def _as_held(pod: Mapping[str, Any], pairs: list[tuple[str, Size, Size]],
             gpu_memory: Mapping[str, int]) -> list[tuple[str, Size, Size]]:
    """On the device-plugin backend, each (container, current, target) as what the pod holds and
    would hold (module docstring); unchanged elsewhere or where the node's GPU memory is unknown."""
    memory = gpu_memory.get(str(as_map(pod.get("spec")).get("nodeName") or ""), 0)
    _, allocation, _ = read_record(pod)
    if not memory or allocation is None or allocation.backend != "device-plugin":
        return pairs
    whole = allocation.mode == "whole"
    return [(name, whole_gpu(memory) if whole else current, replica_share_of(target, memory))
            for name, current, target in pairs]


def _container_names(pod: Mapping[str, Any]) -> list[str]:
    spec = as_map(pod.get("spec"))
    return [str(as_map(c).get("name")) for kind in ("initContainers", "containers") for c in as_list(spec.get(kind))]


__all__ = ["PodCandidate", "RecommendationKey", "current_sizes", "pod_candidate", "read_recommendations",
           "targets"]

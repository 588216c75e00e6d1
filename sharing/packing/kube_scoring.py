"""kube-scheduler's ``NodeResourcesFit`` scoring with the ``MostAllocated`` strategy, as a model.

Pods the packing engine does not place (whole-GPU and CPU-only pods) are scored
by kube-scheduler with the configuration gpupack ships
(``manifests/scheduler/kube-scheduler-config.yaml``). The product model of the
simulator needs the same choice, so this module computes it the way
kube-scheduler does (``pkg/scheduler/framework/plugins/noderesources``):

- per resource, ``requested * 100 // allocatable`` where requested includes the
  pod, integer arithmetic;
- a resource with allocatable 0 on the node is left out, and so is an extended
  resource the pod does not ask for;
- the node's score is the weighted sum over the resources kept, integer-divided
  by the sum of their weights.

Ties are broken by the cluster's ``tie_rank`` (kube-scheduler samples among equal
scores; the rank is the trace's random order, so this is a random choice too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharing.packing.cluster import IntArray


@dataclass(frozen=True)
class MostAllocatedWeights:
    """Weights of the resources the simulator models; no defaults: the values come from
    the configuration gpupack ships (``sharing.simulator.scheduler_config``)."""

    cpu: int
    memory: int
    gpu: int
    """``nvidia.com/gpu`` (whole GPUs)."""
    gpu_shared: int
    """``nvidia.com/gpu.shared`` (MPS / time-sliced replicas)."""


def _part(requested: IntArray, allocatable: IntArray) -> IntArray:
    out: IntArray = np.where(allocatable > 0, (np.minimum(requested, allocatable) * 100) // np.maximum(allocatable, 1), 0)
    return out


def most_allocated(
    cpu_requested: IntArray,
    cpu_allocatable: IntArray,
    memory_requested: IntArray,
    memory_allocatable: IntArray,
    gpu_requested: IntArray | None,
    gpu_allocatable: IntArray | None,
    gpu_weight: int,
    weights: MostAllocatedWeights,
) -> IntArray:
    """Score per node (0..100). ``gpu_*`` is the one GPU resource the pod asks for
    (``None`` when it asks for none: extended resources it does not request are left out).
    Every ``*_requested`` already includes the pod."""
    num = weights.cpu * _part(cpu_requested, cpu_allocatable)
    wsum = weights.cpu * (cpu_allocatable > 0).astype(np.int64)
    num = num + weights.memory * _part(memory_requested, memory_allocatable)
    wsum = wsum + weights.memory * (memory_allocatable > 0)
    if gpu_requested is not None and gpu_allocatable is not None:
        num = num + gpu_weight * _part(gpu_requested, gpu_allocatable)
        wsum = wsum + gpu_weight * (gpu_allocatable > 0)
    score: IntArray = np.where(wsum > 0, num // np.maximum(wsum, 1), 0)
    return score

"""From a recommendation to a request; the fit rule of shares sized from use, re-exported.

A recommendation (``sharing.usage.recommender``) becomes a request in the request API's own
units (:class:`Size`): ``gpupack.io/gpu-milli`` (1..1000, the duty cycle's percent x 10) and
``gpupack.io/gpu-memory`` (bytes, at most the GPU's). A resized pod then takes its share by the
normal path, which this room does not repeat:

* device-plugin MPS: the node's replica count, ``sharing.rules.replicas.most_replicas``;
* MIG: the smallest covering profile, ``mig.fit.smallest_covering_profile``;
* DRA: the claim's capacities rounded by ``sharing.dra.share_policy.SharePolicy``.

:func:`fits`, :class:`Size` and :class:`GpuLoad` are the packing engine's
(``sharing.packing.shared_gpus``, which says the rule: **memory is never over-committed**, compute
only by a policy's ``compute_overcommit`` and against predicted use); they are re-exported here
for this module's callers.
"""

from __future__ import annotations

import math

from sharing.packing.shared_gpus import GpuLoad, Size, fits
from sharing.rules.replicas import MAX_MILLI, needs_whole_gpu
from sharing.usage.recommender import Recommendation

__all__ = ["GpuLoad", "Size", "fits", "replica_share_of", "size_for", "whole_gpu"]


def whole_gpu(gpu_memory_bytes: int) -> Size:
    """What a pod that asks for a whole GPU holds: all its compute and memory."""
    return Size(MAX_MILLI, gpu_memory_bytes)


def size_for(recommendation: Recommendation, gpu_memory_bytes: int) -> Size:
    """The request a recommendation makes on GPUs of ``gpu_memory_bytes`` (at most a whole one)."""
    milli = min(MAX_MILLI, max(1, math.ceil(recommendation.duty_percent * MAX_MILLI / 100.0)))
    return Size(milli, min(gpu_memory_bytes, recommendation.memory_bytes))


def replica_share_of(size: Size, gpu_memory_bytes: int) -> Size:
    """What a pod sized ``size`` holds on the device-plugin backend: ``size`` itself (an MPS replica
    whose limit is its memory), or a whole GPU where no split into two replicas holds it. The
    webhook's rule (``sharing.rules.replicas.needs_whole_gpu``): such a pod is admitted ``whole``,
    ``nvidia.com/gpu``, and holds all the GPU's compute and memory whatever memory it was sized
    to. The simulator seats such a pod this way and the ``Recreate`` updater judges it so
    (``controller.planning.right_size_candidates``): a move from one whole GPU to another gains nothing."""
    if needs_whole_gpu(size.milli, size.memory_bytes, gpu_memory_bytes):
        return whole_gpu(gpu_memory_bytes)
    return size

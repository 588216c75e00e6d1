"""From a recommendation to a request, and the one fit rule for shares sized from use.

A recommendation (``sharing.usage.recommender``) becomes a request in the request API's own
units (:class:`Size`): ``gpupack.io/gpu-milli`` (1..1000, the duty cycle's percent x 10) and
``gpupack.io/gpu-memory`` (bytes, at most the GPU's). A resized pod then takes its share by the
normal path, which this room does not repeat:

* device-plugin MPS: the node's replica count, ``sharing.rules.replicas.most_replicas``;
* MIG: the smallest covering profile, ``mig.fit.smallest_covering_profile``;
* DRA: the claim's capacities rounded by ``sharing.dra.share_policy.SharePolicy``.

:func:`fits` is the rule a GPU's shares obey when they are sized from use: **memory is never
over-committed** (the memory limits on one GPU sum to at most its memory: a GPU cannot lend
memory, use past it is an OOM), and compute may be over-committed only by a policy's
``compute_overcommit`` factor (1.0, none, by default), applied to recommendations, which are
predicted use: the duty cycles a GPU's pods are predicted to reach sum to at most
``1000 * compute_overcommit`` milli.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharing.rules.replicas import MAX_MILLI
from sharing.usage.recommender import Recommendation


@dataclass(frozen=True)
class Size:
    """A container's request: compute milli (1..1000) and a memory limit in bytes."""

    milli: int
    memory_bytes: int

    def __post_init__(self) -> None:
        if not 1 <= self.milli <= MAX_MILLI or self.memory_bytes < 0:
            raise ValueError(f"a size needs milli in 1..{MAX_MILLI} and memory >= 0, got {self}")


def whole_gpu(gpu_memory_bytes: int) -> Size:
    """What a pod that asks for a whole GPU holds: all its compute and memory."""
    return Size(MAX_MILLI, gpu_memory_bytes)


def size_for(recommendation: Recommendation, gpu_memory_bytes: int) -> Size:
    """The request a recommendation makes on GPUs of ``gpu_memory_bytes`` (at most a whole one)."""
    milli = min(MAX_MILLI, max(1, math.ceil(recommendation.duty_percent * MAX_MILLI / 100.0)))
    return Size(milli, min(gpu_memory_bytes, recommendation.memory_bytes))


@dataclass(frozen=True)
class GpuLoad:
    """What the shares on one GPU add up to."""

    milli: int = 0
    memory_bytes: int = 0

    def plus(self, size: Size) -> GpuLoad:
        return GpuLoad(self.milli + size.milli, self.memory_bytes + size.memory_bytes)

    def minus(self, size: Size) -> GpuLoad:
        return GpuLoad(self.milli - size.milli, self.memory_bytes - size.memory_bytes)


def fits(load: GpuLoad, size: Size, gpu_memory_bytes: int, compute_overcommit: float = 1.0) -> bool:
    """Whether ``size`` joins a GPU holding ``load`` (module docstring: memory never over-committed)."""
    if compute_overcommit < 1.0:
        raise ValueError(f"compute_overcommit must be at least 1.0, got {compute_overcommit}")
    return (load.memory_bytes + size.memory_bytes <= gpu_memory_bytes
            and load.milli + size.milli <= MAX_MILLI * compute_overcommit)

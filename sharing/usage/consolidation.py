"""Consolidation moves: empty the least-used GPUs into the room others have, within a budget.

Right-sizing a pod frees memory on its GPU, and pods leave; without moves a cluster keeps GPUs
that hold one small share each. :func:`consolidation_moves` looks at the GPUs holding the fewest
shares first (least memory among equals) and proposes moving *all* of a GPU's pods onto other
GPUs, each by best fit (least memory left after it) under :func:`sharing.usage.sizing.fits`, so
memory is never over-committed. A GPU is drained only when every one of its pods finds room and
no pod of it belongs to a workload whose move budget (``budget``: moves left per workload) is
spent: half a drain frees nothing and costs restarts. GPUs that received pods in this call are
not drained in it. The moves are make-before-break like the updater's
(``sharing.usage.updater``): each replacement is seated before its old pod is removed.

The cluster-autoscaler's scale-down follows the same idea (empty the least-used node if its
pods fit elsewhere); here it runs per GPU, with the shares' own sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharing.usage.recommender import WorkloadKey
from sharing.usage.sizing import GpuLoad, Size, fits


@dataclass(frozen=True)
class Share:
    """A pod's share on a GPU, and its workload (whose budget a move spends)."""

    pod: str
    workload: WorkloadKey
    size: Size


@dataclass(frozen=True)
class Move:
    pod: str
    workload: WorkloadKey
    to_gpu: int


def _load(shares: Sequence[Share]) -> GpuLoad:
    load = GpuLoad()
    for share in shares:
        load = load.plus(share.size)
    return load


def consolidation_moves(gpus: Mapping[int, Sequence[Share]], gpu_memory_bytes: int, budget: Mapping[WorkloadKey, int],
                        compute_overcommit: float = 1.0, max_drains: int = 1) -> tuple[Move, ...]:
    """Moves that empty up to ``max_drains`` GPUs (module docstring)."""
    loads = {gpu: _load(shares) for gpu, shares in gpus.items()}
    left = dict(budget)
    received: set[int] = set()
    drained: set[int] = set()
    moves: list[Move] = []
    order = sorted(gpus, key=lambda g: (len(gpus[g]), loads[g].memory_bytes, g))
    for gpu in order:
        if len(drained) >= max_drains:
            break
        if gpu in received or not gpus[gpu]:
            continue
        trial = dict(loads)
        planned: list[Move] = []
        spend: dict[WorkloadKey, int] = {}
        for share in sorted(gpus[gpu], key=lambda s: (-s.size.memory_bytes, s.pod)):
            spend[share.workload] = spend.get(share.workload, 0) + 1
            if spend[share.workload] > left.get(share.workload, 0):
                break
            room = [(gpu_memory_bytes - load.memory_bytes - share.size.memory_bytes, other)
                    for other, load in trial.items()
                    if other != gpu and other not in drained and fits(load, share.size, gpu_memory_bytes,
                                                                      compute_overcommit)]
            if not room:
                break
            target = min(room)[1]
            trial[target] = trial[target].plus(share.size)
            planned.append(Move(share.pod, share.workload, target))
        else:
            loads = trial
            loads[gpu] = GpuLoad()
            drained.add(gpu)
            received.update(m.to_gpu for m in planned)
            for workload, count in spend.items():
                left[workload] -= count
            moves += planned
    return tuple(moves)

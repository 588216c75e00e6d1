"""Consolidation moves: empty the least-used GPUs into the room others have, within a budget.

Right-sizing a pod frees memory on its GPU, and pods leave; without moves a cluster keeps GPUs
that hold one small share each. :func:`consolidation_moves` looks at the GPUs holding the fewest
shares first (least memory among equals) and proposes moving *all* of a GPU's pods onto other
GPUs, each by the packing engine's best fit (``sharing.packing.shared_gpus.SharedGpus``: least
memory left after it, under the one fit rule, so memory is never over-committed). A GPU is drained
only when every one of its pods finds room and no pod of it belongs to a workload whose move
budget (``budget``: moves left per workload) is spent: half a drain frees nothing and costs
restarts. GPUs that received pods in this call are not drained in it. The moves are
make-before-break like the updater's (``sharing.usage.updater``): each replacement is seated
before its old pod is removed.

The cluster-autoscaler's scale-down follows the same idea (empty the least-used node if its
pods fit elsewhere); here it runs per GPU, with the shares' own sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sharing.packing.shared_gpus import SharedGpus
from sharing.usage.recommender import WorkloadKey


@dataclass(frozen=True)
class Move:
    pod: str
    workload: WorkloadKey
    to_gpu: int


def consolidation_moves(pool: SharedGpus, owners: Mapping[str, WorkloadKey], budget: Mapping[WorkloadKey, int],
                        max_drains: int = 1) -> tuple[Move, ...]:
    """Moves that empty up to ``max_drains`` of ``pool``'s GPUs (module docstring); ``owners``:
    each seated pod's workload. The pool itself is left as it is."""
    trial = pool.fork()
    left = dict(budget)
    received: set[int] = set()
    moves: list[Move] = []
    drains = 0
    order = sorted(pool.loads, key=lambda g: (len(pool.pods_on(g)), pool.loads[g].memory_bytes, g))
    for gpu in order:
        if drains >= max_drains:
            break
        if gpu in received:
            continue
        attempt = trial.fork()
        planned: list[Move] = []
        spend: dict[WorkloadKey, int] = {}
        pods = sorted(trial.pods_on(gpu), key=lambda p: (-trial.seats[p][1].memory_bytes, p))
        for pod in pods:
            workload = owners[pod]
            spend[workload] = spend.get(workload, 0) + 1
            if spend[workload] > left.get(workload, 0):
                break
            size, duty = attempt.seats[pod][1], attempt.duties.get(pod)
            target = attempt.best_fit(size, duty, avoid=gpu)
            if target is None:
                break
            attempt.place(pod, size, target, duty)
            planned.append(Move(pod, workload, target))
        else:
            trial = attempt
            drains += 1
            received.update(m.to_gpu for m in planned)
            for workload, count in spend.items():
                left[workload] -= count
            moves += planned
    return tuple(moves)

"""Building one run's arrival sequence from a trace and a seed (``PROTOCOL.md`` §2).

P0 is the trace sorted by pod name. One generator seeded with the seed is used,
in this order: one discarded draw, the shuffle of P0, the tuning draws, the
node-rank permutation. Tuning scales the workload to ``inflate`` times the
cluster's GPU capacity: surplus pods are deleted at random, or clones drawn from
P0 are appended after the shuffled originals, with the published stop test
(which compares against per-GPU milli, so a multi-GPU clone may overshoot).
The Go generator cannot be reproduced bit for bit; 10-seed statistics match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sharing.packing.specs import GPU_MILLI, PodSpec

CLONE_INFIX = "-clone-"
"""A clone of trace pod ``p`` is named ``p-clone-<n>``."""

PUBLISHED_SEEDS = tuple(range(42, 52))
"""The ten seeds of the published experiment (``-tuneseed 42..51``)."""


@dataclass(frozen=True)
class Workload:
    """Pods in arrival order and the per-node tie-break ranks of one run."""

    seed: int
    pods: tuple[PodSpec, ...]
    tie_rank: tuple[int, ...]
    originals: tuple[PodSpec, ...]
    """P0: the untuned trace sorted by name (FGD's typical pods come from it)."""
    clones: int
    removed: int


def trace_name(name: str) -> str:
    """The trace pod an arriving pod ``name`` is, or is a clone of (its class and priority are that pod's)."""
    return name.split(CLONE_INFIX, 1)[0]


def published_seeds(count: int) -> tuple[int, ...]:
    """The first ``count`` seeds 42, 43, ..."""
    if count < 1:
        raise ValueError("need at least one seed")
    return tuple(range(42, 42 + count))


def build_workload(
    pods: Sequence[PodSpec], node_count: int, total_gpus: int, seed: int, inflate: float = 1.3
) -> Workload:
    """Shuffle and tune ``pods`` for one run; ``node_count`` nodes get a random tie-break rank."""
    if inflate <= 0:
        raise ValueError("inflate must be positive")
    originals = tuple(sorted(pods, key=lambda p: p.name))
    rng = np.random.default_rng(seed)
    rng.random()  # the published run discards one draw before shuffling
    order = [originals[i] for i in rng.permutation(len(originals))]
    target = inflate * total_gpus * GPU_MILLI
    demand = sum(p.gpu_total_milli for p in order)
    clones = removed = 0
    if demand > target:
        while demand > target and order:
            victim = order.pop(int(rng.integers(len(order))))
            demand -= victim.gpu_total_milli
            removed += 1
    elif demand < target and any(p.gpu_milli for p in originals):
        while True:
            pick = originals[int(rng.integers(len(originals)))]
            if demand + pick.gpu_milli > target:
                break
            clones += 1
            order.append(replace(pick, name=f"{pick.name}{CLONE_INFIX}{clones}"))
            demand += pick.gpu_total_milli
    ranks = rng.permutation(node_count)
    return Workload(
        seed=seed,
        pods=tuple(order),
        tie_rank=tuple(int(r) for r in ranks),
        originals=originals,
        clones=clones,
        removed=removed,
    )

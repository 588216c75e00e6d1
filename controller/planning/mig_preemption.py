"""Preemption that re-lays out one MIG GPU: which lower-priority pods a MIG pod displaces so that the GPU,
reshaped, holds the profiles it asks for (issue 36).

:mod:`controller.planning.preemption` asks here for a MIG pod when no instance of a profile it asks
for can be freed. A GPU qualifies when its node's policy gate for a layout gpupack chooses is open
now (``may_reshape``, the planner's judgement: a policy selects it, no static layout, window open,
``maxConcurrent`` not reached, the pod's profiles allowed), the GPU is MIG-enabled, settled and
without a fault, and every pod claiming an instance on its node is reported on one (a pod the agent
has not placed on an instance yet might be on any of them).

**Who holds what.** The node agent names the pods on each instance (``GPUNode`` status, the kubelet's
device assignments; :attr:`controller.state.snapshot.Gpu.users`). An instance in use counts as freed
only when every pod it names is a victim; one in use by anybody else (a pod that is not a victim, a
process no pod is named for) stays, so no plan here asks to destroy it. Unused instances may go.

**Which victims.** The pods named on the GPU's instances that the preemptor may preempt (strictly
lower priority, ``sharing.rules.priority.may_preempt``; gpupack's own, not chosen this cycle): the
fewest whose instances, once destroyed, leave room for the pod's profiles next to the instances that
stay (``mig.geometry.fits_with``: NVIDIA's placement rules), with the pod's CPU and memory (``room``).
Subsets are tried by size, so the answer is the fewest pods, not a greedy cover (a GPU holds at most
seven instances, so at most 127 subsets, and none larger than the best GPU's so far); among subsets
of one size and among GPUs the order is :mod:`sharing.packing.victim_order`'s, the engine's, then
the snapshot's order of nodes and GPUs. The search (:func:`lowest_first`, :func:`fewest_victims`) is
the DRA pool's too (``controller.planning.dra_mig_preemption``), with its own trial.

The planner then holds the node for the preemptor and reshapes the GPU once the victims are gone
(``controller.planning.planner``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from controller.planning.capacity import unreported_claims
from controller.state.snapshot import Gpu, Node, Pod
from mig.geometry import fits_with
from mig.model import PlacedInstance
from sharing.packing.victim_order import plan_key, victim_key
from sharing.rules.priority import may_preempt

REASON_MIG_RESHAPE = "mig-reshape"
"""The metric reason of a preemption that frees MIG instances so that their GPU is re-laid out."""

MAX_CANDIDATES = 7
"""Pods of one GPU tried as victims at most, lowest in the victim order first (a GPU holds at most
seven instances, each normally held by one pod)."""


@dataclass(frozen=True)
class GpuVictims:
    """The victims on GPU ``gpu`` of ``node`` that let it be re-laid out for the preemptor."""

    node: Node
    gpu: int
    victims: tuple[Pod, ...]


def _kept(gpu: Gpu, victims: set[str]) -> tuple[PlacedInstance, ...]:
    """The GPU's instances in use by someone other than ``victims``: they stay, whatever else changes."""
    named = dict(gpu.users)
    return tuple(i for i in gpu.in_use if not named.get(i) or not set(named[i]) <= victims)


def _on_gpu(pod: Pod, node: Node, gpu: Gpu, holders: dict[str, Pod], spared: set[str],
            room: Callable[[Node, list[Pod]], bool], beat: Rank | None) -> tuple[Rank, list[Pod]] | None:
    """The best victims on ``gpu`` (module docstring) ranking below ``beat`` (the best GPU's so far),
    and their rank, or None."""
    if not gpu.mig_enabled or gpu.reshaping or gpu.faulted or node.model is None:
        return None
    if not all(node.model.has_profile(p) for p in pod.profiles):
        return None
    model = node.model
    if fits_with(model, _kept(gpu, set()), pod.profiles) is not None:
        return None  # it fits beside every pod there: a reshape of a busy GPU, no preemption's to make
    named = {key for _, keys in gpu.users for key in keys}
    candidates = lowest_first(pod, (v for key, v in holders.items() if key in named and key not in spared))
    return fewest_victims(candidates, lambda chosen: fits_with(model, _kept(gpu, {v.key for v in chosen}),
                                                               pod.profiles) is not None and room(node, chosen), beat)


def lowest_first(pod: Pod, pods: Iterable[Pod]) -> list[Pod]:
    """The pods ``pod`` may preempt (strictly lower priority), in the victim order, at most
    :data:`MAX_CANDIDATES` of them: the candidates of one GPU."""
    return sorted((v for v in pods if may_preempt(pod.priority, v.priority.value)),
                  key=lambda v: victim_key(v.priority.value, sum(v.milli), v.key))[:MAX_CANDIDATES]


Rank = tuple[int, int, int, int]
"""A plan's :func:`sharing.packing.victim_order.plan_key`."""


def fewest_victims(candidates: Sequence[Pod], works: Callable[[list[Pod]], bool],
                   beat: Rank | None = None) -> tuple[Rank, list[Pod]] | None:
    """The subset of ``candidates`` (at most :data:`MAX_CANDIDATES` of them) for which ``works`` (the caller's trial)
    holds, with its rank: subsets tried by size, so the fewest pods, not a greedy cover; among those
    of one size :func:`sharing.packing.victim_order.plan_key`'s order. None when none works.
    ``works`` must hold for a set if it holds for a subset (more victims free more): when all of
    ``candidates`` together do not make room, no subset is tried. ``beat``: the rank of the best plan
    found elsewhere (which wins ties); a subset that cannot rank below it is not tried."""
    if not candidates or not works(list(candidates)):
        return None
    for size in range(1, min(len(candidates), MAX_CANDIDATES if beat is None else beat[0]) + 1):
        best: tuple[Rank, list[Pod]] | None = None
        for chosen in combinations(candidates, size):
            rank = plan_key([v.priority.value for v in chosen], sum(sum(v.milli) for v in chosen))
            if (beat is not None and rank >= beat) or (best is not None and rank >= best[0]):
                continue  # ranked before the trial: the trial is the cost
            if not works(list(chosen)):
                continue
            if best is None or rank < best[0]:
                best = (rank, list(chosen))
        if best is not None:
            return best
    return None


def reshape_victims(pod: Pod, nodes: Iterable[Node], on_node: dict[str, list[Pod]], *, admits: Callable[[Node], bool],
                    may_reshape: Callable[[Node], bool], spared: set[str],
                    room: Callable[[Node, list[Pod]], bool]) -> GpuVictims | None:
    """The GPU to re-lay out for MIG pod ``pod`` and its victims (module docstring), or None.

    ``on_node``: gpupack's pods holding capacity per node (bound, or pinned with the gate lifted);
    ``admits``: whether the pod may go to a node; ``may_reshape``: whether the node's policy gate lets
    one of its GPUs be re-laid out for the pod now; ``spared``: keys never to take; ``room``: whether
    the pod's CPU and memory fit on a node once the victims are gone."""
    if pod.mode != "mig" or not pod.profiles:
        return None
    best: tuple[tuple[int, int, int, int, int, int], GpuVictims] | None = None
    for position, node in enumerate(nodes):
        if node.model is None or not any(g.mig_enabled for g in node.gpus) or not admits(node):
            continue
        pods = [p for p in on_node.get(node.name, ()) if p.mode == "mig" and p.backend != "dra"]
        if unreported_claims(node, Counter(prof for p in pods for prof in p.profiles)):
            continue  # a pod not yet reported on an instance could be on any of them
        if not may_reshape(node):
            continue
        holders = {p.key: p for p in pods}
        for gpu in node.gpus:
            # A GPU whose subsets cannot rank below the best so far cannot win: they go untried.
            found = _on_gpu(pod, node, gpu, holders, spared, room, None if best is None else best[0][:4])
            if found is None:
                continue
            rank = (*found[0], position, gpu.index)
            if best is None or rank < best[0]:
                best = (rank, GpuVictims(node, gpu.index, tuple(found[1])))
    return None if best is None else best[1]


__all__ = ["MAX_CANDIDATES", "REASON_MIG_RESHAPE", "GpuVictims", "Rank", "fewest_victims", "lowest_first",
           "reshape_victims"]

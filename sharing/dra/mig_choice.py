"""The engine's choice of a MIG placement on a DRA pool: which node, GPU and placement a pod's requests get.

The rule (``controller.planning.dramig`` builds the GPUs from the cluster; the
simulator's DRA model on MIG GPUs, ``sharing.simulator.dra_mig``, calls the
same functions, so the live choice and the model's are one implementation).

**The node** (:func:`place_pod`): among the nodes that can hold every request
of the pod, the one with the highest MostAllocated score (kube-scheduler's
``NodeResourcesFit`` formula, ``sharing.packing.kube_scoring.most_allocated``)
over three resources, each counted with the pod on it: CPU and memory requested
(weight 50 each, as the scheduler configuration gpupack ships weights them) and
the compute slices of the node's MIG GPUs that instances hold (weight
:data:`MIG_SLICES_WEIGHT`). The node whose GPUs and CPU are fullest is filled
first, and the emptier nodes stay whole for the pods that need a whole node's
worth. Measured on the openb traces (H100, 10 seeds): above kube-scheduler's
unguided choice on 13 of 13 workloads, +0.16 to +2.29
(``benchmarks/simulate_dra_mig.py``), where ranking GPUs by best fit alone,
blind to CPU, was above it on 3 of 13.

**The GPU and placement** on the nodes tied at the best score, for one
request of ``profile`` (:func:`choose`):

1. an **existing instance** of that profile that no claim holds (nothing is
   created: no NVML call at prepare, no reshape);
2. otherwise a **new placement**, by ``mig.geometry.best_placement`` (the rule
   the device-plugin path's ``controller.planning.migplan`` and the published device
   order share: the placement after which the most valuable profiles still
   fit, ties to the highest start), next to every existing instance, every
   placement claims hold or were promised, and every faulted instance.

Among GPUs: existing before new, then best fit (the fewest free memory slices,
``mig.geometry.free_slices``), then the least fragmented result
(``usable_value``), then node name and index, so the same state always gives
the same choice. A placement a claim holds or was promised is never chosen
again, and every new one is checked with ``mig.geometry.can_add`` (through
``best_placement``), so chosen placements never overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mig.geometry import best_placement, free_slices, usable_value
from mig.model import GpuModel, PlacedInstance
from sharing.packing.cluster import IntArray
from sharing.packing.kube_scoring import MostAllocatedWeights, most_allocated

MIG_SLICES_WEIGHT = 100
"""Weight of the MIG compute slices in the node score, as much as CPU and memory together: a node
fuller in GPUs wins unless the other is much fuller in CPU and memory. Measured in the DRA MIG
model (4 seeds, default, cpu200, gpushare80, multigpu40): 100 is above 50, 200 and 400 on 3 of 4."""

CPU_AND_MEMORY_WEIGHTS = MostAllocatedWeights(cpu=50, memory=50, gpu=0, gpu_shared=0)
"""CPU and memory weighted as ``manifests/scheduler/kube-scheduler-config.yaml`` weights them (a unit
test reads the file); the GPU weights are not used here."""


@dataclass(frozen=True)
class NodeLoad:
    """A node's CPU milli and memory MiB as the node score reads them: requested by its pods and the
    pods placed this cycle (the pod being placed not included), and allocatable (0: unknown, left out
    of the score, as kube-scheduler leaves out a resource a node does not have)."""

    cpu_requested: int = 0
    cpu_allocatable: int = 0
    memory_requested: int = 0
    memory_allocatable: int = 0


@dataclass
class MigGpu:
    """One healthy MIG-enabled GPU of the DRA pool, as this cycle sees it (changed as requests are pinned)."""

    node: str
    index: int
    model: GpuModel
    occupied: list[PlacedInstance]
    """What a new placement must not overlap: existing instances, held and promised placements."""
    spare: list[PlacedInstance]
    """Existing healthy instances no claim holds: offered as themselves."""
    may_create: Callable[[str], bool] = field(default=lambda profile: False)
    """Whether the agent offers new placements of a profile here (the node's SharingPolicy)."""

    def copy(self) -> MigGpu:
        return MigGpu(self.node, self.index, self.model, list(self.occupied), list(self.spare), self.may_create)

    @property
    def held_slices(self) -> int:
        """Compute slices of the instances in use here: claimed, promised or faulted (not spare)."""
        return sum(self.model.profile(i.profile).compute_slices for i in self.occupied if i not in self.spare)


def node_scores(cpu_requested: IntArray, cpu_allocatable: IntArray, memory_requested: IntArray,
                memory_allocatable: IntArray, slices_held: IntArray, slices_total: IntArray) -> IntArray:
    """The node score (module docstring), per node; every ``*_requested`` and ``slices_held``
    already counts the pod being placed."""
    return most_allocated(cpu_requested, cpu_allocatable, memory_requested, memory_allocatable,
                          slices_held, slices_total, MIG_SLICES_WEIGHT, CPU_AND_MEMORY_WEIGHTS)


def asked_slices(model: GpuModel, profiles: Sequence[str]) -> int:
    """Compute slices the instances of ``profiles`` hold on a GPU of ``model``."""
    return sum(model.profile(p).compute_slices for p in profiles)


def _option(gpu: MigGpu, profile: str) -> tuple[tuple[int, int, int], PlacedInstance] | None:
    """The instance ``gpu`` gives a ``profile`` request, with its rank (lower is better)."""
    if not gpu.model.has_profile(profile):
        return None
    existing = next((i for i in gpu.spare if i.profile == profile), None)
    if existing is not None:
        return (0, free_slices(gpu.model, gpu.occupied), 0), existing
    if not gpu.may_create(profile):
        return None
    new = best_placement(gpu.model, gpu.occupied, profile)
    if new is None:
        return None
    return (1, free_slices(gpu.model, gpu.occupied), -usable_value(gpu.model, [*gpu.occupied, new])), new


def choose(gpus: Sequence[MigGpu], profile: str) -> tuple[MigGpu, PlacedInstance] | None:
    """The GPU and instance for one request of ``profile`` among ``gpus``, or None."""
    best: tuple[tuple[int, int, int, str, int], MigGpu, PlacedInstance] | None = None
    for gpu in gpus:
        found = _option(gpu, profile)
        if found is None:
            continue
        rank, instance = found
        key = (*rank, gpu.node, gpu.index)
        if best is None or key < best[0]:
            best = (key, gpu, instance)
    return None if best is None else (best[1], best[2])


def take(gpu: MigGpu, instance: PlacedInstance) -> None:
    """``instance`` is promised: never offered again this cycle."""
    if instance in gpu.spare:
        gpu.spare.remove(instance)
    else:
        gpu.occupied.append(instance)


def place_pod(gpus: Sequence[MigGpu], profiles: Sequence[str], loads: Mapping[str, NodeLoad],
              cpu_milli: int = 0, memory_mib: int = 0) -> list[tuple[MigGpu, PlacedInstance]] | None:
    """Instances for every profile of a pod that asks ``cpu_milli`` and ``memory_mib`` (module
    docstring: the best scored node that holds them all, then the engine's GPUs and placements on
    it); commits them to ``gpus`` and returns them in ``profiles`` order, or None and commits
    nothing. ``loads`` has each node's CPU and memory (a node missing: unknown, left out)."""
    order = _largest_first(gpus, profiles)
    by_node = _by_node(gpus)
    fitting = _fitting_nodes(by_node, [profiles[k] for k in order])
    if not fitting:
        return None
    unknown = NodeLoad()
    load = [loads.get(node, unknown) for node in fitting]
    scores = node_scores(
        np.array([n.cpu_requested + cpu_milli for n in load], dtype=np.int64),
        np.array([n.cpu_allocatable for n in load], dtype=np.int64),
        np.array([n.memory_requested + memory_mib for n in load], dtype=np.int64),
        np.array([n.memory_allocatable for n in load], dtype=np.int64),
        np.array([sum(g.held_slices for g in by_node[node]) + asked_slices(by_node[node][0].model, profiles)
                  for node in fitting], dtype=np.int64),
        np.array([sum(g.model.compute_slices for g in by_node[node]) for node in fitting], dtype=np.int64))
    best = {node for node, score in zip(fitting, scores) if score == scores.max()}
    return _place(gpus, profiles, order, best)


def place_all(gpus: Sequence[MigGpu], profiles: Sequence[str]) -> list[tuple[MigGpu, PlacedInstance]] | None:
    """Instances for every profile of a pod on one node, nodes unscored: the node the largest
    profile's best choice is on, among the nodes of ``gpus`` that can hold them all (largest profiles
    first, each the best choice left); commits them to ``gpus`` and returns them in ``profiles``
    order, or None and commits nothing. :func:`place_pod` makes this choice among its best scored nodes."""
    order = _largest_first(gpus, profiles)
    return _place(gpus, profiles, order, set(_fitting_nodes(_by_node(gpus), [profiles[k] for k in order])))


def _largest_first(gpus: Sequence[MigGpu], profiles: Sequence[str]) -> list[int]:
    return sorted(range(len(profiles)), key=lambda k: (-_slices(gpus, profiles[k]), k))


def _by_node(gpus: Sequence[MigGpu]) -> dict[str, list[MigGpu]]:
    """``gpus`` grouped by node, nodes by name (one pass, not one per node)."""
    grouped: dict[str, list[MigGpu]] = {}
    for gpu in gpus:
        grouped.setdefault(gpu.node, []).append(gpu)
    return dict(sorted(grouped.items()))


def _fitting_nodes(by_node: Mapping[str, Sequence[MigGpu]], ordered: Sequence[str]) -> list[str]:
    """The nodes (by name) that can hold every profile of ``ordered`` at once (a trial on copies)."""
    return [node for node, on_node in by_node.items() if _greedy([g.copy() for g in on_node], ordered) is not None]


def _place(gpus: Sequence[MigGpu], profiles: Sequence[str], order: Sequence[int],
           nodes: set[str]) -> list[tuple[MigGpu, PlacedInstance]] | None:
    """``place_all``'s choice among ``nodes`` (each can hold them all), committed."""
    candidates = [g for g in gpus if g.node in nodes]
    first = choose(candidates, profiles[order[0]]) if candidates else None
    if first is None:
        return None
    on_node = [g for g in gpus if g.node == first[0].node]
    chosen = _greedy(on_node, [profiles[k] for k in order])
    if chosen is None:  # cannot happen: the node passed the same trial
        return None
    out: list[tuple[MigGpu, PlacedInstance] | None] = [None] * len(profiles)
    for k, pick in zip(order, chosen):
        out[k] = pick
    return [p for p in out if p is not None]


def _greedy(gpus: Sequence[MigGpu], profiles: Sequence[str]) -> list[tuple[MigGpu, PlacedInstance]] | None:
    picks: list[tuple[MigGpu, PlacedInstance]] = []
    for profile in profiles:
        found = choose(gpus, profile)
        if found is None:
            return None
        take(*found)
        picks.append(found)
    return picks


def _slices(gpus: Sequence[MigGpu], profile: str) -> int:
    model = next((g.model for g in gpus if g.model.has_profile(profile)), None)
    return 0 if model is None else model.profile(profile).memory_slices

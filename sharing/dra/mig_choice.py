"""The engine's choice of a MIG placement on a DRA pool: which placement of which GPU one request gets.

The rule (``controller.dramig`` builds the GPUs from the cluster; the
simulator's DRA model on MIG GPUs, ``sharing.simulator.dra_mig``, calls the
same functions, so the live choice and the model's are one implementation).
For one request of ``profile``, among the GPUs given:

1. an **existing instance** of that profile that no claim holds (nothing is
   created: no NVML call at prepare, no reshape);
2. otherwise a **new placement**, by ``mig.geometry.best_placement`` (the rule
   the device-plugin path's ``controller.migplan`` and the published device
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mig.geometry import best_placement, free_slices, usable_value
from mig.model import GpuModel, PlacedInstance


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


def place_all(gpus: Sequence[MigGpu], profiles: Sequence[str]) -> list[tuple[MigGpu, PlacedInstance]] | None:
    """Instances for every profile of a pod on one node (largest profiles first, each the best
    choice left); commits them to ``gpus`` and returns them in ``profiles`` order, or None and
    commits nothing. The node is the one the largest profile's best choice is on, among nodes that
    can hold them all."""
    order = sorted(range(len(profiles)), key=lambda k: (-_slices(gpus, profiles[k]), k))
    fitting = []
    for node in sorted({g.node for g in gpus}):
        trial = [g.copy() for g in gpus if g.node == node]
        if _greedy(trial, [profiles[k] for k in order]) is not None:
            fitting.append(node)
    candidates = [g for g in gpus if g.node in fitting]
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

"""Choosing a GPU and a new MIG layout for profiles nobody can serve yet.

For one group of profiles (a pod's MIG containers) the candidates are every
GPU the policy lets gpupack touch, and three kinds of change, cheapest first:

1. **extend**: create the instances in free memory slices; nothing is destroyed,
   so no pod can notice (allowed without idle time);
2. **reshape**: destroy some *unused* instances of an idle GPU and create the
   new ones; :func:`mig.reach`-style minimal plans keep every instance that can
   stay, and in-use instances are never part of the destroy set;
3. **enable**: turn MIG on for an idle full GPU (the planner offers such GPUs
   only when MIG mode changes are allowed: they need a GPU reset).

Within a kind the choice is best fit (the GPU with the fewest free memory slices
that still fits, so empty GPUs stay empty for large profiles), then the least
fragmented result: the layout after which the most valuable profiles can still
be created (the same measure :func:`mig.geometry.best_placement` uses).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Literal

from mig.geometry import best_placement, fits_with, free_slices, usable_value
from mig.model import GpuModel, PlacedInstance
from mig.reach import plan_reconfiguration
from sharing.packing.mig_layouts import GpupackStrategy

ChangeKind = Literal["extend", "reshape", "enable"]
_KIND_RANK: dict[str, int] = {"extend": 0, "reshape": 1, "enable": 2}


@dataclass(frozen=True)
class LayoutChange:
    """A new geometry for one GPU, with the steps the agent will take."""

    node: str
    index: int
    kind: ChangeKind
    layout: tuple[PlacedInstance, ...]
    destroy: tuple[PlacedInstance, ...]
    create: tuple[PlacedInstance, ...]
    reason: str = ""


def place_new(model: GpuModel, keep: Sequence[PlacedInstance], needed: Sequence[str]) -> tuple[PlacedInstance, ...] | None:
    """Placements for ``needed`` next to ``keep``: greedy least-fragmenting first, exact search as fallback."""
    layout = list(keep)
    ordered = sorted(needed, key=lambda n: (-model.profile(n).memory_slices, -model.profile(n).compute_slices, n))
    for name in ordered:
        chosen = best_placement(model, layout, name)
        if chosen is None:
            break
        layout.append(chosen)
    else:
        return tuple(sorted(layout))
    exact = fits_with(model, keep, needed)
    return None if exact is None else tuple(sorted(exact))


def minimal_change(
    model: GpuModel,
    current: Sequence[PlacedInstance],
    in_use: Sequence[PlacedInstance],
    needed: Sequence[str],
    *,
    may_destroy: bool,
) -> tuple[tuple[PlacedInstance, ...], tuple[PlacedInstance, ...]] | None:
    """``(target layout, destroyed)`` adding ``needed`` with the fewest destroys, or None.

    In-use instances are never destroyed; without ``may_destroy`` nothing is.
    Among plans with equally few destroys the least fragmented target wins.
    """
    pinned = set(in_use)
    removable = sorted(i for i in current if i not in pinned) if may_destroy else []
    for count in range(len(removable) + 1):
        best: tuple[int, tuple[PlacedInstance, ...], tuple[PlacedInstance, ...]] | None = None
        for dropped in combinations(removable, count):
            keep = [i for i in current if i not in dropped]
            target = place_new(model, keep, needed)
            if target is None:
                continue
            value = usable_value(model, target)
            if best is None or value > best[0]:
                best = (value, target, tuple(dropped))
        if best is not None:
            return best[1], best[2]
    return None


@dataclass(frozen=True)
class GpuCandidate:
    """A GPU the planner may change this cycle, and what it may do to it."""

    node: str
    index: int
    model: GpuModel
    mig_enabled: bool
    current: tuple[PlacedInstance, ...]
    in_use: tuple[PlacedInstance, ...]
    may_destroy: bool
    """Idle long enough (and no unreported users) for unused instances to go."""


@lru_cache(maxsize=16384)
def _change_on(model: GpuModel, mig_enabled: bool, current: tuple[PlacedInstance, ...],
               in_use: tuple[PlacedInstance, ...], needed: tuple[str, ...], may_destroy: bool,
               ) -> tuple[tuple[int, int, int, int], ChangeKind, tuple[PlacedInstance, ...], tuple[PlacedInstance, ...]] | None:
    """The change creating ``needed`` on one GPU in this state, and the state's part of its rank; None
    if there is none. Pure and cached: at fleet size thousands of GPUs share a handful of layouts (most
    are empty or alike), so each distinct state is searched once, not once per GPU and waiting pod."""
    if mig_enabled:
        found = minimal_change(model, current, in_use, needed, may_destroy=may_destroy)
        if found is None:
            return None
        target, destroyed = found
        kind: ChangeKind = "reshape" if destroyed else "extend"
    else:
        if not may_destroy:
            return None  # turning MIG on needs an idle GPU
        placed = place_new(model, (), needed)
        if placed is None:
            return None
        target, destroyed, kind = placed, (), "enable"
    rank = (_KIND_RANK[kind], len(destroyed), free_slices(model, current) if mig_enabled else model.memory_slices,
            -usable_value(model, target))
    return rank, kind, target, destroyed


def best_change(candidates: Sequence[GpuCandidate], needed: Sequence[str]) -> LayoutChange | None:
    """The cheapest, best-fitting, least fragmenting change that creates ``needed`` on one GPU."""
    wanted = tuple(sorted(needed))
    best: tuple[tuple[int, int, int, int, str, int], GpuCandidate, ChangeKind, tuple[PlacedInstance, ...],
                tuple[PlacedInstance, ...]] | None = None
    for c in candidates:
        if not all(c.model.has_profile(n) for n in needed):
            continue
        found = _change_on(c.model, c.mig_enabled, tuple(sorted(c.current)), tuple(sorted(c.in_use)), wanted,
                           c.may_destroy)
        if found is None:
            continue
        rank, kind, target, destroyed = found
        key = (*rank, c.node, c.index)
        if best is None or key < best[0]:
            best = (key, c, kind, target, destroyed)
    if best is None:
        return None
    _, c, kind, target, destroyed = best
    created = tuple(i for i in target if i not in c.current)
    why = f"{kind} GPU {c.index} of {c.node} for {', '.join(sorted(needed))}"
    return LayoutChange(c.node, c.index, kind, target, destroyed, created, why)


_ENGINE = GpupackStrategy()


def engine_reshape(
    candidates: Sequence[GpuCandidate],
    needed: Sequence[str],
    demand: Counter[str],
    recent: dict[str, float],
    allowed: Callable[[str, str], bool],
) -> LayoutChange | None:
    """Reshape an idle GPU with the simulator's MIG layout engine (``sharing.packing.mig_layouts``).

    ``GpupackStrategy.plan`` gets the idle MIG GPUs of one model, the instance
    counts still missing for the cycle's waiting pods (``demand``, which
    includes ``needed``) and the recent request mix, and returns which GPU gets
    which maximal layout — the same decision the trace simulator measures. The
    first reshape that supplies ``needed`` and uses only profiles the node's
    policy allows (``allowed(node, profile)``) is taken; the agent's plan keeps
    nothing in use because the GPU is idle.
    """
    by_model: dict[str, list[GpuCandidate]] = {}
    for c in candidates:
        if c.mig_enabled and c.may_destroy and not c.in_use and all(c.model.has_profile(n) for n in needed):
            by_model.setdefault(c.model.product, []).append(c)
    want = Counter(needed)
    for product in sorted(by_model):
        group = by_model[product]
        model = group[0].model
        idle = [(i, tuple(sorted(x.profile for x in c.current))) for i, c in enumerate(group)]
        missing = {p: n for p, n in (demand | want).items() if model.has_profile(p)}
        for reshape in _ENGINE.reshapes(model, idle, missing, recent):  # lazily: the first acceptable one is taken
            c = group[reshape.gpu]
            if any(Counter(reshape.layout)[p] < n for p, n in want.items()):
                continue
            if not all(allowed(c.node, p) for p in reshape.layout):
                continue
            plan = plan_reconfiguration(model, c.current, (), reshape.layout)
            if plan is None:
                continue
            why = f"reshape GPU {c.index} of {c.node} to {'+'.join(reshape.layout)} (layout engine) for {', '.join(sorted(needed))}"
            return LayoutChange(c.node, c.index, "reshape", plan.target, plan.destroy, plan.create, why)
    return None

"""Reshaping a GPU without touching in-use instances: minimal destroy/create plans.

A plan keeps as many current instances as possible (always every in-use one, at
its placement), destroys the rest and creates the missing target instances at
explicit placements. Keeping the most instances minimises both destroys and
creates, since ``destroys = |current| - |kept|`` and ``creates = |target| - |kept|``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from mig.errors import MigError
from mig.geometry import fits_with, maximal_layouts, validate_layout
from mig.model import GpuModel, PlacedInstance


@dataclass(frozen=True)
class ReconfigurationPlan:
    """Steps from the current layout to a target layout, in execution order."""

    keep: tuple[PlacedInstance, ...]
    destroy: tuple[PlacedInstance, ...]
    create: tuple[PlacedInstance, ...]

    @property
    def steps(self) -> int:
        return len(self.destroy) + len(self.create)

    @property
    def target(self) -> tuple[PlacedInstance, ...]:
        return tuple(sorted((*self.keep, *self.create)))

    def is_noop(self) -> bool:
        return self.steps == 0


def _check_inputs(model: GpuModel, current: Sequence[PlacedInstance], in_use: Collection[PlacedInstance]) -> None:
    problem = validate_layout(model, current)
    if problem is not None:
        raise MigError(f"current layout is not valid on {model.product}: {problem}")
    missing = [str(i) for i in in_use if i not in current]
    if missing:
        raise MigError(f"in-use instances not in the current layout: {', '.join(missing)}")


def plan_reconfiguration(
    model: GpuModel,
    current: Sequence[PlacedInstance],
    in_use: Collection[PlacedInstance],
    target: Iterable[str],
) -> ReconfigurationPlan | None:
    """The minimal plan from ``current`` to the multiset ``target``, or None if unreachable.

    Unreachable means: no way to place ``target`` that keeps every in-use instance
    where it is (the in-use instances' profiles must be part of ``target``).
    """
    _check_inputs(model, current, in_use)
    wanted = Counter(target)
    for name in wanted:
        model.profile(name)
    pinned = sorted(set(in_use))
    optional = sorted(i for i in current if i not in set(in_use))
    for extra in range(len(optional), -1, -1):
        for kept_optional in combinations(optional, extra):
            keep = (*pinned, *kept_optional)
            kept_names = Counter(i.profile for i in keep)
            if kept_names - wanted:
                continue  # keeps something the target does not contain
            missing = sorted((wanted - kept_names).elements())
            placed = fits_with(model, keep, missing)
            if placed is None:
                continue
            created = tuple(i for i in placed if i not in keep)
            destroy = tuple(sorted(i for i in current if i not in keep))
            # NVML creates in any order once placements are explicit; largest first reads best.
            create = tuple(sorted(created, key=lambda i: (-i.placement.size, i.placement.start)))
            return ReconfigurationPlan(tuple(sorted(keep)), destroy, create)
    return None


def reachable_layouts(
    model: GpuModel, current: Sequence[PlacedInstance], in_use: Collection[PlacedInstance]
) -> tuple[tuple[tuple[str, ...], ReconfigurationPlan], ...]:
    """Every maximal layout reachable without touching ``in_use``, with its minimal plan.

    Sorted by fewest steps, then by layout, so the cheapest reshapes come first.
    """
    _check_inputs(model, current, in_use)
    results = []
    for layout in maximal_layouts(model):
        plan = plan_reconfiguration(model, current, in_use, layout)
        if plan is not None:
            results.append((layout, plan))
    return tuple(sorted(results, key=lambda item: (item[1].steps, item[0])))

"""Whether to start reshaping one GPU to its spec now: start, wait or refuse (pure).

Given which instances are in use and which have not been idle long enough (the
agent's clocks, ``node.base.idle_tracking``), :func:`decide_start` finds a plan that
pins them (``mig.reach``), or says what it waits for or why the spec cannot be
reached. Whether policy lets a reshape start at all now (frozen, outside its
window) is not decided here: the layouts driver asks the gate
(``sharing.rules.reshape_gate``, through ``node.base.reshape_rules``) and
``node.mig_loop`` reports ``blocked`` in place of a start or a wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mig.geometry import fits, validate_layout
from mig.model import GpuModel, PlacedInstance
from mig.reach import ReconfigurationPlan, plan_reconfiguration
from node.base.journal import format_instance

StartKind = Literal["unchanged", "start", "wait", "refuse", "blocked"]
"""``blocked``: a reshape could start but policy forbids it now (frozen, outside its window)."""


@dataclass(frozen=True)
class StartDecision:
    kind: StartKind
    reason: str = ""
    plan: ReconfigurationPlan | None = None


def decide_start(
    model: GpuModel,
    current: Sequence[PlacedInstance],
    busy: frozenset[PlacedInstance],
    recently_busy: frozenset[PlacedInstance],
    desired: Sequence[str],
    idle_seconds: float,
) -> StartDecision:
    """Start, wait or refuse a reshape of one GPU from ``current`` to the profile multiset ``desired``.

    ``busy``: instances with a process or pod now. ``recently_busy``: busy or idle for
    less than the idle time (a superset of ``busy``). Both are pinned in the plan.
    """
    if Counter(i.profile for i in current) == Counter(desired):
        return StartDecision("unchanged")
    unknown = sorted({name for name in desired if not model.has_profile(name)})
    if unknown:
        return StartDecision(
            "refuse", f"unknown MIG profile(s) {', '.join(unknown)} for {model.product}; "
            f"valid: {', '.join(model.profile_names)}",
        )
    if fits(model, desired) is None:
        return StartDecision("refuse", f"layout [{', '.join(desired)}] does not fit on one {model.product}")
    plan = plan_reconfiguration(model, current, recently_busy, desired)
    if plan is not None:
        return StartDecision("start", "", plan)
    if plan_reconfiguration(model, current, busy, desired) is not None:
        waiting = sorted(format_instance(i) for i in recently_busy - busy)
        return StartDecision(
            "wait", f"waiting until {', '.join(waiting)} have been idle for {idle_seconds:g}s",
        )
    if busy:
        return StartDecision(
            "wait", "layout needs instance(s) in use to change: "
            + ", ".join(sorted(format_instance(i) for i in busy)) + "; waiting until they are idle",
        )
    return StartDecision("refuse", f"no plan reaches [{', '.join(desired)}] on {model.product}")


def decide_start_pinned(
    model: GpuModel,
    current: Sequence[PlacedInstance],
    busy: frozenset[PlacedInstance],
    recently_busy: frozenset[PlacedInstance],
    target: Sequence[PlacedInstance],
    idle_seconds: float,
) -> StartDecision:
    """Like ``decide_start`` for a spec that pins every instance's placement."""
    if frozenset(current) == frozenset(target):
        return StartDecision("unchanged")
    unknown = sorted({i.profile for i in target if not model.has_profile(i.profile)})
    if unknown:
        return StartDecision(
            "refuse", f"unknown MIG profile(s) {', '.join(unknown)} for {model.product}; "
            f"valid: {', '.join(model.profile_names)}",
        )
    problem = validate_layout(model, target)
    if problem is not None:
        return StartDecision("refuse", f"pinned layout is not valid on {model.product}: {problem}")
    destroy = tuple(sorted(set(current) - set(target)))
    create = tuple(sorted(set(target) - set(current), key=lambda i: (-i.placement.size, i.placement.start)))
    blocked = set(destroy) & busy
    if blocked:
        return StartDecision("wait", "pinned layout needs instance(s) in use to change: "
                             + ", ".join(sorted(map(format_instance, blocked))) + "; waiting until they are idle")
    recent = set(destroy) & recently_busy
    if recent:
        return StartDecision("wait", f"waiting until {', '.join(sorted(map(format_instance, recent)))} "
                             f"have been idle for {idle_seconds:g}s")
    keep = tuple(sorted(set(current) & set(target)))
    return StartDecision("start", "", ReconfigurationPlan(keep, destroy, create))

"""The order of preemption: which victim on a node goes first, and which candidate plan wins.

One home for the engine's preferences (issue 36), so that the simulator's engine
(:func:`sharing.packing.preemption.engine_preemption`) and the live controller's ledger path
(``controller.planning.preemption``, for the MIG pods and shared pods of several containers the
engine does not model) rank alike:

* among the pods of one node, the lowest priority goes first, then the least GPU milli, then the
  key (:func:`victim_key`); a victim the preemptor can do without is spared in the reverse
  order of importance, highest priority and most milli first (:func:`reprieve_key`);
* among candidate plans, the fewest victims win, then the lowest highest-victim priority, then
  the least GPU milli preempted, then a plan the preemptor fills exactly (:func:`plan_key`);
  the caller breaks what is still tied (the engine by fragmentation, the controller by the
  snapshot's order).
"""

from __future__ import annotations

from collections.abc import Sequence

from sharing.api.priority import INT32_MIN

NO_VICTIM = INT32_MIN - 1
"""The highest-victim priority of a plan without victims: below every pod's."""


def victim_key(priority: int, milli: int, key: str) -> tuple[int, int, str]:
    """Sort key of a candidate victim on a node: lowest priority, then least GPU milli, first."""
    return priority, milli, key


def reprieve_key(priority: int, milli: int, key: str) -> tuple[int, int, str]:
    """Sort key of a chosen victim to spare if the preemptor can do without it: most important first."""
    return -priority, -milli, key


def plan_key(priorities: Sequence[int], milli: int, exact: bool = True) -> tuple[int, int, int, int]:
    """Sort key of a candidate plan with victims of ``priorities`` that preempts ``milli`` GPU milli:
    fewest victims, lowest highest-victim priority, least milli, then an exact fill."""
    return len(priorities), max(priorities, default=NO_VICTIM), milli, 0 if exact else 1


__all__ = ["NO_VICTIM", "plan_key", "reprieve_key", "victim_key"]

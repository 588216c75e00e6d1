"""The right-sizer's updater (``Recreate`` mode), pure: which pods to move to their recommended size.

A pod is **far** from its recommendation (:func:`is_far`) when its memory limit is below the
recommended memory by more than ``memory_risk_slack`` (it risks an OOM), above it by more than
``memory_slack`` (it holds memory others could use), or when its compute differs from the
recommended by more than ``compute_slack`` either way. :func:`choose_moves` picks, among far pods, at most
``max_moves_per_interval`` per workload per ``interval_s`` (counting moves already made in the
interval), those at risk first, then those that free the most memory; a pod OOM-killed since it
was seated moves at once, outside that budget (:func:`choose_moves`).

**A one-replica workload's move is make-before-break.** The simulator seats the replacement at its
new size before the old pod goes, and a move that finds no room for the replacement does not
happen. Live, the controller does the same for a Deployment's only replica by a rollout whose
strategy surges (``controller.planning.right_size_rollouts``: the new pod comes up first); a
workload of several replicas loses one pod to the Eviction API (PodDisruptionBudgets honoured,
never its last ready replica) and its owner re-creates it; a lone pod of any other owner (a
StatefulSet of one, a bare pod) is never moved. This module only chooses; it holds no clock and
no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharing.usage.recommender import WorkloadKey
from sharing.usage.sizing import Size


@dataclass(frozen=True)
class UpdaterSettings:
    """How far is far, and how fast the updater may move a workload's pods."""

    memory_slack: float = 0.25
    """A limit up to 25 % above the recommendation stays: moving costs a restart."""
    memory_risk_slack: float = 0.1
    """A limit up to this fraction below the recommendation stays too: the recommendation's own
    margin still stands between the observed peak and the limit, and a peak that passes the limit
    is an OOM, which raises the recommendation past the slack at once."""
    compute_slack: float = 1.0
    """Compute within a factor of two either way stays: memory, not compute, binds these GPUs."""
    max_moves_per_interval: int = 1
    """Moves per workload per interval (VPA's updater evicts a bounded share of a workload at once)."""
    interval_s: float = 3600.0

    def __post_init__(self) -> None:
        slacks = (self.memory_slack, self.memory_risk_slack, self.compute_slack)
        if min(slacks) < 0 or self.max_moves_per_interval < 0 or self.interval_s <= 0:
            raise ValueError(f"updater settings must not be negative (interval positive), got {self}")


@dataclass(frozen=True)
class Candidate:
    """A running pod the updater may move: its workload, its size now and the recommended one."""

    pod: str
    workload: WorkloadKey
    current: Size
    target: Size
    oom: bool = False
    """Its use passed its memory limit since it was seated: it was OOM-killed and restarts anyway."""


def at_risk(current: Size, target: Size, settings: UpdaterSettings) -> bool:
    """Its memory limit is below the recommendation by more than ``memory_risk_slack``: the next
    peak may be an OOM."""
    return current.memory_bytes * (1 + settings.memory_risk_slack) < target.memory_bytes


def is_far(current: Size, target: Size, settings: UpdaterSettings) -> bool:
    """Whether a pod sized ``current`` is far from ``target`` (module docstring)."""
    if at_risk(current, target, settings):
        return True
    if current.memory_bytes > target.memory_bytes * (1 + settings.memory_slack):
        return True
    ratio = current.milli / target.milli
    return ratio > 1 + settings.compute_slack or ratio < 1 / (1 + settings.compute_slack)


def choose_moves(candidates: Sequence[Candidate], moved_this_interval: Mapping[WorkloadKey, int],
                 settings: UpdaterSettings) -> tuple[Candidate, ...]:
    """The far candidates to move now, in the order to try them (module docstring). A pod that was
    OOM-killed (``oom``) and whose recommendation is now above its limit moves first and outside
    the budget: it is restarting already, and restarting it at the limit that killed it would only
    kill it again (it still counts against the workload's other moves)."""
    killed = [c for c in candidates if c.oom and c.target.memory_bytes > c.current.memory_bytes]
    if killed:
        rest = [c for c in candidates if c not in killed]
        spent = dict(moved_this_interval)
        for c in killed:
            spent[c.workload] = spent.get(c.workload, 0) + 1
        return tuple(sorted(killed, key=lambda c: c.pod)) + choose_moves(rest, spent, settings)
    far = [c for c in candidates if is_far(c.current, c.target, settings)]
    far.sort(key=lambda c: (not at_risk(c.current, c.target, settings), c.target.memory_bytes - c.current.memory_bytes,
                            c.pod))
    left = dict(moved_this_interval)
    chosen = []
    for candidate in far:
        used = left.get(candidate.workload, 0)
        if used < settings.max_moves_per_interval:
            left[candidate.workload] = used + 1
            chosen.append(candidate)
    return tuple(chosen)

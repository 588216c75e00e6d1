"""Since when each MIG instance of this node has been idle: the agent's idle clocks.

An instance may be touched only after it has been idle (no process, no pod
assigned) for the policy's idle time (``reshaping.idleSeconds``; whether that is
long enough is ``sharing.rules.reshape_gate.idle_long_enough``, the reading the
controller's planner uses for whole GPUs). ``IdleTracker`` remembers since when
each instance has been idle, using the injected clock. It is deliberately *not*
persisted: after an agent restart every instance counts as idle only from the
restart on, so the agent waits one more idle period instead of trusting a stale
record. That costs at most one idle period of delay and never safety.
"""

from __future__ import annotations

from collections.abc import Iterable

from mig.model import PlacedInstance
from sharing.rules.reshape_gate import idle_long_enough


class IdleTracker:
    """Since when each (GPU, instance) has been idle."""

    def __init__(self) -> None:
        self._since: dict[tuple[str, PlacedInstance], float] = {}

    def observe(self, gpu_uuid: str, instances: Iterable[PlacedInstance], busy: Iterable[PlacedInstance], now: float) -> None:
        busy_set = set(busy)
        present = set(instances)
        for key in [k for k in self._since if k[0] == gpu_uuid and k[1] not in present]:
            del self._since[key]
        for instance in present:
            key = (gpu_uuid, instance)
            if instance in busy_set:
                self._since.pop(key, None)
            else:
                self._since.setdefault(key, now)

    def idle_for(self, gpu_uuid: str, instance: PlacedInstance, now: float) -> float | None:
        """Seconds ``instance`` has been idle at ``now``; None: busy, or not seen yet."""
        since = self._since.get((gpu_uuid, instance))
        return None if since is None else now - since

    def not_idle_long_enough(
        self, gpu_uuid: str, instances: Iterable[PlacedInstance], now: float, idle_seconds: float
    ) -> frozenset[PlacedInstance]:
        """Instances that are busy or have been idle for less than ``idle_seconds``."""
        return frozenset(i for i in instances if not idle_long_enough(self.idle_for(gpu_uuid, i, now), idle_seconds))

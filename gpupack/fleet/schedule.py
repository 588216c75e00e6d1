"""When each agent of a fleet steps next: a heap of due times, worked by a small fixed pool of threads.

``gpupack agent fleet`` runs one ``node.agent.Agent`` per node in one process. Each
agent's :meth:`~node.agent.Agent.step` says how long to wait before the next and
whether a change may end the wait early (:class:`~node.agent.Pause`), as it does for
``gpupack agent run``; this schedule keeps those promises for every node at once:

- a node's agent steps at most once at a time (a node is never handed to two workers);
- :meth:`FleetSchedule.wake` (something the node's agent reads changed) makes a node
  waiting for a change due now; several wake-ups before it steps make one step, and one
  that arrives while it steps makes it step again right after (the step may have read
  the state before the change);
- a node backing off after a failure, or pausing briefly during a reshape, is not woken:
  its agent chose that pause;
- the workers sleep until the earliest due time or a wake-up.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from node.agent import Pause

Step = Callable[[], Pause]
Runner = Callable[[str, Step], Pause]
"""Runs one node's step (the fleet wraps it: counting, never raising) and returns its pause."""


@dataclass
class _Slot:
    step: Step
    due: float
    on_change: bool = True
    running: bool = False
    woken: bool = False
    removed: bool = False


class FleetSchedule:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._slots: dict[str, _Slot] = {}
        self._seq = itertools.count()
        self._stopped = False
        self.steps = 0
        """Steps run so far."""
        self.lag_seconds = 0.0
        """Seconds steps started after they were due, summed: it grows faster than ``steps`` when the workers
        cannot keep up (too few for the writes' round trips, or the CPU is short)."""

    def __len__(self) -> int:
        with self._cond:
            return len(self._slots)

    def __contains__(self, name: object) -> bool:
        with self._cond:
            return name in self._slots

    def add(self, name: str, step: Step, delay_s: float = 0.0) -> None:
        """Schedule ``name``'s first step ``delay_s`` from now (replacing a node of that name)."""
        with self._cond:
            old = self._slots.get(name)
            if old is not None:
                old.removed = True
            slot = _Slot(step, self.clock() + max(0.0, delay_s))
            self._slots[name] = slot
            self._push(name, slot)

    def remove(self, name: str) -> None:
        """No more steps for ``name`` (one running now finishes)."""
        with self._cond:
            slot = self._slots.pop(name, None)
            if slot is not None:
                slot.removed = True

    def wake(self, name: str | None) -> None:
        """Something ``name``'s agent reads changed (None: every node's)."""
        with self._cond:
            for key in list(self._slots) if name is None else [name]:
                slot = self._slots.get(key)
                if slot is None:
                    continue
                if slot.running:
                    slot.woken = True
                elif slot.on_change and slot.due > self.clock():
                    slot.due = self.clock()
                    self._push(key, slot)

    def next_due(self) -> float | None:
        with self._cond:
            self._drop_stale()
            return self._heap[0][0] if self._heap else None

    def due_of(self, name: str) -> float | None:
        with self._cond:
            slot = self._slots.get(name)
            return None if slot is None or slot.running else slot.due

    # ------------------------------------------------------------------ working
    def take(self) -> tuple[str, Step] | None:
        """The node due first, if it is due now, marked running; else None."""
        with self._cond:
            return self._take()

    def done(self, name: str, pause: Pause) -> None:
        """``name``'s step ended asking for ``pause``: schedule its next."""
        with self._cond:
            self.steps += 1
            slot = self._slots.get(name)
            if slot is None or not slot.running:
                return
            slot.running = False
            slot.on_change = pause.on_change
            slot.due = self.clock() + (0.0 if slot.woken and pause.on_change else max(0.0, pause.seconds))
            slot.woken = False
            self._push(name, slot)
            self._cond.notify()

    def run_due(self, run: Runner) -> int:
        """Run every step due now on this thread (tests, and ``--once``); how many ran."""
        ran = 0
        while (item := self.take()) is not None:
            name, step = item
            self.done(name, run(name, step))
            ran += 1
        return ran

    def work(self, run: Runner) -> None:
        """A worker's loop: take the node due first, run its step, schedule the next; until :meth:`stop`."""
        while True:
            with self._cond:
                item = self._take()
                while item is None:
                    if self._stopped:
                        return
                    self._drop_stale()
                    wait = 1.0 if not self._heap else min(1.0, max(0.0, self._heap[0][0] - self.clock()))
                    self._cond.wait(wait)
                    item = self._take()
            name, step = item
            self.done(name, run(name, step))

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ heap
    def _push(self, name: str, slot: _Slot) -> None:
        heapq.heappush(self._heap, (slot.due, next(self._seq), name))
        self._cond.notify()

    def _valid(self, entry: tuple[float, int, str]) -> bool:
        slot = self._slots.get(entry[2])
        return slot is not None and not slot.running and slot.due == entry[0]

    def _drop_stale(self) -> None:
        while self._heap and not self._valid(self._heap[0]):
            heapq.heappop(self._heap)

    def _take(self) -> tuple[str, Step] | None:
        self._drop_stale()
        if self._stopped or not self._heap or self._heap[0][0] > self.clock():
            return None
        due, _seq, name = heapq.heappop(self._heap)
        self.lag_seconds += max(0.0, self.clock() - due)
        slot = self._slots[name]
        slot.running = True
        return name, slot.step

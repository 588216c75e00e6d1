"""What a shares run logs after every arrival, and the figures it reports from that log.

The product model (``sharing.simulator.product``) and the DRA model
(``sharing.simulator.dra``) keep one log: after every attempt, placed or
failed, the GPU milli arrived so far (failed pods included), allocated so far
and occupied so far (what the placed pods' shares hold, rounding included),
and the decision's time. Their allocation and occupancy per level, median
decision time and final allocation come from it by one reading
(``sharing.simulator.metrics.alloc_by_level``, ``PROTOCOL.md`` §5).
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from sharing.packing.specs import GPU_MILLI, PodSpec
from sharing.simulator.metrics import alloc_by_level


class RunFigures(TypedDict):
    """What a shares run reports from its log, under its result's field names."""

    failed_pods: int
    alloc_at: dict[int, float | None]
    """Allocation percent per arrived-demand level."""
    occupied_at: dict[int, float | None]
    """Occupied percent (the shares' rounding included) per arrived-demand level."""
    decision_us_median: float
    final_alloc_percent: float
    """Allocated milli after the last arrival, in percent of the GPUs' capacity."""


class ArrivalTally:
    """One run's log, one row per arrival (module docstring)."""

    def __init__(self, count: int) -> None:
        self.arrived = np.zeros(count, dtype=np.int64)
        self.used = np.zeros(count, dtype=np.int64)
        self.occupied = np.zeros(count, dtype=np.int64)
        self.times = np.zeros(count, dtype=np.int64)
        self.demand = self.allocated = self.failed = 0
        # Whole milli under the DRA model; a replica's 1000/r is fractional under the product model,
        # so the sum is kept exact and only its log row is rounded.
        self.reserved: float = 0

    def record(self, i: int, pod: PodSpec, taken: float | None, elapsed_ns: int) -> None:
        """Log arrival ``i``: ``taken`` is the milli its placement occupies, None when it failed."""
        self.times[i] = elapsed_ns
        self.demand += pod.gpu_total_milli
        if taken is None:
            self.failed += 1
        else:
            self.allocated += pod.gpu_total_milli
            self.reserved += taken
        self.arrived[i], self.used[i], self.occupied[i] = self.demand, self.allocated, round(self.reserved)

    def withdraw(self, milli: int, reserved: float) -> None:
        """A placed pod left (preempted): its ``milli`` is no longer allocated nor its ``reserved``
        share held, and it counts as failed. Logged with the next :meth:`record`."""
        self.allocated -= milli
        self.reserved -= reserved
        self.failed += 1

    def figures(self, total_gpus: int) -> RunFigures:
        """The run's figures over ``total_gpus`` GPUs (module docstring)."""
        return RunFigures(
            failed_pods=self.failed,
            alloc_at=alloc_by_level(self.arrived, self.used, total_gpus),
            occupied_at=alloc_by_level(self.arrived, self.occupied, total_gpus),
            decision_us_median=float(np.median(self.times)) / 1000.0,
            final_alloc_percent=100.0 * self.allocated / (total_gpus * GPU_MILLI),
        )

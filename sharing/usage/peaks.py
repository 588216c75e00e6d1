"""A signal's peak over a sliding window, kept as one maximum per interval (GPU memory's history).

Memory is sized from its peak, not from a percentile: a container whose memory passes its limit
is killed (an OOM), so the rare high sample is the one that matters. Autopilot keeps the peak of
each aggregation interval for a window and takes their maximum, so a peak is forgotten once the
window has passed it (a model unloaded for good stops costing memory) and no sample is stored.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class PeakOptions:
    """Intervals of ``interval_s`` seconds, remembered for ``window_s``."""

    interval_s: float = 3600.0
    window_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.interval_s <= self.window_s:
            raise ValueError(f"peak intervals must be positive and fit the window, got {self}")


class WindowedPeak:
    """The largest value seen in the last ``window_s`` (to the interval); mutable like the histogram."""

    def __init__(self, options: PeakOptions = PeakOptions()) -> None:
        self.options = options
        self.intervals: deque[tuple[int, float]] = deque()  # (interval index, its maximum), oldest first

    def add(self, value: float, time_s: float) -> None:
        index = int(time_s // self.options.interval_s)
        if self.intervals and self.intervals[-1][0] == index:
            self.intervals[-1] = (index, max(self.intervals[-1][1], value))
        else:
            self.intervals.append((index, value))
        self._forget(index)

    def _forget(self, index: int) -> None:
        keep = int(self.options.window_s // self.options.interval_s)
        while self.intervals and self.intervals[0][0] <= index - keep:
            self.intervals.popleft()

    def peak(self) -> float:
        """The window's peak; 0 when nothing was seen."""
        return max((value for _, value in self.intervals), default=0.0)

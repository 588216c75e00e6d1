"""The clock of a time-scaled usage replay: trace seconds elapse ``scale`` times faster than the wall's.

A replay plays a usage trace ``scale`` times faster than it was recorded (the simulated GPUs'
``--usage-time-scale``, ``sharing.usage.playback``). The right-sizer's rules are written in the
trace's time: an hour of history before a first recommendation, a day's half-life, hourly memory
peaks, a margin that settles over six hours (``sharing.usage.recommender``). Rather than scale each
of those settings, the parts of a replay that time the use (the agents' histories, the controller's
recommender) read this clock, so every rule keeps its meaning in trace time. At ``start_s`` (wall
time, Unix seconds: when the trace's first step plays) both clocks read the same; after it trace
time runs ``scale`` times faster. Periods of the loops themselves (how often an agent publishes, a
controller recommends) stay in wall time; a replay passes them scaled (docs/usage.md, "Live replay").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def trace_time(wall_s: float, start_s: float, scale: float) -> float:
    """The trace-clock reading at wall time ``wall_s``."""
    return start_s + (wall_s - start_s) * scale


def trace_clock(start_s: float, scale: float, wall: Callable[[], float] = time.time) -> Callable[[], float]:
    """A clock reading trace time (module docstring); ValueError for a scale that is not a positive
    number or a start that is not finite."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"usage time scale must be a number above 0, got {scale}")
    if not math.isfinite(start_s):
        raise ValueError(f"usage clock start must be a finite time, got {start_s}")
    if scale == 1.0:
        return wall
    return lambda: trace_time(wall(), start_s, scale)

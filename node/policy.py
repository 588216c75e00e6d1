"""The SharingPolicy rules the agent enforces itself: idle time, frozen layouts, reshaping windows.

The controller plans within the policy, but the agent is the last line before
NVML, so it checks again (a hand-edited ``GPUNode`` spec must not reshape a GPU
outside its window either). Policies select nodes by label; when several match,
the strictest wins: the longest idle time, frozen if any says ``maxConcurrent: 0``,
and a moment is inside the windows only if every matching policy allows it.
Active reconfigurations are always finished: a window closing mid-way must not
leave a GPU half-reshaped.

Windows are UTC ``HH:MM`` ranges on the listed days; ``end < start`` crosses
midnight and belongs to the day it starts on; ``start == end`` is the whole day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sharing.crd import WEEKDAYS, ReshapingWindow, read_policies
from sharing.windows import minutes_of, window_contains


@dataclass(frozen=True)
class ReshapeRules:
    idle_seconds: float
    frozen_by: tuple[str, ...] = ()
    windows: tuple[tuple[str, tuple[ReshapingWindow, ...]], ...] = ()
    """(policy name, its windows) for each matching policy that has windows."""
    sources: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    def may_start(self, now: float) -> tuple[bool, str]:
        """Whether a new reshape may start at ``now`` (epoch seconds), and if not, why."""
        if self.frozen_by:
            return False, f"layouts frozen by SharingPolicy {', '.join(self.frozen_by)} (reshaping.maxConcurrent: 0)"
        for name, windows in self.windows:
            if not any(_inside(w, now) for w in windows):
                spans = ", ".join(f"{w.start}-{w.end} {'/'.join(w.days)}" for w in windows)
                return False, f"outside the reshaping windows of SharingPolicy {name} ({spans} UTC)"
        return True, ""


def _inside(window: ReshapingWindow, now: float) -> bool:
    """The one reading of a window (``sharing.windows``), shared with the controller."""
    moment = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    days = {WEEKDAYS.index(d) for d in window.days}
    return window_contains(minutes_of(window.start), minutes_of(window.end), days, moment)


def reshape_rules(node_labels: Mapping[str, str], policies: Iterable[Mapping[str, Any]], default_idle: float) -> ReshapeRules:
    idle, frozen, windows, sources, problems = None, [], [], [], []
    for policy in read_policies(policies):
        if policy.spec is None:
            problems.append(f"SharingPolicy {policy.name} ignored: {policy.problem}")
            continue
        if not policy.spec.node_selector.matches(node_labels):
            continue
        name = policy.name
        sources.append(name)
        reshaping = policy.spec.reshaping
        idle = reshaping.idle_seconds if idle is None else max(idle, reshaping.idle_seconds)
        if reshaping.max_concurrent == 0:
            frozen.append(name)
        if reshaping.windows:
            windows.append((name, tuple(reshaping.windows)))
    return ReshapeRules(float(default_idle if idle is None else idle), tuple(frozen), tuple(windows),
                        tuple(sources), tuple(problems))

"""When a SharingPolicy reshaping window is open: one reading for the controller and the agent.

A window is a UTC ``HH:MM`` range on some days of the week (0 = Monday):

- ``start < end``: open from ``start`` (inclusive) to ``end`` (exclusive) on each listed day;
- ``end < start``: crosses midnight; the part after midnight belongs to the day it started on;
- ``start == end``: open the whole of each listed day (a zero-length window would be a
  window that can never be used, which nobody writes on purpose).

:class:`Window` is the parsed form that the merged node policy (``sharing.rules.node_policy``)
holds for the controller and the node agent alike, so they can only disagree if they read
different policies.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sharing.api.crd import WEEKDAYS


def minutes_of(hhmm: str) -> int:
    """Minutes after midnight of an ``HH:MM`` string (the API validates the pattern)."""
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def window_contains(start_minute: int, end_minute: int, days: Collection[int], moment: datetime) -> bool:
    """Whether ``moment`` (UTC) is inside the window; ``days`` holds weekday numbers (0 = Monday)."""
    minute = moment.hour * 60 + moment.minute
    today, yesterday = moment.weekday(), (moment.weekday() - 1) % 7
    if start_minute == end_minute:
        return today in days
    if start_minute < end_minute:
        return today in days and start_minute <= minute < end_minute
    return (today in days and minute >= start_minute) or (yesterday in days and minute < end_minute)


@dataclass(frozen=True)
class Window:
    """A UTC window in minutes of the day, on ``days`` (0 = Monday); the rules are the module's."""

    start_minute: int
    end_minute: int
    days: frozenset[int] = frozenset(range(7))

    def contains(self, moment: datetime) -> bool:
        return window_contains(self.start_minute, self.end_minute, self.days, moment)

    def describe(self) -> str:
        """``HH:MM-HH:MM Mon/Tue``, as a SharingPolicy writes it."""
        days = "/".join(WEEKDAYS[d] for d in sorted(self.days))
        return f"{_hhmm(self.start_minute)}-{_hhmm(self.end_minute)} {days}"


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"

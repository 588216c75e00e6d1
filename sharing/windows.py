"""When a SharingPolicy reshaping window is open: one reading for the controller and the agent.

A window is a UTC ``HH:MM`` range on some days of the week (0 = Monday):

- ``start < end``: open from ``start`` (inclusive) to ``end`` (exclusive) on each listed day;
- ``end < start``: crosses midnight; the part after midnight belongs to the day it started on;
- ``start == end``: open the whole of each listed day (a zero-length window would be a
  window that can never be used, which nobody writes on purpose).

The controller (``controller.view.Window``) and the node agent (``node.policy``) both call
:func:`window_contains`, so they can only disagree if they read different policies.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime


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

"""Polling with a deadline, for end-to-end tests against the real control plane.

Every wait names what it waited for and fails with the last value it saw, so a
timed-out test says what never happened instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(
    what: str,
    probe: Callable[[], Any],
    timeout_s: float = 60.0,
    *,
    interval_s: float = 0.2,
    tick: Callable[[], None] | None = None,
) -> Any:
    """Call ``probe`` until it returns something truthy and return that; fail after ``timeout_s``.

    ``tick`` runs before each probe (a test that drives a loop by hand steps it there).
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")

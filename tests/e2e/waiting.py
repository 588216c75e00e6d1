"""Polling with a deadline, for end-to-end tests against the real control plane.

Every wait names what it waited for and fails with the last value it saw, so a
timed-out test says what never happened instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def repeating(step: Callable[[], object], every_s: float) -> Iterator[None]:
    """``step`` run at once and then every ``every_s`` seconds in a thread, until the block ends (a
    controller's resync loop, say, while the test waits for what it leads to)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            step()
            stop.wait(every_s)

    runner = threading.Thread(target=loop, daemon=True)
    runner.start()
    try:
        yield
    finally:
        stop.set()
        runner.join(timeout=30)

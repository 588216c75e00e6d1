"""The replica feedback loop and right-sizing: table tests plus properties (bounds, hysteresis)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.planning.feedback import FeedbackSettings, GpuLoad, decide_replicas, right_size

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("current", "loads", "expected"),
    [
        pytest.param(4, [GpuLoad(40, 4), GpuLoad(40, 4)], 8, id="headroom-raises-to-ideal"),
        pytest.param(4, [GpuLoad(99, 4), GpuLoad(90, 4)], 3, id="saturation-lowers"),
        pytest.param(4, [GpuLoad(78, 4), GpuLoad(82, 4)], 4, id="inside-the-band"),
        pytest.param(4, [GpuLoad(20, 2), GpuLoad(20, 2)], 4, id="demand-not-replicas-limits"),
        pytest.param(4, [GpuLoad(10, 1)], 4, id="too-few-pods-measured"),
        pytest.param(2, [GpuLoad(10, 2), GpuLoad(10, 2)], 4, id="step-at-most-doubles"),
        pytest.param(8, [GpuLoad(100, 8), GpuLoad(100, 8)], 6, id="saturation-lowers-to-ideal"),
        pytest.param(12, [GpuLoad(50, 2)], 8, id="clamped-to-max"),
    ],
)
def test_decisions(current: int, loads: list[GpuLoad], expected: int) -> None:
    decision = decide_replicas(current, loads, minimum=1, maximum=8, target=80)
    assert decision.proposed == expected, decision.reason


def test_step_at_most_halves() -> None:
    # 12.5 % per pod against a 20 % target: ideal 1, but one decision only halves.
    assert decide_replicas(8, [GpuLoad(100, 8)], minimum=1, maximum=8, target=20).proposed == 4


def test_cooldown_holds_the_count() -> None:
    loads = [GpuLoad(20, 4), GpuLoad(20, 4)]
    held = decide_replicas(4, loads, minimum=1, maximum=8, target=80, last_change=NOW - timedelta(seconds=10), now=NOW)
    moved = decide_replicas(4, loads, minimum=1, maximum=8, target=80, last_change=NOW - timedelta(hours=1), now=NOW)
    assert not held.changed and moved.changed


loads_strategy = st.lists(
    st.builds(GpuLoad, st.floats(0, 100, allow_nan=False), st.integers(0, 16)), min_size=1, max_size=8
)


@settings(max_examples=150, deadline=None)
@given(current=st.integers(1, 16), lo=st.integers(1, 8), span=st.integers(0, 8), target=st.integers(20, 95), loads=loads_strategy)
def test_always_within_bounds_and_direction_matches_the_signal(
    current: int, lo: int, span: int, target: int, loads: list[GpuLoad]
) -> None:
    hi = lo + span
    d = decide_replicas(current, loads, minimum=lo, maximum=hi, target=target)
    assert lo <= d.proposed <= hi
    if lo <= current <= hi and d.proposed > current:
        assert max(g.busy_percent for g in loads if g.pods) < target  # never raise on a hot node
    if lo <= current <= hi and d.proposed < current:
        assert max(g.busy_percent for g in loads if g.pods) > target  # never lower on a cool node


@settings(max_examples=100, deadline=None)
@given(current=st.integers(1, 8), target=st.integers(30, 90), loads=loads_strategy)
def test_decision_is_stable_once_applied(current: int, target: int, loads: list[GpuLoad]) -> None:
    """Hysteresis: the same measurement never flips the count back on the next decision."""
    first = decide_replicas(current, loads, minimum=1, maximum=8, target=target, settings=FeedbackSettings())
    second = decide_replicas(first.proposed, loads, minimum=1, maximum=8, target=target)
    assert not (first.proposed > current and second.proposed < first.proposed)
    assert not (first.proposed < current and second.proposed > first.proposed)


@pytest.mark.parametrize(
    ("requested", "used", "expected"),
    [
        pytest.param(500, [50, 80, 60], 150, id="uses-a-fifth"),
        pytest.param(500, [300, 280], None, id="uses-most"),
        pytest.param(500, [], None, id="nothing-measured"),
        pytest.param(1000, [1, 2], 50, id="floor-is-one-quantum"),
    ],
)
def test_right_size(requested: int, used: list[float], expected: int | None) -> None:
    rec = right_size(requested, used)
    assert (rec.recommended_milli if rec else None) == expected
    if rec:
        assert rec.recommended_milli >= max(used) and rec.recommended_milli < requested

"""The clock of a time-scaled usage replay (``sharing.usage.trace_clock``), and the agent and controller
settings that run on it."""

from __future__ import annotations

import math

import pytest

from controller.settings import ControllerSettings
from node.base.settings import AgentSettings
from sharing.usage.trace_clock import trace_clock, trace_time


def test_trace_time_runs_scale_times_faster_from_the_start() -> None:
    assert trace_time(1000.0, 1000.0, 60.0) == 1000.0
    assert trace_time(1002.5, 1000.0, 60.0) == 1150.0
    wall = iter([1000.0, 1001.0])
    clock = trace_clock(1000.0, 120.0, lambda: next(wall))
    assert (clock(), clock()) == (1000.0, 1120.0)


def test_a_scale_of_one_is_the_walls_own_clock() -> None:
    def wall() -> float:
        return 7.0

    assert trace_clock(0.0, 1.0, wall) is wall


@pytest.mark.parametrize(("start", "scale", "message"), [
    (0.0, 0.0, "above 0"), (0.0, -2.0, "above 0"), (0.0, math.nan, "above 0"), (math.inf, 2.0, "finite"),
])
def test_a_bad_clock_is_refused(start: float, scale: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trace_clock(start, scale)


def test_the_controllers_replay_clock_is_for_the_agents_source_only() -> None:
    settings = ControllerSettings.from_env({}, usage_time_scale=60.0, usage_clock_start=5.0)
    assert (settings.usage_time_scale, settings.usage_clock_start) == (60.0, 5.0)
    with pytest.raises(ValueError, match="above 0"):
        ControllerSettings.from_env({}, usage_time_scale=0.0)
    with pytest.raises(ValueError, match="Prometheus"):
        ControllerSettings.from_env({}, usage_time_scale=60.0, usage_source="prometheus",
                                    prometheus_url="http://p:9090")


def test_the_agents_trace_clock_needs_a_trace() -> None:
    with pytest.raises(ValueError, match="set usage_trace too"):
        AgentSettings.from_env({}, node_name="n", simulate="H100:1", usage_trace_clock=True)

"""SharingPolicy rules enforced by the agent: windows, freezing, idle time, node selection."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from node.base.reshape_rules import reshape_rules


def _ts(day: int, hour: int, minute: int = 0) -> float:
    """2026-11-30 is a Monday: day 0 = Mon."""
    monday = dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)
    return (monday + dt.timedelta(days=day, hours=hour, minutes=minute)).timestamp()


def _policy(name: str, selector: dict[str, str] | None = None, **reshaping: Any) -> dict[str, Any]:
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": selector or {}}, "reshaping": reshaping}}


@pytest.mark.parametrize(
    ("window", "moment", "inside"),
    [
        ({"start": "09:00", "end": "17:00", "days": ["Mon"]}, _ts(0, 12), True),
        ({"start": "09:00", "end": "17:00", "days": ["Mon"]}, _ts(0, 17), False),
        ({"start": "09:00", "end": "17:00", "days": ["Tue"]}, _ts(0, 12), False),
        ({"start": "22:00", "end": "02:00", "days": ["Mon"]}, _ts(0, 23), True),
        ({"start": "22:00", "end": "02:00", "days": ["Mon"]}, _ts(1, 1, 59), True),
        ({"start": "22:00", "end": "02:00", "days": ["Mon"]}, _ts(0, 1), False),
        ({"start": "00:00", "end": "00:00", "days": ["Wed"]}, _ts(2, 13), True),
    ],
    ids=["day", "end-exclusive", "other-day", "before-midnight", "after-midnight", "monday-early", "whole-day"],
)
def test_windows(window: dict[str, Any], moment: float, inside: bool) -> None:
    rules = reshape_rules({}, [_policy("p", windows=[window])], 300)
    allowed, reason = rules.may_start(moment)
    assert allowed is inside
    assert (reason == "") is inside


def test_strictest_of_the_matching_policies_wins() -> None:
    policies = [
        _policy("gpu-pool", {"pool": "gpu"}, idleSeconds=60, windows=[{"start": "00:00", "end": "00:00"}]),
        _policy("nights", {}, idleSeconds=900, windows=[{"start": "20:00", "end": "06:00"}]),
        _policy("elsewhere", {"pool": "cpu"}, maxConcurrent=0),
        {"metadata": {"name": "broken"}, "spec": {"reshaping": {"idleSeconds": "soon"}}},
    ]
    rules = reshape_rules({"pool": "gpu"}, policies, 300)
    assert rules.idle_seconds == 900 and rules.sources == ("gpu-pool", "nights")
    assert rules.frozen_by == ()
    assert rules.may_start(_ts(0, 21))[0] and not rules.may_start(_ts(0, 12))[0]
    assert rules.problems and "broken" in rules.problems[0]
    assert reshape_rules({"pool": "cpu"}, policies, 300).may_start(_ts(0, 21)) == (
        False, "layouts frozen by SharingPolicy elsewhere (reshaping.maxConcurrent: 0)")


def test_no_matching_policy_uses_the_agent_default() -> None:
    rules = reshape_rules({"pool": "x"}, [_policy("p", {"pool": "y"}, idleSeconds=5)], 123)
    assert rules.idle_seconds == 123 and rules.may_start(_ts(3, 3)) == (True, "")

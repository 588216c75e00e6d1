"""One reading of a SharingPolicy reshaping window: the controller and the node agent agree.

Before ``sharing.windows``, a window with ``start == end`` was open all day for the
agent and never for the controller, so the controller never planned a reshape that
the agent would have accepted.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from controller.policies import merge
from node.policy import reshape_rules
from sharing.crd import SharingPolicySpec
from sharing.windows import window_contains

MONDAY = datetime(2026, 11, 30, tzinfo=timezone.utc)  # a Monday

WINDOWS = [
    ("03:00", "03:00", ["Mon"]),  # whole day
    ("01:00", "05:00", ["Mon", "Tue"]),
    ("22:00", "02:00", ["Sun"]),  # crosses into Monday
    ("22:00", "02:00", ["Mon"]),
    ("00:00", "23:59", ["Sat"]),
]


@pytest.mark.parametrize(("start", "end", "days"), WINDOWS, ids=[f"{s}-{e}-{'/'.join(d)}" for s, e, d in WINDOWS])
def test_controller_and_agent_read_every_window_alike(start: str, end: str, days: list[str]) -> None:
    spec = {"reshaping": {"windows": [{"start": start, "end": end, "days": days}], "maxConcurrent": 2}}
    controller = merge([("p", SharingPolicySpec.model_validate(spec))], None)
    agent = reshape_rules({}, [{"metadata": {"name": "p"}, "spec": spec}], default_idle=0)
    assert controller is not None
    for step in range(0, 2 * 24 * 60, 20):  # Monday and Tuesday, every 20 minutes
        moment = MONDAY + timedelta(minutes=step)
        assert controller.window_open(moment) == agent.may_start(moment.timestamp())[0], moment


def test_window_semantics() -> None:
    assert window_contains(180, 180, {0}, MONDAY.replace(hour=17))  # start == end: the whole day
    assert not window_contains(180, 180, {1}, MONDAY.replace(hour=17))
    assert window_contains(22 * 60, 120, {6}, MONDAY.replace(hour=1))  # Sunday's window, after midnight
    assert not window_contains(22 * 60, 120, {0}, MONDAY.replace(hour=1))
    assert not window_contains(60, 300, {0}, MONDAY.replace(hour=5))  # end is exclusive


TWO_POLICIES = [  # (first policy's windows, second's, minutes of Monday open)
    ([("01:00", "05:00", ["Mon"])], [("03:00", "08:00", ["Mon"])], 120),  # overlapping: 03:00-05:00
    ([("01:00", "02:00", ["Mon"])], [("03:00", "04:00", ["Mon"])], 0),  # disjoint: never
    ([("22:00", "02:00", ["Sun"])], [("00:00", "00:00", ["Mon"])], 120),  # Sunday's night into a whole Monday
    ([("01:00", "05:00", ["Mon"])], [], 240),  # the second policy does not restrict time
]


@pytest.mark.parametrize(("first", "second", "open_minutes"), TWO_POLICIES,
                         ids=["overlapping", "disjoint", "midnight", "one-restricts"])
def test_several_policies_are_read_alike(
    first: list[tuple[str, str, list[str]]], second: list[tuple[str, str, list[str]]], open_minutes: int
) -> None:
    """A reshape may start only when every time-restricting policy's windows allow it, in the
    controller and in the agent alike (the controller used to stop reshaping altogether when two
    policies' windows differed)."""
    specs = [
        {"reshaping": {"windows": [{"start": s, "end": e, "days": d} for s, e, d in windows], "maxConcurrent": 2}}
        for windows in (first, second)
    ]
    controller = merge([(f"p{i}", SharingPolicySpec.model_validate(spec)) for i, spec in enumerate(specs)], None)
    agent = reshape_rules({}, [{"metadata": {"name": f"p{i}"}, "spec": spec} for i, spec in enumerate(specs)], default_idle=0)
    assert controller is not None
    opened = 0
    for step in range(0, 24 * 60, 20):
        moment = MONDAY + timedelta(minutes=step)
        assert controller.window_open(moment) == agent.may_start(moment.timestamp())[0], moment
        opened += 20 * controller.window_open(moment)
    assert opened == open_minutes

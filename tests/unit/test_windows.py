"""One reading of SharingPolicies for a node (``sharing.rules.node_policy``): the controller and the agent agree.

Before ``sharing.rules.windows``, a window with ``start == end`` was open all day for the
agent and never for the controller, so the controller never planned a reshape that
the agent would have accepted. Both now call one merge; these tables run the
controller's reading (``merge``) and the agent's (``reshape_rules``) side by side
so that a component that stops calling it shows up here.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sharing.rules.node_policy import merge, policy_for_node
from node.base.reshape_rules import reshape_rules
from sharing.api.crd import SharingPolicySpec
from sharing.rules.windows import window_contains

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


SELECTION = [  # (node selector of the one policy, node labels, selected)
    ({}, {"pool": "a"}, True),  # an empty selector selects every node
    ({}, {}, True),
    ({"matchLabels": {"pool": "a"}}, {"pool": "a", "zone": "x"}, True),
    ({"matchLabels": {"pool": "a"}}, {"pool": "b"}, False),  # a selector no node matches
    ({"matchLabels": {"pool": "a", "zone": "x"}}, {"pool": "a"}, False),  # every pair must be present
]


@pytest.mark.parametrize(("selector", "labels", "selected"), SELECTION,
                         ids=["empty", "empty-no-labels", "labels", "no-match", "partial"])
def test_selection(selector: dict[str, object], labels: dict[str, str], selected: bool) -> None:
    spec = {"nodeSelector": selector, "reshaping": {"idleSeconds": 42, "maxConcurrent": 0}}
    merged = policy_for_node([("p", SharingPolicySpec.model_validate(spec))], labels, None)
    agent = reshape_rules(labels, [{"metadata": {"name": "p"}, "spec": spec}], default_idle=7)
    assert (merged is not None) == selected
    assert agent.sources == (("p",) if selected else ())
    # Selected: the policy's idle time and its freeze; not selected: the agent's default, free to reshape.
    assert (agent.idle_seconds, agent.frozen_by) == ((42.0, ("p",)) if selected else (7.0, ()))
    assert agent.may_start(MONDAY.timestamp())[0] is not selected


def test_a_closed_window_is_named_with_its_policy() -> None:
    spec = {"reshaping": {"windows": [{"start": "22:00", "end": "02:00", "days": ["Sun"]}]}}
    agent = reshape_rules({}, [{"metadata": {"name": "nights"}, "spec": spec}], default_idle=0)
    allowed, why = agent.may_start(MONDAY.replace(hour=12).timestamp())
    assert not allowed and why == "outside the reshaping windows of SharingPolicy nights (22:00-02:00 Sun UTC)"
    assert agent.may_start(MONDAY.replace(hour=1).timestamp()) == (True, "")  # Sunday's window, after midnight

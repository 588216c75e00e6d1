"""The one reshape/switch gate (``sharing.rules.reshape_gate``): each reason, its order, its message.

The planner, ``controller.planning.dramig``, the agent (``node.base.reshape_rules``) and the
DRA advertiser all ask it; the last tests check that the callers' answers are the gate's.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.dramig import creation_rule
from node.advertising.dra import reshape_blocked
from node.base.reshape_rules import reshape_rules
from sharing.api.crd import SharingPolicySpec
from sharing.rules.node_policy import NodePolicy, policy_for_node
from sharing.rules.reshape_gate import GateReason, idle_long_enough, reshape_gate

MONDAY_NOON = datetime(2026, 11, 30, 12, tzinfo=timezone.utc)  # a Monday
NIGHTS = {"start": "22:00", "end": "02:00", "days": ["Mon"]}


def _policy(labels: dict[str, str] | None = None, **reshaping: Any) -> NodePolicy | None:
    """The merged policy ``p`` (idle time 60 s unless told) for a node labelled ``labels``."""
    spec = SharingPolicySpec.model_validate({"nodeSelector": {"matchLabels": {"pool": "gpu"}},
                                             "reshaping": {"idleSeconds": 60, **reshaping}})
    return policy_for_node([("p", spec)], {"pool": "gpu"} if labels is None else labels, None)


STATIC = {"layout": {"mode": "static", "instances": [{"profile": "7g.80gb"}]}}

CASES: list[tuple[str, NodePolicy | None, dict[str, Any], GateReason | None, str]] = [
    # (id, merged policy, the caller's inputs, reason, message)
    ("selector-not-matching", _policy({"pool": "cpu"}), {}, "no-policy", "no SharingPolicy selects this node"),
    ("frozen", _policy(maxConcurrent=0), {}, "frozen",
     "layouts frozen by SharingPolicy p (reshaping.maxConcurrent: 0)"),
    ("outside-window", _policy(windows=[NIGHTS]), {}, "outside-window",
     "outside the reshaping windows of SharingPolicy p (22:00-02:00 Mon UTC)"),
    ("max-concurrent-reached", _policy(maxConcurrent=2), {"in_flight": 2}, "max-concurrent",
     "2 change(s) in flight reach reshaping.maxConcurrent 2 of SharingPolicy p"),
    ("not-idle-long-enough", _policy(), {"idle_for": [3600.0, 59.5]}, "not-idle",
     "a GPU has been idle for 59.5s; SharingPolicy p asks 60s idle (reshaping.idleSeconds)"),
    ("in-use", _policy(), {"idle_for": [None]}, "not-idle",
     "a GPU is in use; SharingPolicy p asks 60s idle (reshaping.idleSeconds)"),
    ("allowed", _policy(maxConcurrent=2, windows=[{"start": "09:00", "end": "17:00"}]),
     {"in_flight": 1, "idle_for": [60.0, 3600.0]}, None, ""),
    ("allowed-nothing-counted", _policy(maxConcurrent=1), {}, None, ""),
]


@pytest.mark.parametrize(("policy", "inputs", "reason", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_reason(policy: NodePolicy | None, inputs: dict[str, Any], reason: GateReason | None, message: str) -> None:
    answer = reshape_gate(policy, MONDAY_NOON, **inputs)
    assert (answer.reason, answer.allowed, answer.message) == (reason, reason is None, message)


def test_a_static_layout_refuses_only_a_layout_gpupack_chooses() -> None:
    policy = policy_for_node([("pinned", SharingPolicySpec.model_validate(STATIC))], {}, None)
    assert reshape_gate(policy, MONDAY_NOON).allowed  # bringing the node to its static layout, a sharing switch
    answer = reshape_gate(policy, MONDAY_NOON, dynamic_layout=True)
    assert (answer.reason, answer.message) == ("static-layout", "SharingPolicy pinned pins a static layout")


def test_a_spec_needs_no_policy_but_gpupack_own_choice_does() -> None:
    """The agent applying its spec passes ``needs_policy=False``: no policy, nothing restricts it."""
    assert reshape_gate(None, MONDAY_NOON, needs_policy=False, idle_for=[None]).allowed
    assert reshape_gate(None, MONDAY_NOON).reason == "no-policy"


def test_the_first_rule_that_refuses_is_the_answer() -> None:
    """Frozen, outside its window, at its bound and busy: the order of the module docstring."""
    policy = _policy(maxConcurrent=0, windows=[NIGHTS])
    assert policy is not None
    inputs: dict[str, Any] = {"in_flight": 5, "idle_for": [None]}
    assert reshape_gate(policy, MONDAY_NOON, dynamic_layout=True, **inputs).reason == "frozen"
    assert reshape_gate(_policy(windows=[NIGHTS]), MONDAY_NOON, **inputs).reason == "outside-window"
    assert reshape_gate(_policy(windows=[NIGHTS]), MONDAY_NOON + timedelta(hours=11), **inputs).reason == "max-concurrent"


def test_a_hand_built_policy_at_max_concurrent_zero_is_frozen() -> None:
    """``maxConcurrent: 0`` freezes even where no merge named who froze it (the bound is what counts)."""
    answer = reshape_gate(NodePolicy(names=("bench",), max_concurrent=0), MONDAY_NOON)
    assert (answer.reason, answer.message) == ("frozen", "layouts frozen by SharingPolicy bench (reshaping.maxConcurrent: 0)")


@pytest.mark.parametrize(("idle_for", "idle_seconds", "enough"), [
    (None, 0, False),  # in use: never, even with no idle time asked
    (0.0, 0, True),
    (59.9, 60, False),
    (60.0, 60, True),  # "at least" the idle time
])
def test_idle_long_enough(idle_for: float | None, idle_seconds: float, enough: bool) -> None:
    assert idle_long_enough(idle_for, idle_seconds) is enough


# -- the callers give the gate's answers -----------------------------------------------------------------------

RAW = [  # (node labels, SharingPolicy objects as the agent reads them)
    ({"pool": "gpu"}, [{"metadata": {"name": "p"}, "spec": {"nodeSelector": {"matchLabels": {"pool": "gpu"}},
                                                            "reshaping": {"windows": [NIGHTS]}}}]),
    ({"pool": "gpu"}, [{"metadata": {"name": "p"}, "spec": {"reshaping": {"maxConcurrent": 0}}}]),
    ({"pool": "gpu"}, [{"metadata": {"name": "pinned"}, "spec": STATIC}]),
    ({"pool": "cpu"}, [{"metadata": {"name": "p"}, "spec": {"nodeSelector": {"matchLabels": {"pool": "gpu"}}}}]),
    ({"pool": "gpu"}, [{"metadata": {"name": "p"}, "spec": {"reshaping": {"maxConcurrent": 3}}}]),
]


@pytest.mark.parametrize(("labels", "objects"), RAW, ids=["window", "frozen", "static", "unselected", "open"])
@pytest.mark.parametrize("hour", [12, 23])
def test_the_agent_the_dra_advertiser_and_the_controller_answer_alike(
        labels: dict[str, str], objects: list[dict[str, Any]], hour: int) -> None:
    moment = MONDAY_NOON.replace(hour=hour)
    rules = reshape_rules(labels, objects, default_idle=30)
    spec_gate = reshape_gate(rules.policy, moment, needs_policy=False)
    offer_gate = reshape_gate(rules.policy, moment, dynamic_layout=True)
    assert rules.may_start(moment.timestamp()) == (spec_gate.allowed, spec_gate.message)
    assert reshape_blocked(rules, moment.timestamp()) == (None if offer_gate.allowed else offer_gate.message)
    # The controller's view of what the agent offers (the same policy, merged by the controller).
    profiles_offered = creation_rule(rules.policy, moment)("1g.10gb")
    assert profiles_offered is offer_gate.allowed

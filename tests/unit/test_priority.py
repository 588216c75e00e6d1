"""A pod's priority (sharing.api.priority) and the priority rules (sharing.rules.priority)."""

from __future__ import annotations

from typing import Any

import pytest

from sharing.api.priority import (
    HIGHEST_USER_PRIORITY,
    INT32_MIN,
    NEVER,
    PREEMPT_LOWER_PRIORITY,
    SYSTEM_NODE_CRITICAL_PRIORITY,
    PodPriority,
    pod_priority,
)
from sharing.rules.priority import HIGH_PRIORITY, LOW_PRIORITY, may_preempt, qos_priority, waiting_order


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [], **spec}}


def test_a_pod_without_priority_fields_takes_kubernetes_defaults() -> None:
    assert pod_priority(pod()) == PodPriority(0, PREEMPT_LOWER_PRIORITY, "")
    assert pod_priority({}) == PodPriority()
    assert pod_priority(pod()).preempts


def test_the_resolved_fields_are_read_as_they_are() -> None:
    read = pod_priority(pod(priority=500, preemptionPolicy=NEVER, priorityClassName="batch"))
    assert read == PodPriority(500, NEVER, "batch")
    assert not read.preempts


@pytest.mark.parametrize(("value", "name"), [
    (HIGHEST_USER_PRIORITY, "high"),
    (INT32_MIN, "lowest"),
    (SYSTEM_NODE_CRITICAL_PRIORITY, "system-node-critical"),
    (2_000_000_000, "system-cluster-critical"),
], ids=["user-highest", "int32-min", "node-critical", "cluster-critical"])
def test_the_edges_of_the_range_are_valid(value: int, name: str) -> None:
    assert pod_priority(pod(priority=value, priorityClassName=name)).value == value


@pytest.mark.parametrize(("spec", "words"), [
    ({"priority": "100"}, "spec.priority must be an integer, got '100'"),
    ({"priority": 1.5}, "spec.priority must be an integer, got 1.5"),
    ({"priority": True}, "spec.priority must be an integer, got True"),
    ({"priority": HIGHEST_USER_PRIORITY + 1}, "at most 1000000000 (higher is only for system- classes)"),
    ({"priority": HIGHEST_USER_PRIORITY + 1, "priorityClassName": "vip"}, "at most 1000000000 for class 'vip'"),
    ({"priority": SYSTEM_NODE_CRITICAL_PRIORITY + 1, "priorityClassName": "system-x"}, "at most 2000001000"),
    ({"priority": INT32_MIN - 1}, "at least -2147483648"),
    ({"preemptionPolicy": "Sometimes"}, "preemptionPolicy 'Sometimes' is unknown: it must be one of "
                                        "PreemptLowerPriority, Never"),
    ({"priorityClassName": 7}, "priorityClassName must be a string"),
], ids=["string", "float", "bool", "huge", "huge-named", "above-system", "below-int32", "policy", "class-type"])
def test_bad_fields_get_a_clear_error_naming_the_pod(spec: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match="pod p: ") as caught:
        pod_priority(pod(**spec))
    assert words in str(caught.value)


def test_a_spec_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="spec must be an object, got list"):
        pod_priority({"metadata": {"name": "p"}, "spec": []})


@pytest.mark.parametrize(("preemptor", "victim", "expected"), [
    (PodPriority(10), 9, True),
    (PodPriority(10), 10, False),
    (PodPriority(10), 11, False),
    (PodPriority(10, NEVER), 0, False),
    (PodPriority(0), INT32_MIN, True),
], ids=["lower", "equal", "higher", "never", "int32-min"])
def test_only_strictly_lower_priority_is_preempted_and_never_by_a_never_pod(
        preemptor: PodPriority, victim: int, expected: bool) -> None:
    assert may_preempt(preemptor, victim) is expected


def test_waiting_order_is_priority_then_age_then_name() -> None:
    pods = [("old-low", 0, 1.0), ("young-high", 100, 9.0), ("old-high", 100, 2.0), ("b-tie", 100, 2.0)]
    ordered = sorted(pods, key=lambda p: waiting_order(p[1], p[2], p[0]))
    assert [p[0] for p in ordered] == ["b-tie", "old-high", "young-high", "old-low"]


def test_openb_classes_map_to_high_and_low() -> None:
    assert {q: qos_priority(q).value for q in ("LS", "Guaranteed", "Burstable", "BE")} == {
        "LS": HIGH_PRIORITY, "Guaranteed": HIGH_PRIORITY, "Burstable": HIGH_PRIORITY, "BE": LOW_PRIORITY}
    assert may_preempt(qos_priority("LS"), qos_priority("BE").value)
    assert not may_preempt(qos_priority("LS"), qos_priority("Burstable").value)
    assert qos_priority("BE").class_name == "BE"


@pytest.mark.parametrize("qos", ["", "ls", "BestEffort"])
def test_an_unknown_qos_is_refused_naming_the_classes(qos: str) -> None:
    with pytest.raises(ValueError, match=f"qos {qos!r} is unknown: openb's classes are LS, Guaranteed, Burstable, BE"):
        qos_priority(qos)

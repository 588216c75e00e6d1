"""The controller's placement condition on gated pods (``sharing.api.placement_status``) and the cycle's
patches of it (``controller.writes.wait_status``): one reader, one writer, and when each reason is written."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.planner import Plan, Release, SharingChange, Wait
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from kube.times import format_time
from controller.writes.wait_status import placement_patches, quiet
from sharing.api.keys import PLACEMENT_CONDITION
from sharing.api.placement_status import (
    NO_CAPACITY, PLACED, WAITING_FOR_CAPACITY, placement_condition, placement_patch, read_placement,
)

NOW = datetime(2026, 12, 1, 22, 0, 0, tzinfo=timezone.utc)
T = format_time
"""Times are written as RFC 3339 text (``sharing`` stays pure: the controller formats them)."""
CREATED = NOW - timedelta(seconds=30)


def pod_object(name: str = "p", conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"schedulingGates": [{"name": "gpupack.io/capacity"}]},
            "status": {"conditions": conditions or []}}


def with_patch(pod: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """``pod`` after a strategic-merge patch of its conditions (merged by type, as the API server does)."""
    assert patch is not None
    by_type = {c["type"]: c for c in pod["status"]["conditions"]}
    by_type.update({c["type"]: c for c in patch["status"]["conditions"]})
    return {**pod, "status": {"conditions": list(by_type.values())}}


# ------------------------------------------------------------------ reader and writer


def test_written_condition_reads_back() -> None:
    pod = with_patch(pod_object(), placement_patch(pod_object(), NO_CAPACITY, "no node has a replica", T(NOW)))
    status = read_placement(pod)
    assert status is not None
    assert (status.reason, status.message, status.probed_at, status.since) == (NO_CAPACITY, "no node has a replica", T(NOW), T(NOW))
    assert status.unplaceable and not status.placed
    cond = pod["status"]["conditions"][0]
    assert (cond["type"], cond["status"]) == (PLACEMENT_CONDITION, "False")


def test_nothing_is_written_when_the_pod_already_says_the_same() -> None:
    pod = with_patch(pod_object(), placement_patch(pod_object(), WAITING_FOR_CAPACITY, "switching", T(NOW)))
    assert placement_patch(pod, WAITING_FOR_CAPACITY, "switching", T(NOW + timedelta(seconds=5))) is None
    changed = placement_patch(pod, NO_CAPACITY, "nothing fits", T(NOW + timedelta(seconds=5)))
    assert changed is not None
    cond = changed["status"]["conditions"][0]
    # Still False: the transition time stays, the probe time moves.
    assert cond["lastTransitionTime"] == "2026-12-01T22:00:00Z" and cond["lastProbeTime"] == "2026-12-01T22:00:05Z"


def test_placed_is_written_only_over_an_earlier_false() -> None:
    assert placement_patch(pod_object(), PLACED, "released to n1", T(NOW)) is None
    waited = with_patch(pod_object(), placement_patch(pod_object(), NO_CAPACITY, "nothing fits", T(NOW)))
    later = NOW + timedelta(seconds=9)
    placed = with_patch(waited, placement_patch(waited, PLACED, "released to n1", T(later)))
    status = read_placement(placed)
    assert status is not None and status.placed and status.since == T(later)
    assert placed["status"]["conditions"][0]["status"] == "True"


@pytest.mark.parametrize("condition", [
    {"type": PLACEMENT_CONDITION, "status": "False", "reason": "SomethingElse", "message": ""},
    {"type": PLACEMENT_CONDITION, "status": "True", "reason": NO_CAPACITY, "message": ""},
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": ""},
    "not a condition",
], ids=["unknown-reason", "status-disagrees", "other-type", "not-a-mapping"])
def test_conditions_that_are_not_the_controllers_read_as_none(condition: Any) -> None:
    assert read_placement(pod_object(conditions=[condition])) is None


def test_an_unknown_reason_is_not_written() -> None:
    with pytest.raises(ValueError, match="placement reason"):
        placement_condition("Maybe", "", T(NOW))  # type: ignore[arg-type]


def test_long_messages_are_cut() -> None:
    cond = placement_condition(NO_CAPACITY, "x" * 5000, T(NOW))
    assert len(cond["message"]) == 1024


# ------------------------------------------------------------------ what a cycle writes


def node(name: str, *, sharing: str = "none", spec_sharing: str = "none", generation: int = 1,
         observed: int = 1) -> Node:
    return Node(name=name, product="Tesla-T4", model=None, labels=(), sharing=sharing,  # type: ignore[arg-type]
                replicas=1, gpus=(Gpu(0, 16384, False),), spec_sharing=spec_sharing,  # type: ignore[arg-type]
                generation=generation, observed_generation=observed)


def pod(name: str, gated: bool = True) -> Pod:
    return Pod(namespace="ns", name=name, mode="mps", created=CREATED, milli=(200,), memory_bytes=(None,), gated=gated)


def objects(*names: str) -> dict[str, dict[str, Any]]:
    return {f"ns/{n}": pod_object(n) for n in names}


def test_a_quiet_cycle_says_no_capacity_for_every_gated_pod_it_leaves_waiting() -> None:
    snapshot = Snapshot((node("a"), node("b")), (pod("p"), pod("q"), pod("ungated", gated=False)))
    plan = Plan(waiting=(Wait("ns/p", "no node shares GPUs by mps"), Wait("ns/q", "no node shares GPUs by mps"),
                         Wait("ns/ungated", "capacity exists on a; kube-scheduler retries the pod")))
    assert quiet(plan, snapshot)
    patches = placement_patches(plan, snapshot, objects("p", "q", "ungated"), NOW)
    assert [p.key for p in patches] == ["ns/p", "ns/q"]  # kube-scheduler speaks for the ungated one
    assert all(p.body["status"]["conditions"][0]["reason"] == NO_CAPACITY for p in patches)


@pytest.mark.parametrize("plan_change, nodes", [
    (True, (node("a"),)),
    (False, (node("a", generation=2, observed=1),)),
    (False, (node("a", sharing="none", spec_sharing="mps"),)),
], ids=["change-planned", "spec-not-applied", "sharing-switching"])
def test_while_anything_changes_a_waiting_pod_waits_for_capacity(plan_change: bool, nodes: tuple[Node, ...]) -> None:
    snapshot = Snapshot(nodes, (pod("p"),))
    sharing = (SharingChange("a", "mps", 4, "ns/p needs mps"),) if plan_change else ()
    plan = Plan(sharing=sharing, waiting=(Wait("ns/p", "capacity being created"),))
    assert not quiet(plan, snapshot)
    [patch] = placement_patches(plan, snapshot, objects("p"), NOW)
    assert patch.body["status"]["conditions"][0]["reason"] == WAITING_FOR_CAPACITY


def test_a_release_marks_placed_only_a_pod_that_was_told_to_wait() -> None:
    waited = with_patch(pod_object("p"), placement_patch(pod_object("p"), WAITING_FOR_CAPACITY, "switching", T(NOW)))
    snapshot = Snapshot((node("a"),), (pod("p"), pod("fresh")))
    plan = Plan(releases=(Release("ns/p", "a", "mps replica on a"), Release("ns/fresh", "a", "mps replica on a")))
    patches = placement_patches(plan, snapshot, {"ns/p": waited, "ns/fresh": pod_object("fresh")}, NOW)
    assert [p.key for p in patches] == ["ns/p"]
    cond = patches[0].body["status"]["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("True", PLACED) and "released to a" in cond["message"]


def test_pods_gone_since_the_cycle_read_them_are_skipped() -> None:
    snapshot = Snapshot((node("a"),), (pod("p"),))
    assert placement_patches(Plan(waiting=(Wait("ns/p", "nothing"),)), snapshot, {}, NOW) == []


def test_a_new_message_alone_is_written_at_most_once_a_minute() -> None:
    """With a backlog the planner's words about a waiting pod change every cycle (another node
    switching); rewriting them every cycle was a write per waiting pod per cycle."""
    said = with_patch(pod_object("p"), placement_patch(pod_object("p"), WAITING_FOR_CAPACITY, "a switching", T(NOW)))
    snapshot = Snapshot((node("a", generation=2, observed=1),), (pod("p"),))
    plan = Plan(waiting=(Wait("ns/p", "b switching"),))
    assert placement_patches(plan, snapshot, {"ns/p": said}, NOW + timedelta(seconds=59)) == []
    [patch] = placement_patches(plan, snapshot, {"ns/p": said}, NOW + timedelta(seconds=60))
    assert patch.body["status"]["conditions"][0]["message"] == "b switching"
    # A new reason is written at once, whatever the time.
    quiet_plan = Plan(waiting=(Wait("ns/p", "nothing fits"),))
    [now_quiet] = placement_patches(quiet_plan, Snapshot((node("a"),), (pod("p"),)), {"ns/p": said},
                                    NOW + timedelta(seconds=1))
    assert now_quiet.body["status"]["conditions"][0]["reason"] == NO_CAPACITY
    assert placement_patch(said, WAITING_FOR_CAPACITY, "c switching", T(NOW), new_message_due=False) is None


def test_a_pod_seconds_old_is_not_told_it_waits_for_capacity_being_created_but_is_told_none_exists() -> None:
    from dataclasses import replace

    young = replace(pod("p"), created=NOW - timedelta(seconds=3))
    busy = Snapshot((node("a", generation=2, observed=1),), (young,))
    plan = Plan(waiting=(Wait("ns/p", "capacity being created"),))
    assert placement_patches(plan, busy, objects("p"), NOW) == []  # most such pods are placed within seconds
    [later] = placement_patches(plan, busy, objects("p"), NOW + timedelta(seconds=8))
    assert later.body["status"]["conditions"][0]["reason"] == WAITING_FOR_CAPACITY
    [verdict] = placement_patches(Plan(waiting=(Wait("ns/p", "nothing fits"),)), Snapshot((node("a"),), (young,)),
                                  objects("p"), NOW)
    assert verdict.body["status"]["conditions"][0]["reason"] == NO_CAPACITY


def test_waiting_conditions_are_written_at_most_a_cycles_worth_at_a_time_oldest_first() -> None:
    from dataclasses import replace

    from controller.writes.wait_status import WAITING_WRITES_PER_CYCLE

    count = WAITING_WRITES_PER_CYCLE + 5
    pods = tuple(replace(pod(f"p{i:03d}"), created=CREATED - timedelta(seconds=count - i)) for i in range(count))
    busy = Snapshot((node("a", generation=2, observed=1),), pods)
    plan = Plan(waiting=tuple(Wait(f"ns/p{i:03d}", "capacity being created") for i in range(count)))
    patches = placement_patches(plan, busy, objects(*(f"p{i:03d}" for i in range(count))), NOW)
    assert [p.key for p in patches] == [f"ns/p{i:03d}" for i in range(WAITING_WRITES_PER_CYCLE)]
    quiet_plan = Plan(waiting=plan.waiting)
    verdicts = placement_patches(quiet_plan, Snapshot((node("a"),), pods), objects(*(f"p{i:03d}" for i in range(count))), NOW)
    assert len(verdicts) == count  # NoCapacity is never held back

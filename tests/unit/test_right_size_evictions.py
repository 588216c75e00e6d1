"""The ``Recreate`` updater's choice (controller.planning.right_size_evictions) and its adapter
(controller.planning.right_size_candidates): which pods are evicted, within which budget."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.evictions import eviction_outcome
from controller.planning.right_size_candidates import current_sizes, read_recommendations
from controller.planning.right_size_evictions import (
    MEMORY_GAP, WINDOW, EvictionMemory, namespace_modes, plan_evictions,
)
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.crd import RightSizingPolicy, SharingPolicySpec
from sharing.api.keys import ALLOCATION_ANNOTATION, RIGHT_SIZED_ANNOTATION, RIGHT_SIZING_LABEL, SHARED_RESOURCE
from sharing.api.right_sized import RightSizedFrom, SizedContainer
from sharing.api.workload import WorkloadRef
from sharing.rules.right_sizing import RightSizing
from sharing.usage.sizing import Size

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
GIB = 2**30
RECREATE = RightSizing(mode="Recreate", max_evictions_per_hour=1)
WEB = WorkloadRef("team", "Deployment", "web")


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, app: str = "web", memory: str = "80Gi", milli: str = "1000", ready: bool = True,
        created: datetime = NOW - timedelta(days=1), node: str | None = "n1", owner: str | None = "ReplicaSet",
        terminating: bool = False, namespace: str = "team") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                            "creationTimestamp": stamp(created), "labels": {"pod-template-hash": "abc12"}}
    if owner == "ReplicaSet":
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": f"{app}-abc12", "controller": True, "uid": "rs"}]
    elif owner is not None:
        meta["ownerReferences"] = [{"kind": owner, "name": app, "controller": True, "uid": "o"}]
    if terminating:
        meta["deletionTimestamp"] = stamp(NOW)
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {
        "gpupack.io/gpu-milli": milli, "gpupack.io/gpu-memory": memory}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}}


def recommendation(app: str = "web", *, milli: int = 100, memory: str = "20Gi", provided: str = "True",
                   kind: str = "Deployment", namespace: str = "team") -> dict[str, Any]:
    return {"metadata": {"name": f"{kind.lower()}-{app}", "namespace": namespace},
            "spec": {"targetRef": {"kind": kind, "name": app}},
            "status": {"source": "Agents", "containers": [
                {"containerName": "main", "gpuMilli": milli, "gpuMemory": memory, "observedSeconds": 86400}],
                "conditions": [{"type": "RecommendationProvided", "status": provided,
                                "lastTransitionTime": stamp(NOW), "reason": "Observed", "message": ""}]}}


def plan(pods: list[dict[str, Any]], recs: list[dict[str, Any]], modes: dict[str, RightSizing] | None = None,
         memory: EvictionMemory | None = None, now: datetime = NOW, gpu_memory: dict[str, int] | None = None) -> Any:
    memory = memory if memory is not None else covering(now)
    memory.begin_cycle(now)
    by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    typed, problems = read_recommendations(recs)
    assert problems == []
    return plan_evictions(by_key, modes if modes is not None else {"team": RECREATE}, typed, memory, now,
                          gpu_memory=gpu_memory)


def evicted(result: Any) -> list[str]:
    return [e.eviction.key for e in result.evictions]


def test_a_pod_far_above_its_recommendation_is_evicted_and_one_near_it_is_not() -> None:
    result = plan([pod("a"), pod("b", memory="21Gi", milli="120")], [recommendation()])
    assert evicted(result) == ["team/a"]
    (e,) = result.evictions
    assert (e.reason, e.recommendation, e.workload, e.container) == ("far", "deployment-web", WEB, "main")
    assert (e.current, e.target) == (Size(1000, 80 * GIB), Size(100, 20 * GIB))
    assert e.eviction.node == "n1" and "GPURecommendation deployment-web" in e.eviction.why


def test_at_most_the_budget_per_workload_per_hour_risk_first() -> None:
    pods = [pod("big"), pod("small", memory="10Gi"), pod("near", memory="21Gi", milli="120"),
            pod("other", app="api"), pod("other2", app="api")]
    recs = [recommendation(), recommendation("api")]
    result = plan(pods, recs)
    (web,) = [e for e in result.evictions if e.workload == WEB]
    assert web.eviction.key == "team/small" and web.reason == "at-risk"  # memory below the recommendation first
    assert sorted(evicted(result)) == ["team/other", "team/small"]  # the budget is per workload
    more = plan(pods, recs, {"team": RightSizing(mode="Recreate", max_evictions_per_hour=2)})
    # Two of web's three (near stays Ready); one of api's two (the other is its last ready replica).
    assert evicted(more) == ["team/small", "team/big", "team/other"]
    assert [h.split(":")[0] for h in more.held] == ["team/other2"]


def covering(now: datetime) -> EvictionMemory:
    """A memory of a controller that has led, cycle after cycle, since long before ``now``."""
    return EvictionMemory(since=now - 2 * WINDOW, last_cycle=now)


def test_the_budget_counts_the_evictions_remembered_in_the_last_hour() -> None:
    memory = covering(NOW)
    memory.record(WEB, NOW - timedelta(minutes=50))
    pods = [pod("a"), pod("b")]
    assert evicted(plan(pods, [recommendation()], memory=memory)) == []
    later = NOW + timedelta(minutes=11)  # 61 minutes after the eviction: out of the window
    memory.last_cycle = later - timedelta(seconds=10)
    assert evicted(plan(pods, [recommendation()], memory=memory, now=later)) == ["team/a"]
    assert memory.times == {}  # forgotten once out of the window


def test_a_new_memory_counts_pods_created_in_the_hour_it_does_not_cover() -> None:
    """After a restart or failover the memory is empty: young pods may be replacements of an
    earlier leader's evictions, so they spend the budget until the memory covers the hour."""
    young = pod("young", created=NOW - timedelta(minutes=30))
    pods = [pod("a"), pod("b"), young]
    fresh = EvictionMemory()
    assert evicted(plan(pods, [recommendation()], memory=fresh)) == []
    # A pod stamped in the memory's first second was created after it began (stamps are whole seconds).
    same_second = EvictionMemory()
    same_second.begin_cycle(NOW + timedelta(milliseconds=400))
    assert evicted(plan([pod("a"), pod("b"), pod("c", created=NOW)], [recommendation()], memory=same_second,
                        now=NOW + timedelta(milliseconds=500))) == ["team/a"]
    # A memory that covers the hour knows the young pod is no replacement.
    assert evicted(plan(pods, [recommendation()], memory=covering(NOW))) == ["team/a"]


def test_a_gap_between_cycles_restarts_the_memory() -> None:
    memory = EvictionMemory()
    memory.begin_cycle(NOW - timedelta(hours=2))
    memory.record(WEB, NOW - timedelta(minutes=1))
    memory.begin_cycle(NOW + MEMORY_GAP + timedelta(seconds=1))
    assert memory.times == {} and memory.since == NOW + MEMORY_GAP + timedelta(seconds=1)


def test_never_the_last_ready_replica() -> None:
    sts = [recommendation(kind="StatefulSet")]
    assert evicted(plan([pod("only", owner="StatefulSet")], sts)) == []
    result = plan([pod("a"), pod("b", ready=False)], [recommendation()])
    # b serves nothing and a stays: b goes; a would be the last ready replica.
    assert evicted(result) == ["team/b"] and result.rollouts == ()
    assert plan([pod("a", owner="StatefulSet"), pod("b", owner="StatefulSet", terminating=True)], sts).held == (
        "team/a: the last ready replica of team/StatefulSet/web (no other pod of it is Ready)",)
    # Several evictions in one cycle still leave one ready replica.
    two = RightSizing(mode="Recreate", max_evictions_per_hour=5)
    assert evicted(plan([pod("a"), pod("b"), pod("c")], [recommendation()], {"team": two})) == ["team/a", "team/b"]


def test_a_deployments_only_pod_is_left_to_a_rollout_within_the_budget() -> None:
    result = plan([pod("only")], [recommendation()])
    assert evicted(result) == [] and [r.eviction.key for r in result.rollouts] == ["team/only"]
    (move,) = result.rollouts
    assert (move.workload, move.recommendation, move.reason) == (WEB, "deployment-web", "far")
    # Its old pod terminating (a rollout under way, or an eviction): the new one is the only live pod.
    assert plan([pod("new", ready=False), pod("old", terminating=True)], [recommendation()]).rollouts == ()
    spent = covering(NOW)
    spent.record(WEB, NOW - timedelta(minutes=5))
    assert plan([pod("only")], [recommendation()], memory=spent).rollouts == ()  # the same budget


@pytest.mark.parametrize("mode", ["Off", "Initial"])
def test_off_and_initial_namespaces_are_never_evicted(mode: str) -> None:
    sizing = RightSizing(mode=mode)  # type: ignore[arg-type]
    assert evicted(plan([pod("a"), pod("b")], [recommendation()], {"team": sizing})) == []
    assert evicted(plan([pod("a"), pod("b")], [recommendation()], {})) == []
    assert evicted(plan([pod("a"), pod("b")], [recommendation()],
                        {"team": RightSizing(mode="Recreate", max_evictions_per_hour=0)})) == []


def test_the_namespace_mode_comes_from_the_one_rule() -> None:
    policy = SharingPolicySpec(right_sizing=RightSizingPolicy(mode="Recreate", max_evictions_per_hour=3))
    modes = namespace_modes([("p", policy)], {"opted-out": {RIGHT_SIZING_LABEL: "Off"}}, ["team", "opted-out"])
    assert (modes["team"].mode, modes["team"].max_evictions_per_hour) == ("Recreate", 3)
    assert modes["opted-out"].mode == "Off"
    assert namespace_modes([], {"team": {RIGHT_SIZING_LABEL: "Recreate"}}, ["team"])["team"].evicts


@pytest.mark.parametrize(("why", "change"), [
    ("not provided", lambda p, r: r["status"]["conditions"][0].update(status="False")),
    ("another workload's", lambda p, r: r["spec"]["targetRef"].update(name="other")),
    ("no container of that name", lambda p, r: r["status"]["containers"][0].update(containerName="side")),
    ("bare pod: nothing recreates it", lambda p, r: p["metadata"].pop("ownerReferences")),
    ("DaemonSet pod: comes back on the same node", lambda p, r: p["metadata"].update(
        ownerReferences=[{"kind": "DaemonSet", "name": "web", "controller": True, "uid": "d"}])),
    ("not bound", lambda p, r: p["spec"].pop("nodeName")),
    ("memory unknown", lambda p, r: p["spec"]["containers"][0]["resources"]["limits"].pop("gpupack.io/gpu-memory")),
])
def test_pods_left_alone(why: str, change: Any) -> None:
    target, other = pod("a"), pod("b")
    rec = recommendation()
    change(target, rec)
    keys = evicted(plan([target, other], [rec]))
    assert "team/a" not in keys, why


def test_current_size_is_the_allocation_record_first() -> None:
    record = Allocation(mode="mps", gated=False, capacity_existed=True, policy="p", reason="r", containers=(
        ContainerAllocation("main", "containers", 250, None, SHARED_RESOURCE),), gpu_model="H100-80GB", replicas=4)
    obj = pod("a")
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: record.to_annotation()}
    obj["spec"]["containers"][0]["resources"] = {"limits": {SHARED_RESOURCE: "1"}}
    (size,) = current_sizes(obj).values()
    assert size.milli == 250 and 79 * GIB < size.memory_bytes <= 80 * GIB  # no memory figure: the GPU's
    obj["metadata"]["annotations"][ALLOCATION_ANNOTATION] = "not json"
    assert current_sizes(obj) == {}  # an untrusted record, and no gpupack.io limits left: not judged


def test_a_right_sized_pod_is_its_predicted_size_not_its_accounted_milli() -> None:
    """Under compute over-commit 4.0 a share predicted at 150 milli is accounted 38 (the allocation
    record); its size now is the prediction, so it is near the recommendation it was sized from
    (38 would read as compute four times below it: far, evicted every hour)."""
    record = Allocation(mode="mps", gated=False, capacity_existed=True, policy="p", reason="r", containers=(
        ContainerAllocation("main", "containers", 38, 12 * GIB, SHARED_RESOURCE),), gpu_model="H100-80GB", replicas=8)
    sized = RightSizedFrom("deployment-web", 1, None, (SizedContainer("main", 1000, None, 150, 12 * GIB, 38),), 4.0)
    obj = pod("a")
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: record.to_annotation(),
                                      RIGHT_SIZED_ANNOTATION: sized.to_annotation()}
    obj["spec"]["containers"][0]["resources"] = {"limits": {SHARED_RESOURCE: "1"}}
    assert current_sizes(obj) == {"main": Size(150, 12 * GIB)}
    assert evicted(plan([obj, pod("b", memory="12Gi", milli="150")], [recommendation(milli=150, memory="12Gi")])) == []
    obj["metadata"]["annotations"][RIGHT_SIZED_ANNOTATION] = "{"
    assert current_sizes(obj) == {"main": Size(38, 12 * GIB)}  # unreadable: the allocation record alone


def _whole(name: str, memory: int) -> dict[str, Any]:
    """A Deployment's only pod admitted ``whole`` on the device-plugin backend, its record sized to ``memory``."""
    record = Allocation(mode="whole", gated=False, capacity_existed=True, policy="p", reason="r", containers=(
        ContainerAllocation("main", "containers", 1000, memory, "nvidia.com/gpu"),))
    obj = pod(name)
    obj["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: record.to_annotation()}
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return obj


def test_a_pod_on_a_whole_gpu_moves_only_to_a_share_on_the_device_plugin_backend() -> None:
    """A pod admitted whole holds the GPU whatever memory its record names, and a recommendation
    no split into two replicas holds would admit it whole again: no move gains anything (a live
    replay made 11 of its 21 moves so, benchmarks/usage_live.md). One that fits half a GPU moves."""
    gpus = {"n1": 80 * GIB}
    sized = _whole("sized", 47 * GIB)  # sized from an earlier recommendation, whole since
    for rec in (recommendation(milli=1000, memory="56Gi"), recommendation(milli=400, memory="44Gi")):
        assert plan([sized], [rec], gpu_memory=gpus).rollouts == ()
        assert plan([_whole("first", 80 * GIB)], [rec], gpu_memory=gpus).rollouts == ()
    (move,) = plan([sized], [recommendation(milli=400, memory="30Gi")], gpu_memory=gpus).rollouts
    assert (move.current, move.target, move.reason) == (Size(1000, 80 * GIB), Size(400, 30 * GIB), "far")
    # The node's GPU memory unknown: judged on the record, as before.
    assert [r.reason for r in plan([sized], [recommendation(milli=1000, memory="56Gi")]).rollouts] == ["at-risk"]


def test_a_recommendation_that_does_not_validate_is_named_and_left_out() -> None:
    bad = recommendation()
    bad["status"]["containers"][0]["gpuMemory"] = "lots"
    typed, problems = read_recommendations([bad, recommendation("api")])
    assert list(typed) == [("team", "deployment-api")]
    assert len(problems) == 1 and problems[0].startswith("team/deployment-web: ")


@pytest.mark.parametrize(("status", "outcome"), [(None, "evicted"), (429, "blocked"), (404, "gone"),
                                                 (403, "failed"), (500, "failed")])
def test_eviction_outcomes(status: int | None, outcome: str) -> None:
    assert eviction_outcome(status) == outcome

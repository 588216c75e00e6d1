"""The live planner's placement preference by priority (``sharing.packing.priority_affinity``, the rule
the product model places by): a pod takes a free replica or an in-use whole-GPU node only where every
GPU pod has its priority, before an idle node, and anywhere only when nothing else has room."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from controller.planning.planner import Plan, plan
from controller.planning.sharedplan import SharedPlacer
from controller.state.snapshot import Gpu, Node, PlainGpuPod, Pod, Snapshot
from mig.catalog import get_model
from sharing.api.priority import PodPriority
from sharing.rules.node_policy import NodePolicy

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
LONG_AGO = NOW - timedelta(hours=2)
POLICY = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=600)
HIGH, BE = 1000, 0


def node(name: str, gpus: int = 1, sharing: str = "none", replicas: int = 1) -> Node:
    return Node(name, H100.product, H100, (("pool", "a"),), sharing, replicas,  # type: ignore[arg-type]
                tuple(Gpu(i, H100.memory_mib, False, idle_since=LONG_AGO) for i in range(gpus)),
                spec_sharing=sharing, spec_replicas=replicas)  # type: ignore[arg-type]


def pod(name: str, priority: int, mode: str = "mps", *, on: str | None = None, milli: int = 250) -> Pod:
    return Pod("team", name, mode, NOW - timedelta(minutes=10), milli=(milli,), memory_bytes=(None,),  # type: ignore[arg-type]
               gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}", priority=PodPriority(priority))


def run(nodes: list[Node], pods: list[Pod], policy: NodePolicy | None = POLICY) -> Plan:
    policies = {n.name: policy for n in nodes} if policy is not None else {}
    uids = frozenset(p.uid for p in pods)
    return plan(Snapshot(tuple(nodes), tuple(pods), policies, present=uids), NOW)


def shared_cluster() -> list[Node]:
    """``high``: MPS x4 with one replica taken by a high pod, three free; ``idle``: a node that may be split."""
    return [node("high", sharing="mps", replicas=4), node("idle")]


def test_a_best_effort_replica_splits_an_idle_node_rather_than_sit_beside_a_high_one() -> None:
    placed = pod("h", HIGH, on="high")
    result = run(shared_cluster(), [placed, pod("be", BE)])
    assert result.releases == ()
    (change,) = result.sharing
    assert (change.node, change.mode) == ("idle", "mps")
    # A pod of the node's own priority takes the free replica, as before.
    same = run(shared_cluster(), [placed, pod("h2", HIGH)])
    assert [(r.pod, r.node) for r in same.releases] == [("team/h2", "high")] and same.sharing == ()


def test_a_best_effort_replica_falls_back_onto_a_mixed_node_when_nothing_else_has_room() -> None:
    placed = pod("h", HIGH, on="high")
    # No policy: no idle node may be split, so the only room is beside the high pod.
    result = run(shared_cluster(), [placed, pod("be", BE)], policy=None)
    assert [(r.pod, r.node) for r in result.releases] == [("team/be", "high")]


def test_pods_released_in_a_cycle_count_for_the_pods_after_them() -> None:
    # Two free MPS nodes, nothing placed: the high pod takes one, the best-effort pod the other.
    nodes = [node("a", sharing="mps", replicas=4), node("b", sharing="mps", replicas=4)]
    high = replace(pod("h", HIGH), created=NOW - timedelta(minutes=20))
    result = run(nodes, [high, pod("be", BE)], policy=None)
    where = {r.pod: r.node for r in result.releases}
    assert set(where) == {"team/h", "team/be"} and where["team/h"] != where["team/be"]
    # At one priority both go to the same node (the engine packs).
    alike = run(nodes, [high, pod("be2", HIGH)], policy=None)
    assert len({r.node for r in alike.releases}) == 1


def whole_cluster() -> list[Node]:
    """``busy``: a whole-GPU node with one of its two GPUs taken; ``idle``: two idle GPUs."""
    return [replace(node("busy", gpus=2), whole_taken=1), node("idle", gpus=2)]


def test_a_best_effort_whole_gpu_pod_takes_an_idle_node_rather_than_sit_beside_a_high_one() -> None:
    placed = pod("h", HIGH, "whole", on="busy", milli=1000)
    result = run(whole_cluster(), [placed, pod("be", BE, "whole", milli=1000)])
    assert [(r.pod, r.node) for r in result.releases] == [("team/be", "idle")]
    same = run(whole_cluster(), [placed, pod("h2", HIGH, "whole", milli=1000)])
    assert [(r.pod, r.node) for r in same.releases] == [("team/h2", "busy")]  # a node in use first
    # No idle node: beside the high pod.
    full_idle = [whole_cluster()[0], replace(node("idle", gpus=2), whole_taken=2)]
    fallback = run(full_idle, [placed, pod("be", BE, "whole", milli=1000)])
    assert [(r.pod, r.node) for r in fallback.releases] == [("team/be", "busy")]


def test_a_high_pod_kube_scheduler_placed_counts_too() -> None:
    """A pod asking ``nvidia.com/gpu`` itself (kube-scheduler's) holds the busy node's GPU at high priority."""
    high = PlainGpuPod("ml/h", 1, node="busy", priority=HIGH)
    snapshot = Snapshot(tuple(whole_cluster()), (pod("be", BE, "whole", milli=1000),),
                        {n.name: POLICY for n in whole_cluster()}, plain_gpu_pods=(high,))
    assert [(r.pod, r.node) for r in plan(snapshot, NOW).releases] == [("team/be", "idle")]
    at_be = replace(snapshot, plain_gpu_pods=(replace(high, priority=BE),))
    assert [(r.pod, r.node) for r in plan(at_be, NOW).releases] == [("team/be", "busy")]


@pytest.mark.parametrize("priority", [0, HIGH])
def test_at_one_priority_plans_are_those_without_the_preference(monkeypatch: pytest.MonkeyPatch, priority: int) -> None:
    nodes = [*shared_cluster(), *whole_cluster()]
    pods = [pod("h", priority, on="high"), pod("w", priority, "whole", on="busy", milli=1000),
            pod("s1", priority), pod("s2", priority, milli=400), pod("s3", priority, "time-slicing"),
            pod("w1", priority, "whole", milli=1000), pod("w2", priority, "whole", milli=1000)]
    with_preference = run(nodes, pods)
    monkeypatch.setattr(SharedPlacer, "mixes", lambda self, pod: False)
    assert run(nodes, pods) == with_preference
    # The comparison can tell: with the high pods' priority changed, the plans differ.
    mixed = [replace(p, priority=PodPriority(priority + 1)) if p.node else p for p in pods]
    monkeypatch.undo()
    changed = run(nodes, mixed)
    monkeypatch.setattr(SharedPlacer, "mixes", lambda self, pod: False)
    assert run(nodes, mixed) != changed

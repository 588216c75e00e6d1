"""Pods Kueue still holds (its admission gate ``kueue.x-k8s.io/admission``) are no demand: read from the pod,
never planned for (no split, no reshape, no release), reported ``HeldByKueue``, and both gates coexist."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from controller.planning.planner import Plan, Wait
from controller.state.pods import pod_from_object
from controller.state.snapshot import Snapshot
from controller.writes.patches import release_ops
from controller.writes.wait_status import placement_patches
from sharing.api.keys import CAPACITY_GATE, KUEUE_ADMISSION_GATE
from sharing.api.placement_status import HELD_BY_KUEUE, NO_CAPACITY, PLACED
from tests.unit.test_controller_planner import NOW, POLICY, gpu, mig_pod, node, run, shared_pod
from tests.unit.test_placement_status import pod_object

HELD_POLICY = replace(POLICY, idle_seconds=0, max_replicas=8)


def test_the_pod_reader_sees_kueues_gate_beside_gpupacks() -> None:
    def obj(*gates: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-12-01T22:00:00Z",
                             "annotations": {"gpupack.io/allocation": ALLOCATION}},
                "spec": {"schedulingGates": [{"name": g} for g in gates],
                         "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}}

    both, ours, kueues = (pod_from_object(obj(*g)) for g in
                          ((CAPACITY_GATE, KUEUE_ADMISSION_GATE), (CAPACITY_GATE,), (KUEUE_ADMISSION_GATE,)))
    assert both is not None and ours is not None and kueues is not None
    assert (both.gated, both.queue_held) == (True, True)
    assert (ours.gated, ours.queue_held) == (True, False)
    assert (kueues.gated, kueues.queue_held) == (False, True)


ALLOCATION = ('{"version": "v1", "mode": "mps", "gated": true, "capacityExisted": false, "reason": "r",'
              ' "containers": [{"name": "c", "milli": 200, "resource": "nvidia.com/gpu.shared"}]}')


def test_a_held_pod_splits_no_node_and_an_admitted_one_does() -> None:
    plain = node("plain", gpu(0, mig=False), gpu(1, mig=False))
    held = replace(shared_pod("flood", milli=1), queue_held=True)
    result = run([plain], [held], HELD_POLICY)
    assert result.sharing == () and result.layouts == () and result.releases == ()
    [wait] = result.waiting
    assert wait.pod == "team/flood" and wait.held and "held by Kueue" in wait.reason
    # Kueue lifted its gate: the same pod is demand now.
    admitted = run([plain], [replace(held, queue_held=False)], HELD_POLICY)
    assert [c.node for c in admitted.sharing] == ["plain"] and not any(w.held for w in admitted.waiting)


def test_a_held_mig_pod_reshapes_nothing() -> None:
    result = run([node("a", gpu(0, ()))], [replace(mig_pod("m"), queue_held=True)], HELD_POLICY)
    assert result.layouts == () and [w.held for w in result.waiting] == [True]


def test_a_held_flood_does_not_take_the_replica_of_the_other_tenants_admitted_pod() -> None:
    shared = node("s", gpu(0, mig=False), sharing="mps", replicas=4)
    flood = [replace(shared_pod(f"f{i}", milli=1), created=NOW - timedelta(hours=1), queue_held=True)
             for i in range(20)]
    other = replace(shared_pod("other", milli=200), namespace="b")
    result = run([shared], [*flood, other], None)  # no policy: the node keeps its split
    assert [(r.pod, r.node) for r in result.releases] == [("b/other", "s")]
    assert {w.pod for w in result.waiting if w.held} == {f"team/f{i}" for i in range(20)}


def test_held_pods_are_said_held_even_when_the_cycle_is_quiet() -> None:
    p = replace(shared_pod("p"), namespace="ns", name="p", queue_held=True, created=NOW - timedelta(minutes=5))
    q = replace(shared_pod("q"), namespace="ns", name="q", created=NOW - timedelta(minutes=5))
    snapshot = Snapshot((node("a", gpu(0, mig=False)),), (p, q))
    plan = Plan(waiting=(Wait("ns/q", "nothing fits"), Wait("ns/p", "held by Kueue", held=True)))
    patches = {x.key: x.body["status"]["conditions"][0]["reason"]
               for x in placement_patches(plan, snapshot, {"ns/p": pod_object("p"), "ns/q": pod_object("q")}, NOW)}
    assert patches == {"ns/p": HELD_BY_KUEUE, "ns/q": NO_CAPACITY}


def test_a_young_held_pod_costs_no_write() -> None:
    young = replace(shared_pod("p"), namespace="ns", name="p", queue_held=True, created=NOW - timedelta(seconds=2))
    plan = Plan(waiting=(Wait("ns/p", "held by Kueue", held=True),))
    assert placement_patches(plan, Snapshot((), (young,)), {"ns/p": pod_object("p")}, NOW) == []
    assert PLACED != HELD_BY_KUEUE


def test_a_release_lifts_only_gpupacks_gate() -> None:
    obj: dict[str, Any] = {"spec": {"schedulingGates": [{"name": CAPACITY_GATE}, {"name": "example.com/other"}]}}
    ops = release_ops(obj, "n", pinned=True)
    assert {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "example.com/other"}]} in ops

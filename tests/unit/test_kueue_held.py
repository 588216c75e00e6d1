"""Pods Kueue still holds (its admission gate ``kueue.x-k8s.io/admission``) are no demand: read from the pod,
never planned for (no split, no reshape, no release), reported ``HeldByKueue``, and both gates coexist."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from controller.kube import Kube
from controller.planning.planner import Plan, Wait, plan
from controller.reconcile import Controller
from controller.settings import ControllerSettings
from controller.state.pods import pod_from_object
from controller.state.snapshot import Pod, Snapshot
from controller.watch_caches import CachedKube, ClusterCaches
from kube.errors import KubeError
from kube.times import format_time
from controller.writes.patches import release_ops
from controller.writes.wait_status import placement_patches
from sharing.api.keys import CAPACITY_GATE, KUEUE_ADMISSION_GATE
from sharing.api.kueue_workload import NEVER_EVENT, KueueVerdict
from sharing.api.placement_status import HELD_BY_KUEUE, NO_CAPACITY, PLACED, placement_condition
from tests.unit.test_controller_planner import NOW, POLICY, gpu, mig_pod, node, run, shared_pod
from tests.unit.test_placement_status import pod_object, with_patch

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


# ----------------------------------------------------------- in Kueue's words (issue 36, bad input)

BEYOND = ("couldn't assign flavors to pod set main: insufficient quota for gpupack.io/gpu-milli in flavor "
          "gpupack-gpus, previously considered podsets requests (0) + current podset request (2) > maximum "
          "capacity (1500m)")
BUSY = "couldn't assign flavors to pod set main: insufficient unused quota for gpupack.io/gpu-milli in flavor f, 250m more needed"


def _verdict(message: str) -> KueueVerdict:
    return KueueVerdict("team/w", ("uid-p",), "QuotaReserved", "False", "Pending", message)


def _held(name: str = "p", age: timedelta = timedelta(minutes=5)) -> Pod:
    return replace(shared_pod(name), namespace="ns", name=name, uid=f"uid-{name}", queue_held=True, created=NOW - age)


@pytest.mark.parametrize(("verdicts", "read", "age", "never", "says"), [
    ({"uid-p": _verdict(BEYOND)}, True, timedelta(minutes=5), True, "never admitted by Kueue"),
    ({"uid-p": _verdict(BUSY)}, True, timedelta(minutes=5), False, "held by Kueue: QuotaReserved=False (Pending)"),
    ({}, True, timedelta(minutes=5), False, "no Kueue Workload for this pod after 300s: is Kueue running?"),
    ({}, True, timedelta(seconds=3), False, "its Workload is not created yet"),
    ({}, False, timedelta(minutes=5), False, "cannot be read: is Kueue installed and running?"),
], ids=["beyond-capacity", "quota-busy", "no-workload", "no-workload-yet", "workloads-not-read"])
def test_the_planner_says_kueues_verdict(verdicts: dict[str, KueueVerdict], read: bool, age: timedelta,
                                         never: bool, says: str) -> None:
    plain = node("plain", gpu(0, mig=False))
    snapshot = Snapshot((plain,), (_held(age=age),), {"plain": HELD_POLICY}, kueue=verdicts, kueue_read=read)
    [wait] = plan(snapshot, NOW).waiting
    assert (wait.held, wait.never) == (True, never) and says in wait.reason, wait.reason


def test_never_is_written_at_once_and_once() -> None:
    """A message-only change waits MESSAGE_REFRESH_SECONDS, but Kueue's "never" is written the cycle it is
    known, and costs no further write while Kueue says the same."""
    pod = _held()
    snapshot = Snapshot((), (pod,))
    said = placement_condition(HELD_BY_KUEUE, "held by Kueue: its Workload is not created yet", format_time(NOW))
    obj = pod_object("p", [dict(said)])
    never = Plan(waiting=(Wait("ns/p", "never admitted by Kueue: ...", held=True, never=True),))
    [patch] = placement_patches(never, snapshot, {"ns/p": obj}, NOW + timedelta(seconds=1))
    assert patch.body["status"]["conditions"][0]["message"] == "never admitted by Kueue: ..."
    assert placement_patches(never, snapshot, {"ns/p": with_patch(obj, patch.body)}, NOW + timedelta(seconds=2)) == []
    busy = Plan(waiting=(Wait("ns/p", "held by Kueue: QuotaReserved=False (Pending): ...", held=True),))
    assert placement_patches(busy, snapshot, {"ns/p": obj}, NOW + timedelta(seconds=1)) == []


class KueueKube(Kube):
    """``list_workloads`` and ``event``, in memory."""

    def __init__(self, workloads: list[dict[str, Any]] | None | KubeError) -> None:
        super().__init__(api=None)  # type: ignore[arg-type]
        self.workloads = workloads
        self.events: list[tuple[str, str, str]] = []
        self.listed = 0

    def list_workloads(self) -> list[dict[str, Any]] | None:
        self.listed += 1
        if isinstance(self.workloads, KubeError):
            raise self.workloads
        return self.workloads

    def event(self, involved: Any, type_: str, reason: str, message: str, host: str | None = None) -> None:
        self.events.append((f"{involved['namespace']}/{involved['name']}", type_, reason))


def _workload(uid: str, message: str) -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{uid}", "namespace": "ns", "ownerReferences": [{"kind": "Pod", "uid": uid}]},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                       "message": message}]}}


def test_the_controller_reads_workloads_only_while_a_pod_is_held() -> None:
    kube = KueueKube([_workload("uid-p", BEYOND), {"metadata": {"name": "bad", "namespace": "ns"}}])
    controller = Controller(kube, ControllerSettings(), clock=lambda: NOW)
    free = replace(shared_pod("q"), namespace="ns", name="q")
    assert controller._with_kueue(Snapshot((), (free,))).kueue_read is False and kube.listed == 0
    snapshot = controller._with_kueue(Snapshot((), (_held(), free)))
    assert kube.listed == 1 and snapshot.kueue_read and snapshot.kueue["uid-p"].never


@pytest.mark.parametrize("answer", [None, KubeError(403, "forbidden")], ids=["api-not-served", "read-fails"])
def test_without_kueues_api_the_snapshot_says_workloads_unread(answer: None | KubeError) -> None:
    controller = Controller(KueueKube(answer), ControllerSettings(), clock=lambda: NOW)
    snapshot = controller._with_kueue(Snapshot((), (_held(),)))
    assert snapshot.kueue_read is False and snapshot.kueue == {}


def test_the_never_event_is_written_once_per_pod() -> None:
    kube = KueueKube([])
    controller = Controller(kube, ControllerSettings(), clock=lambda: NOW)
    waits = (Wait("ns/p", "never admitted by Kueue", held=True, never=True), Wait("ns/q", "held by Kueue", held=True))
    controller._note_never_admitted(waits)
    controller._note_never_admitted(waits)
    assert kube.events == [("ns/p", "Warning", NEVER_EVENT)]


def test_a_cluster_without_kueue_is_asked_again_only_after_the_recheck_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def absent(self: Kube) -> None:
        calls.append(1)

    monkeypatch.setattr(Kube, "list_workloads", absent)
    cached = CachedKube(None, ClusterCaches({}))
    assert cached.list_workloads() is None and cached.list_workloads() is None and len(calls) == 1
    monkeypatch.setattr(time, "monotonic", lambda: 1e12)
    assert cached.list_workloads() is None and len(calls) == 2

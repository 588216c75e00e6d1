"""GPU faults in every decision: the controller's capacity and plans, the webhook's inventory and affinity.

A fault reaches the controller and the webhook only through ``GPUNode.status``
(``gpus[].health``, ``instances[].health``, ``summary.degraded``), read by
``sharing.api.gpunode``; these tests write such statuses and check that nothing
counts, plans on, reshapes or shares a faulted device, and that a degraded node
gets no new pod.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.planning.capacity import FreeCapacity
from controller.planning.planner import plan
from controller.state.build import build_snapshot
from controller.state.snapshot import Snapshot
from mig.catalog import get_model
from sharing.admission.decision import decide
from sharing.api.gpunode import read_gpunode
from sharing.admission.inventory import build_inventory
from sharing.api.keys import DEGRADED_LABEL, IDLE_SINCE_ANNOTATION
from sharing.rules.node_policy import NodePolicy
from sharing.api.request import parse_pod
from tests.unit.test_controller_planner import NOW, POLICY, mig_pod, shared_pod

H100 = get_model("H100-80GB")
FAULT = {"reason": "Xid48", "message": "double-bit ECC error", "xid": 48, "since": "2026-11-30T01:00:00Z",
         "recovery": "ResetGpu", "withdrawn": True}
ECC = {"reason": "EccUncorrectable", "message": "1 new uncorrected ECC error(s)", "since": "2026-11-30T01:00:00Z",
       "recovery": "ResetGpu", "withdrawn": False}


def gpunode(name: str, gpus: list[dict[str, Any]], *, degraded: bool = False, sharing: str = "none",
            replicas: int = 1) -> dict[str, Any]:
    idle = {str(g["index"]): "2026-11-30T00:00:00Z" for g in gpus}
    return {
        "apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode",
        "metadata": {"name": name, "generation": 1, "annotations": {IDLE_SINCE_ANNOTATION: json.dumps(idle)}},
        "spec": {"sharing": {"mode": sharing, "replicas": replicas}},
        "status": {"observedGeneration": 1, "product": H100.product, "gpus": gpus,
                   "sharing": {"mode": sharing, "replicas": replicas},
                   "summary": {"gpus": len(gpus), "degraded": degraded}},
    }


def mig_gpu(index: int, instances: list[tuple[str, int, int, bool]], health: dict[str, Any] | None = None,
            sick: set[int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": index, "uuid": f"GPU-{index}", "product": H100.product, "memoryMiB": H100.memory_mib,
        "migEnabled": True,
        "instances": [{"profile": p, "start": s, "size": z, "inUse": u, "giId": n + 1,
                       **({"health": FAULT} if sick and s in sick else {})}
                      for n, (p, s, z, u) in enumerate(instances)],
    }
    if health is not None:
        out["health"] = health
    return out


def full_gpu(index: int, health: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index, "uuid": f"GPU-{index}", "product": H100.product,
                           "memoryMiB": H100.memory_mib, "migEnabled": False}
    if health is not None:
        out["health"] = health
    return out


def snapshot(*objs: dict[str, Any]) -> Snapshot:
    return build_snapshot(objs, [], [], [])


SEVEN_1G = [("1g.10gb", s, 1, False) for s in range(7)]


# ---------------------------------------------------------------- the one reading


def test_the_reader_sees_gpu_and_instance_faults_and_degraded_nodes() -> None:
    reading = read_gpunode(gpunode("a", [mig_gpu(0, SEVEN_1G, sick={2}), mig_gpu(1, SEVEN_1G, health=FAULT)]))
    assert reading is not None
    g0, g1 = reading.gpus
    assert g0.healthy and g0.faulted and [i.start for i in g0.instances if not i.healthy] == [2]
    assert not g1.healthy and g1.health is not None and g1.health.xid == 48
    assert not reading.degraded  # both faults are withdrawn by the device plugin
    ecc = read_gpunode(gpunode("b", [full_gpu(0, ECC)]))
    assert ecc is not None and ecc.degraded  # the plugin keeps advertising an ECC-faulted GPU


def test_an_unreadable_health_entry_counts_as_a_fault() -> None:
    reading = read_gpunode(gpunode("a", [full_gpu(0, {"reason": "not a reason!", "since": "yesterday"})]))
    assert reading is not None
    (g,) = reading.gpus
    assert not g.healthy and g.health is not None and g.health.reason == "Unreadable"


# ------------------------------------------------------------------- controller


def test_free_capacity_leaves_out_faulted_gpus_and_instances_but_keeps_busy_ones() -> None:
    busy_on_sick = [("1g.10gb", 0, 1, True)] + SEVEN_1G[1:]
    snap = snapshot(gpunode("a", [mig_gpu(0, SEVEN_1G, sick={3, 4}), mig_gpu(1, busy_on_sick, health=FAULT)]))
    free = FreeCapacity.of(snap)
    # GPU 0: seven, two faulted -> 5 offered; GPU 1 faulted -> none offered, but its busy instance's user
    # still counts, as kube-scheduler counts it (allocatable 5, one request): 4 free.
    assert free.mig_free("a")["1g.10gb"] == 4


def test_a_degraded_node_gets_no_pod_and_no_plan() -> None:
    snap = snapshot(gpunode("a", [mig_gpu(0, SEVEN_1G)], degraded=True), gpunode("b", [mig_gpu(0, [])]))
    pods = (mig_pod("p"),)
    result = plan(Snapshot(snap.nodes, pods, {n.name: POLICY for n in snap.nodes}), NOW)
    assert all(r.node != "a" for r in result.releases)
    assert all(change.node != "a" for change in result.layouts)


def test_a_faulted_gpu_is_never_reshaped_and_its_neighbour_is() -> None:
    # Both GPUs idle and empty; GPU 0 has an instance fault (an instance that is not in use).
    sick = mig_gpu(0, [("1g.10gb", 0, 1, False)], sick={0})
    snap = snapshot(gpunode("a", [sick, mig_gpu(1, [])]))
    result = plan(Snapshot(snap.nodes, (mig_pod("p", "3g.40gb"),), {"a": POLICY}), NOW)
    assert [c.index for c in result.layouts] == [1]


def test_a_node_with_a_faulted_full_gpu_is_not_switched_to_sharing() -> None:
    snap = snapshot(gpunode("a", [full_gpu(0, FAULT), full_gpu(1)]), gpunode("b", [full_gpu(0), full_gpu(1)]))
    result = plan(Snapshot(snap.nodes, (shared_pod("p"),), {"a": POLICY, "b": POLICY}), NOW)
    assert [c.node for c in result.sharing] == ["b"]


def test_whole_gpu_capacity_counts_healthy_gpus_only() -> None:
    snap = snapshot(gpunode("a", [full_gpu(0, FAULT), full_gpu(1), full_gpu(2, FAULT)]))
    assert FreeCapacity.of(snap).whole["a"] == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["ok", "gpu", "inst", "ecc"])), min_size=1, max_size=4,
                unique_by=lambda t: t[0]),
       st.lists(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]), min_size=1, max_size=6))
def test_the_planner_never_chooses_a_faulted_gpu_or_a_degraded_node(faults: list[tuple[int, str]],
                                                                   profiles: list[str]) -> None:
    gpus = []
    for index, kind in sorted(faults):
        if kind == "gpu":
            gpus.append(mig_gpu(index, [("1g.10gb", 0, 1, False)], health=FAULT))
        elif kind == "inst":
            gpus.append(mig_gpu(index, [("1g.10gb", 0, 1, False), ("1g.10gb", 1, 1, False)], sick={0}))
        elif kind == "ecc":
            gpus.append(mig_gpu(index, [("1g.10gb", 0, 1, False)], health=ECC))
        else:
            gpus.append(mig_gpu(index, [("1g.10gb", 0, 1, False)]))
    snap = snapshot(gpunode("a", gpus))
    pods = tuple(mig_pod(f"p{n}", p, minutes=n) for n, p in enumerate(profiles))
    result = plan(Snapshot(snap.nodes, pods, {"a": NodePolicy(names=("p",), max_concurrent=4, idle_seconds=1)}), NOW)
    reading = read_gpunode(gpunode("a", gpus))
    assert reading is not None
    faulted = {g.index for g in reading.gpus if g.faulted}
    assert not {c.index for c in result.layouts} & faulted
    if reading.degraded:
        assert not result.releases and not result.layouts
    else:
        # A release uses a free, healthy instance: at most one per healthy free 1g on healthy GPUs.
        healthy_free = sum(1 for g in reading.gpus if g.healthy for i in g.instances if i.healthy and not i.in_use)
        assert len(result.releases) <= healthy_free + sum(1 for c in result.layouts for _ in c.create)


# ---------------------------------------------------------------------- webhook


def _pod(milli: str, mode: str = "mig") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team",
                                                            "annotations": {"gpupack.io/sharing": mode}},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"limits": {"gpupack.io/gpu-milli": milli}}}]}}


def test_the_webhook_counts_no_capacity_on_faulted_devices_or_degraded_nodes() -> None:
    only_sick = build_inventory([gpunode("a", [mig_gpu(0, [("1g.10gb", 0, 1, False)], sick={0})])])
    assert only_sick.nodes[0].free_instances("1g.10gb") == 0
    degraded = build_inventory([gpunode("a", [mig_gpu(0, [("1g.10gb", 0, 1, False)])], degraded=True)])
    assert degraded.nodes[0].free_instances("1g.10gb") == 0
    shared = build_inventory([gpunode("s", [full_gpu(0, FAULT), full_gpu(1)], sharing="mps", replicas=4)])
    assert shared.nodes[0].shared_free == 4
    request = parse_pod(_pod("100"))
    assert request is not None
    decision = decide(request, only_sick.policy_for("team"), only_sick)
    assert decision.gated  # no healthy capacity: the pod waits for the controller


def test_every_decision_keeps_pods_off_degraded_nodes() -> None:
    inventory = build_inventory([gpunode("a", [mig_gpu(0, SEVEN_1G)])])
    request = parse_pod(_pod("100"))
    assert request is not None
    decision = decide(request, inventory.policy_for("team"), inventory)
    assert decision.terms and all(any(e.key == DEGRADED_LABEL and e.operator == "DoesNotExist" for e in term)
                                  for term in decision.terms)


def test_pods_of_failed_devices_are_evicted_only_when_their_controller_recreates_them() -> None:
    from controller.planning.evictions import evictions

    sick = dict(FAULT, pods=["team/rs-pod", "team/ds-pod", "team/bare", "team/elsewhere"])
    snap = snapshot(gpunode("a", [mig_gpu(0, [("1g.10gb", 0, 1, True)], health=sick)]))
    (device,) = snap.failed_devices
    assert (device.node, device.where, device.reason) == ("a", "GPU 0", "Xid48")

    def pod(name: str, node: str, owner: str | None) -> dict[str, Any]:
        refs = [{"kind": owner, "name": "x", "controller": True}] if owner else []
        return {"metadata": {"namespace": "team", "name": name, "ownerReferences": refs}, "spec": {"nodeName": node},
                "status": {"phase": "Running"}}

    pods = {"team/rs-pod": pod("rs-pod", "a", "ReplicaSet"), "team/ds-pod": pod("ds-pod", "a", "DaemonSet"),
            "team/bare": pod("bare", "a", None), "team/elsewhere": pod("elsewhere", "b", "ReplicaSet")}
    assert [e.key for e in evictions(snap.failed_devices, pods)] == ["team/rs-pod"]

"""Pods stranded in the mode the webhook chose (issue 33, item 5, the burst): the rule and the action.

A burst of ``auto`` pods is decided against one GPUNode status: every pod sees the same free MPS
replicas and is recorded ``mps``. Once the MPS node is full, the ones left over wait in ``mps``
while MIG instances sit idle. The pods here are made by the webhook's own decision and patch
(``sharing.admission.decision``, ``sharing.admission.patch``), so the rule reads what the webhook really writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from controller.kube import Kube
from controller.planning.planner import Plan, Wait
from controller.state.pods import pod_from_object
from controller.planning.readmit import READMIT_AFTER_SECONDS, readmissions, stranded_in, with_messages
from controller.reconcile import Controller
from controller.settings import ControllerSettings
from controller.state.build import build_snapshot
from kube.errors import KubeError
from kube.times import format_time
from sharing.api.allocation import Allocation
from sharing.admission.decision import decide
from sharing.admission.inventory import DEFAULT_POLICY, Inventory, build_inventory
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE
from sharing.admission.patch import apply_patch, build_patch
from sharing.api.request import parse_pod
from gpupack.testing.admission_reviews import gpu_container, make_pod

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
OLD = NOW - timedelta(seconds=READMIT_AFTER_SECONDS + 5)


def mps_node(in_use: int) -> dict[str, Any]:
    """One A100 shared by MPS into 4 replicas, ``in_use`` of them taken."""
    gpu = {"index": 0, "uuid": "GPU-a", "product": "NVIDIA-A100-SXM4-80GB", "memoryMiB": 81920, "migEnabled": False}
    return {"kind": "GPUNode", "metadata": {"name": "mps-a"},
            "spec": {"sharing": {"mode": "mps", "replicas": 4}, "gpus": [{"index": 0, "migEnabled": False}]},
            "status": {"product": "NVIDIA-A100-SXM4-80GB", "gpus": [gpu],
                       "sharing": {"mode": "mps", "replicas": 4, "inUse": in_use}}}


def mig_node(idle: int) -> dict[str, Any]:
    """One H100 with three 2g.20gb instances, ``idle`` of them free (a 10Gi ask needs 2g: 1g holds 9.75 GiB)."""
    instances = [{"profile": "2g.20gb", "start": s, "size": 2, "inUse": i >= idle} for i, s in enumerate((0, 2, 4))]
    gpu = {"index": 0, "uuid": "GPU-h", "product": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "migEnabled": True,
           "instances": instances}
    return {"kind": "GPUNode", "metadata": {"name": "mig-h"},
            "spec": {"sharing": {"mode": "none", "replicas": 1}, "gpus": [{"index": 0, "migEnabled": True}]},
            "status": {"product": "NVIDIA-H100-80GB-HBM3", "gpus": [gpu]}}


def admitted(name: str, inventory: Inventory, *, mode: str | None = None, owned: bool = True,
             created: datetime = OLD) -> dict[str, Any]:
    """A 200-milli, 10Gi pod as the webhook's decision and patch leave it (gated: the engine places it)."""
    pod = make_pod(gpu_container("main", "200", "10Gi"), name=name, namespace="team", mode=mode)
    request = parse_pod(pod, "team")
    assert request is not None
    decision = decide(request, DEFAULT_POLICY, inventory, engine_places=True)
    out: dict[str, Any] = apply_patch(pod, build_patch(pod, decision))
    out["metadata"].update(uid=f"uid-{name}", resourceVersion="7", creationTimestamp=format_time(created))
    if owned:
        out["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "burst",
                                               "uid": "rs-uid", "controller": True}]
    return out


BURST_VIEW = build_inventory([mps_node(0), mig_node(3)])
"""What every pod of the burst was decided against: four free MPS replicas, three idle MIG instances."""


def record(obj: dict[str, Any]) -> Allocation:
    return Allocation.from_annotation(obj["metadata"]["annotations"][ALLOCATION_ANNOTATION])


def judge(obj: dict[str, Any], now_view: Inventory, now: datetime = NOW) -> str | None:
    pod = pod_from_object(obj)
    assert pod is not None
    return stranded_in(obj, record(obj), pod, DEFAULT_POLICY, now_view, now)


def test_a_burst_pod_is_recorded_mps_as_the_report_says() -> None:
    obj = admitted("p", BURST_VIEW)
    assert record(obj).mode == "mps" and record(obj).reason.startswith("auto -> mps")
    assert {"name": CAPACITY_GATE} in obj["spec"]["schedulingGates"]


def test_an_auto_pod_left_over_in_mps_is_stranded_when_mig_has_room_now() -> None:
    assert judge(admitted("p", BURST_VIEW), build_inventory([mps_node(4), mig_node(3)])) == "mig"


def test_not_stranded_when_the_other_mode_has_no_room_either() -> None:
    assert judge(admitted("p", BURST_VIEW), build_inventory([mps_node(4), mig_node(0)])) is None


def test_not_stranded_when_its_own_mode_has_room_now() -> None:
    assert judge(admitted("p", BURST_VIEW), build_inventory([mps_node(3), mig_node(3)])) is None


def test_a_pod_that_asked_for_mps_itself_is_never_moved() -> None:
    asked = admitted("p", BURST_VIEW, mode="mps")
    assert record(asked).reason.startswith("mps ->")
    assert judge(asked, build_inventory([mps_node(4), mig_node(3)])) is None


def test_a_pod_younger_than_the_wait_is_left_to_the_capacity_in_flight() -> None:
    young = admitted("p", BURST_VIEW, created=NOW - timedelta(seconds=READMIT_AFTER_SECONDS - 1))
    assert judge(young, build_inventory([mps_node(4), mig_node(3)])) is None


def _snapshot_of(pods: list[dict[str, Any]], gpunodes: list[dict[str, Any]]) -> Any:
    return build_snapshot(gpunodes, [], pods, [], now=NOW)


def test_only_the_pods_the_plan_leaves_waiting_and_at_most_the_limit() -> None:
    pods = [admitted(f"p{i}", BURST_VIEW) for i in range(4)]
    by_key = {f"team/{p['metadata']['name']}": p for p in pods}
    now_view = [mps_node(4), mig_node(3)]
    waiting = Plan(waiting=tuple(Wait(k, "no node shares GPUs by mps with a free replica") for k in list(by_key)[:3]))
    out = readmissions(waiting, _snapshot_of(pods, now_view), by_key, lambda: build_inventory(now_view), NOW, limit=2)
    assert [r.pod for r in out] == ["team/p0", "team/p1"]
    assert all((r.recorded, r.chosen, r.owner is not None) for r in out)


class FakeKube(Kube):
    """The calls a cycle makes, in memory; a delete checks its preconditions as the API server does."""

    def __init__(self, gpunodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        super().__init__(api=None)
        self.gpunodes, self.pods = gpunodes, {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        self.deleted: list[tuple[str, dict[str, str]]] = []
        self.events: list[tuple[dict[str, Any], str, str]] = []
        self.status: dict[str, dict[str, Any]] = {}

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return self.gpunodes

    def list_pods(self) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def list_nodes(self) -> list[dict[str, Any]]:
        return []

    def list_policies(self) -> list[dict[str, Any]]:
        return []

    def list_namespaces(self) -> list[dict[str, Any]]:
        return []

    def list_resource_claims(self) -> list[dict[str, Any]]:
        return []

    def patch_gpunode(self, name: str, body: Any) -> dict[str, Any] | None:
        return None

    def patch_pod_status(self, namespace: str, name: str, body: Any) -> dict[str, Any] | None:
        self.status[f"{namespace}/{name}"] = body
        return None

    def delete_pod(self, namespace: str, name: str, uid: str, resource_version: str) -> bool:
        if f"{namespace}/{name}" not in self.pods:
            return False
        meta = self.pods[f"{namespace}/{name}"]["metadata"]
        if (meta["uid"], meta["resourceVersion"]) != (uid, resource_version):
            raise KubeError(409, "precondition failed")
        self.deleted.append((f"{namespace}/{name}", {"uid": uid, "resourceVersion": resource_version}))
        del self.pods[f"{namespace}/{name}"]
        return True

    def event(self, involved: Any, type_: str, reason: str, message: str, host: str | None = None) -> None:
        self.events.append((dict(involved), reason, message))


def _cycle(kube: FakeKube) -> Any:
    settings = ControllerSettings()
    return Controller(kube, settings, clock=lambda: NOW).cycle()


def test_an_owned_stranded_pod_is_deleted_with_preconditions_for_its_owner_to_recreate() -> None:
    pod = admitted("owned", BURST_VIEW)
    kube = FakeKube([mps_node(4), mig_node(3)], [pod])
    report = _cycle(kube)
    assert kube.deleted == [("team/owned", {"uid": "uid-owned", "resourceVersion": "7"})], report.errors
    assert report.readmitted == ["team/owned"]
    (owner, reason, message), = kube.events
    assert (owner["kind"], owner["name"], owner["namespace"], reason) == ("ReplicaSet", "burst", "team", "Readmitted")
    assert "recorded mps" in message and "mig has room now" in message
    assert "team/owned" not in kube.status  # nothing said on a pod that is gone


def test_a_bare_stranded_pod_is_never_deleted_and_is_told_how_to_choose_again() -> None:
    pod = admitted("bare", BURST_VIEW, owned=False)
    kube = FakeKube([mps_node(4), mig_node(3)], [pod])
    report = _cycle(kube)
    assert kube.deleted == [] and report.readmitted == []
    conditions = kube.status["team/bare"]["status"]["conditions"]
    assert any("delete and re-create the pod to let gpupack choose again" in c["message"] for c in conditions)


def test_a_pod_changed_since_it_was_read_is_left_alone() -> None:
    pod = admitted("owned", BURST_VIEW)
    kube = FakeKube([mps_node(4), mig_node(3)], [pod])
    real_list = kube.list_pods

    def stale_list() -> list[dict[str, Any]]:
        listed = [dict(p, metadata={**p["metadata"], "resourceVersion": "6"}) for p in real_list()]
        return listed

    kube.list_pods = stale_list  # type: ignore[method-assign]
    report = _cycle(kube)
    assert kube.deleted == [] and report.readmitted == [] and not report.errors


def test_with_messages_keeps_the_other_waits() -> None:
    plan = Plan(waiting=(Wait("a/x", "r1"), Wait("a/y", "r2")))
    assert with_messages(plan, {}, {"a/x"}).waiting == (Wait("a/y", "r2"),)


def test_a_pod_a_stale_cache_still_lists_is_not_announced_twice() -> None:
    pod = admitted("owned", BURST_VIEW)
    kube = FakeKube([mps_node(4), mig_node(3)], [pod])
    _cycle(kube)
    kube.list_pods = lambda: [pod]  # type: ignore[method-assign]  # the watch has not seen the delete yet
    report = _cycle(kube)
    assert len(kube.events) == 1 and report.readmitted == [] and not report.errors
    assert "team/owned" not in kube.status


def test_a_right_sized_pod_is_re_decided_with_its_predicted_use() -> None:
    from controller.planning.readmit import request_of
    from sharing.api.allocation import Allocation, ContainerAllocation

    allocation = Allocation("mps", False, True, "", "", (
        ContainerAllocation("main", "containers", 75, 12 * 1024**3, "nvidia.com/gpu.shared", None, 150),))
    pod = {"spec": {"containers": [{"name": "main"}]}}
    (container,) = request_of(pod, allocation, "team", "p").containers
    assert (container.milli, container.predicted_milli, container.memory_bytes) == (75, 150, 12 * 1024**3)


def test_a_pod_kueue_holds_is_never_readmitted_as_stranded() -> None:
    """It waits for its quota, not for capacity: deleting it would only put it back in Kueue's queue."""
    pods = [admitted(f"p{i}", BURST_VIEW) for i in range(2)]
    by_key = {f"team/{p['metadata']['name']}": p for p in pods}
    now_view = [mps_node(4), mig_node(3)]
    waiting = Plan(waiting=(Wait("team/p0", "held by Kueue", held=True), Wait("team/p1", "no free replica")))
    out = readmissions(waiting, _snapshot_of(pods, now_view), by_key, lambda: build_inventory(now_view), NOW)
    assert [r.pod for r in out] == ["team/p1"]

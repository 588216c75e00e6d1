"""The controller on the DRA pool: reading claims' usage, building the pinned claim, and the cycle's
writes (claim create, adopt, refuse) against a fake API (``controller.kube.Kube``'s calls)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from dataclasses import dataclass, replace
from typing import Any, Literal

import pytest

from controller.writes.dra_claims import ClaimBuildError, claim_body, claim_requests
from controller.state.dra_usage import read_usage
from controller.reconcile import Controller
from controller.settings import ControllerSettings
from controller.state.build import node_from_objects
from kube.errors import KubeError
from mig.catalog import get_model
from sharing.api.allocation import Allocation, ContainerAllocation, resource_for
from sharing.api.backend import POD_CLAIM
from sharing.dra import names
from sharing.admission.dra_claims import device_request
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice
from sharing.dra.share_config import claim_config
from sharing.dra.share_policy import SHARES, GiB, SharePolicy
from sharing.api.keys import ALLOCATION_ANNOTATION, BACKEND_LABEL, CAPACITY_GATE, DRA_REQUEUES_ANNOTATION, HOSTNAME_LABEL
from sharing.api.modes import AllocationMode

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)


# ------------------------------------------------------------------ objects as the API holds them
def dra_allocation(mode: AllocationMode, claim: str, milli: Sequence[int] = (300,),
                   memory: Sequence[int | None] | None = None, profiles: Sequence[str | None] | None = None,
                   fallback: tuple[str, ...] | None = None) -> Allocation:
    """The record the webhook writes on a DRA pod (``sharing.api.allocation``)."""
    memory = memory or [None] * len(milli)
    profiles = profiles or [None] * len(milli)
    containers = tuple(ContainerAllocation(f"c{k}", "containers", m, b, f"gpu-{k}", p)
                       for k, (m, b, p) in enumerate(zip(milli, memory, profiles)))
    return Allocation(mode=mode, gated=True, capacity_existed=True, policy="", reason="test", containers=containers,
                      backend="dra", claim=claim, mig_fallback=fallback)


def dra_pod(name: str, namespace: str, allocation: Allocation, uid: str | None = None,
            created: str = "2026-11-30T01:00:00Z", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod exactly as the webhook admits it to the DRA pool: gated, its record, the reference to a
    claim that does not exist yet, each container naming its request, affinity to the pool."""
    containers = [{"name": c.name, "image": "registry.k8s.io/pause:3.10",
                   "resources": {"claims": [{"name": POD_CLAIM, "request": c.resource}]}}
                  for c in allocation.containers]
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": CAPACITY_GATE}],
        "resourceClaims": [{"name": POD_CLAIM, "resourceClaimName": allocation.claim}],
        "containers": containers,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": BACKEND_LABEL, "operator": "In", "values": ["dra"]}]}]}}},
        **(extra or {}),
    }
    meta = {"name": name, "namespace": namespace, "creationTimestamp": created,
            "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()}}
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpunode(name: str, gpus: int, sharing: str = "mps") -> dict[str, Any]:
    listed = [{"index": i, "uuid": f"GPU-{name}-{i}", "product": H100.product, "memoryMiB": H100.memory_mib,
               "migEnabled": False} for i in range(gpus)]
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode",
            "metadata": {"name": name, "generation": 1},
            "spec": {"sharing": {"mode": sharing, "replicas": 1}},
            "status": {"observedGeneration": 1, "product": H100.product, "gpus": listed,
                       "sharing": {"mode": sharing, "replicas": 1}, "summary": {"gpus": gpus}}}


def node_object(name: str, dra: bool = True) -> dict[str, Any]:
    labels = {HOSTNAME_LABEL: name, **({BACKEND_LABEL: "dra"} if dra else {})}
    return {"metadata": {"name": name, "labels": labels}}


# ------------------------------------------------------------------ reading usage
def test_usage_reads_allocations_and_promises_and_names_what_it_skips() -> None:
    nodes = [node for node in [node_from_objects(gpunode("a", 2), node_object("a"))] if node is not None]
    share = {"request": "gpu-0", "driver": names.DRIVER, "pool": "a", "device": "gpu-1-shared",
             "consumedCapacity": {names.MILLI: "150", names.MEMORY: "2Gi"}}
    claims: list[dict[str, Any]] = [
        {"metadata": {"namespace": "n", "name": "alloc"}, "status": {"allocation": {"devices": {"results": [
            share,
            {**share, "device": "gpu-9-mig-1g-10gb-6"},  # no such GPU on the node
            {**share, "driver": "other.example.com"},  # another driver's: ignored, no problem
            {**share, "device": "gpu-0-shared", "consumedCapacity": {names.MILLI: "lots"}},
        ]}}}},
        {"metadata": {"namespace": "n", "name": "promise", "annotations": {
            ANNOTATION: Pinned("a", (PinnedDevice("gpu-0", "gpu", 0),)).to_annotation()}}},
        {"metadata": {"namespace": "n", "name": "gone", "deletionTimestamp": "2026-11-30T01:00:00Z",
                      "annotations": {ANNOTATION: Pinned("a", (PinnedDevice("gpu-0", "gpu", 1),)).to_annotation()}}},
    ]
    usage = read_usage(claims, nodes)
    assert [(h.claim, h.device.device, h.device.milli, h.device.memory_bytes, h.allocated) for h in usage.holds] == [
        ("n/alloc", "gpu-1-shared", 150, 2 * GiB, True), ("n/promise", "gpu-0", 0, 0, False)]
    assert len(usage.problems) == 2 and "gpu-9-mig-1g-10gb-6" in usage.problems[0]
    assert set(usage.claims) == {"n/alloc", "n/promise", "n/gone"}


# ------------------------------------------------------------------ the claim
MIXED = Pinned("a", (PinnedDevice("gpu-0", "shared", 1, 150, 20 * GiB), PinnedDevice("gpu-1", "shared", 0, 500, GiB)))


def test_the_claim_is_device_request_plus_the_pins_owned_by_the_pod() -> None:
    allocation = dra_allocation("mps", "gpupack-pod-1", milli=(120, 500), memory=(20 * GiB, None))
    pod = dra_pod("p", "team", allocation, uid="uid-1")
    body = claim_body(pod, allocation, MIXED, SharePolicy())
    assert body["metadata"]["name"] == "gpupack-pod-1" and body["metadata"]["namespace"] == "team"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-1", "controller": True}]
    assert Pinned.from_annotation(body["metadata"]["annotations"][ANNOTATION]) == MIXED
    first, second = body["spec"]["devices"]["requests"]
    plain = device_request("gpu-0", "mps", _Shape(120, 20 * GiB), SharePolicy())
    assert first["exactly"]["capacity"] == plain["exactly"]["capacity"]
    assert first["exactly"]["selectors"] == [*plain["exactly"]["selectors"], *MIXED.devices[0].selectors()]
    assert second["exactly"]["selectors"][-1]["cel"]["expression"].endswith(".index == 0")
    assert "config" not in body["spec"]["devices"]  # not right-sized: no share config


def test_a_right_sized_pods_claim_carries_its_predicted_use() -> None:
    plain = dra_allocation("mps", "gpupack-pod-1", milli=(120, 500), memory=(20 * GiB, None))
    sized = replace(plain, containers=(replace(plain.containers[0], predicted_milli=240), plain.containers[1]))
    body = claim_body(dra_pod("p", "team", sized, uid="uid-1"), sized, MIXED, SharePolicy())
    assert body["spec"]["devices"]["config"] == claim_config(sized)
    (entry,) = body["spec"]["devices"]["config"]
    assert entry["requests"] == [sized.containers[0].resource]
    assert entry["opaque"]["parameters"]["predictedMilli"] == 240


@dataclass(frozen=True)
class _Shape:
    """A container as ``device_request`` reads it."""

    milli: int
    memory_bytes: int | None
    kind: Literal["containers", "initContainers"] = "containers"
    index: int = 0
    profile: str | None = None


def test_a_request_without_a_chosen_device_is_refused() -> None:
    allocation = dra_allocation("mps", "c", milli=(100, 100))
    with pytest.raises(ClaimBuildError, match="'gpu-1'"):
        claim_requests(allocation, Pinned("a", (MIXED.devices[0],)), SharePolicy())
    with pytest.raises(ClaimBuildError, match="no name, no UID"):
        claim_body(dra_pod("p", "team", allocation), allocation, MIXED, SharePolicy())


def test_a_share_placed_on_mig_asks_the_mig_class_for_the_pinned_profile_and_placement() -> None:
    allocation = dra_allocation("mps", "c", milli=(300, 200), memory=(30 * GiB, None), fallback=("3g.40gb", "1g.10gb"))
    pinned = Pinned("m", (PinnedDevice("gpu-0", "mig", 1, profile="3g.40gb", start=4),
                          PinnedDevice("gpu-1", "mig", 0, profile="1g.10gb", start=6)))
    requests = claim_requests(allocation, pinned, SharePolicy())
    for request, device, milli, memory in zip(requests, pinned.devices, (300, 200), (30 * GiB, None)):
        plain = device_request(device.request, "mig", _Shape(milli, memory, profile=device.profile), SharePolicy())
        assert request["exactly"]["deviceClassName"] == names.MIG_CLASS and "capacity" not in request["exactly"]
        assert request["exactly"]["selectors"] == [*plain["exactly"]["selectors"], *device.selectors()]
    assert '"1g.10gb"' in requests[1]["exactly"]["selectors"][0]["cel"]["expression"]  # the pinned profile
    # The same record given a share still asks for one.
    shared = claim_requests(allocation, MIXED, SharePolicy())
    assert [r["exactly"]["deviceClassName"] for r in shared] == [names.SHARED_CLASS] * 2


@pytest.mark.parametrize(("allocation", "device", "says"), [
    (dra_allocation("mps", "c"), PinnedDevice("gpu-0", "mig", 0, profile="3g.40gb", start=4),
     "MIG profile '3g.40gb' was chosen; the record allows no MIG instance"),
    (dra_allocation("mps", "c", fallback=("1g.10gb",)), PinnedDevice("gpu-0", "mig", 0, profile="3g.40gb", start=4),
     "the record allows 1g.10gb"),
    (dra_allocation("mig", "c", profiles=("1g.10gb",)), PinnedDevice("gpu-0", "shared", 0, 300, GiB),
     "a share was chosen for a pod of mode 'mig'"),
], ids=["share-without-fallback", "another-profile", "share-for-mig"])
def test_a_device_the_record_does_not_allow_is_refused(allocation: Allocation, device: PinnedDevice, says: str) -> None:
    with pytest.raises(ClaimBuildError, match="'gpu-0'") as caught:
        claim_requests(allocation, Pinned("a", (device,)), SharePolicy())
    assert says in str(caught.value)


# ------------------------------------------------------------------ the cycle against a fake API
class FakeKube:
    """The calls ``Controller.cycle`` makes, over dicts; records writes."""

    def __init__(self, gpunodes: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.gpunodes, self.nodes, self.pods = gpunodes, nodes, pods
        self.claims: dict[str, dict[str, Any]] = {}
        self.pod_patches: list[tuple[str, list[dict[str, Any]]]] = []
        self.status_patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, str]] = []
        self.claim_list_error: KubeError | None = None
        self.lost_create_answers = 0
        self.deleted: list[str] = []

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return self.gpunodes

    def list_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    def list_policies(self) -> list[dict[str, Any]]:
        return []

    def list_namespaces(self) -> list[dict[str, Any]]:
        return []

    def patch_gpunode(self, name: str, body: Any) -> None:
        pass

    def json_patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        self.pod_patches.append((f"{namespace}/{name}", ops))

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.status_patches.append((f"{namespace}/{name}", body))

    def event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((f"{involved['namespace']}/{involved['name']}", reason, message))

    def list_resource_claims(self) -> list[dict[str, Any]]:
        if self.claim_list_error is not None:
            raise self.claim_list_error
        return list(self.claims.values())

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get(f"{namespace}/{name}")

    def delete_resource_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        key = f"{namespace}/{name}"
        found = self.claims.get(key)
        if found is None:
            return
        meta = found["metadata"]
        if (meta.get("uid"), meta.get("resourceVersion")) != (uid, resource_version):
            raise KubeError(409, f"resourceclaims {key}: precondition failed")
        del self.claims[key]
        self.deleted.append(key)

    def create_resource_claim(self, namespace: str, body: dict[str, Any]) -> None:
        key = f"{namespace}/{body['metadata']['name']}"
        if key in self.claims:
            raise KubeError(409, f"resourceclaims {key} already exists")
        self.claims[key] = json.loads(json.dumps(body))
        if self.lost_create_answers:
            self.lost_create_answers -= 1
            raise KubeError(409, "the create went through but its answer was lost; the retry conflicts")


def controller(kube: FakeKube) -> Controller:
    return Controller(kube, ControllerSettings(), clock=lambda: NOW)  # type: ignore[arg-type]


def cluster(*pods: dict[str, Any]) -> FakeKube:
    return FakeKube([gpunode("a", 2), gpunode("plugin", 2)], [node_object("a"), node_object("plugin", dra=False)],
                    list(pods))


def pinned_node(ops: list[dict[str, Any]]) -> list[str]:
    return [o["value"]["values"][0] for o in ops if o["op"] == "add" and o["value"].get("key") == HOSTNAME_LABEL]


def test_a_cycle_creates_the_pinned_claim_then_pins_and_ungates_the_pod() -> None:
    kube = cluster(dra_pod("p", "team", dra_allocation("mps", "gpupack-pod-p"), uid="uid-p"))
    report = controller(kube).cycle()
    assert report.errors == [] and report.released == ["team/p"]
    claim = kube.claims["team/gpupack-pod-p"]
    pinned = Pinned.from_annotation(claim["metadata"]["annotations"][ANNOTATION])
    assert pinned.node == "a"  # the plugin node, though it has GPUs, is not the DRA pool's
    (release,) = kube.pod_patches  # pinned and ungated in one patch
    assert pinned_node(release[1]) == ["a"] and release[1][-1] == {"op": "remove", "path": "/spec/schedulingGates"}
    assert report.plan.releases == ()  # the device-plugin planner never saw the DRA pod


def test_a_claim_whose_create_answer_was_lost_is_adopted() -> None:
    kube = cluster(dra_pod("p", "team", dra_allocation("mps", "gpupack-pod-p"), uid="uid-p"))
    kube.lost_create_answers = 1
    report = controller(kube).cycle()
    assert report.errors == [] and report.released == ["team/p"]
    assert pinned_node(kube.pod_patches[0][1]) == ["a"]


def test_a_claim_that_is_not_the_pods_stops_its_release_with_one_event() -> None:
    kube = cluster(dra_pod("p", "team", dra_allocation("mps", "taken"), uid="uid-p"))
    kube.claims["team/taken"] = {"metadata": {"namespace": "team", "name": "taken"}}
    control = controller(kube)
    for _ in range(2):
        report = control.cycle()
        assert report.released == [] and kube.pod_patches == []
    assert [(pod, reason) for pod, reason, _ in kube.events] == [("team/p", "ClaimNotOwned")]
    assert "not this pod's" in report.dra.refused[0].reason


def test_a_cycle_places_an_auto_share_on_mig_when_the_shared_gpu_is_full() -> None:
    spare = {"profile": "3g.40gb", "start": 4, "size": 4}
    mig = gpunode("m", 1, sharing="none")
    mig["status"]["gpus"][0].update(migEnabled=True, instances=[spare])
    full = {"metadata": {"namespace": "other", "name": "held"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu-0", "driver": names.DRIVER, "pool": "a", "device": "gpu-0-shared",
         "consumedCapacity": {names.MILLI: "900", names.MEMORY: "1Gi"}}]}}}}
    allocation = dra_allocation("mps", "gpupack-pod-p", milli=(300,), memory=(30 * GiB,), fallback=("3g.40gb",))
    kube = FakeKube([gpunode("a", 1), mig], [node_object("a"), node_object("m")],
                    [dra_pod("p", "team", allocation, uid="uid-p")])
    kube.claims["other/held"] = full
    report = controller(kube).cycle()
    assert report.errors == [] and report.released == ["team/p"]
    claim = kube.claims["team/gpupack-pod-p"]
    assert Pinned.from_annotation(claim["metadata"]["annotations"][ANNOTATION]) == Pinned(
        "m", (PinnedDevice("gpu-0", "mig", 0, profile="3g.40gb", start=4),))
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == names.MIG_CLASS
    assert pinned_node(kube.pod_patches[0][1]) == ["m"]


def whole_plugin_pod() -> dict[str, Any]:
    """A gated whole-GPU pod of the device-plugin backend (``nvidia.com/gpu: 1``)."""
    resource = str(resource_for("whole", None))
    record = Allocation(mode="whole", gated=True, capacity_existed=True, policy="", reason="",
                        containers=(ContainerAllocation("c", "containers", 1000, None, resource),))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "w", "namespace": "team", "uid": "uid-w", "creationTimestamp": "2026-11-30T01:00:00Z",
        "annotations": {ALLOCATION_ANNOTATION: record.to_annotation()}},
        "spec": {"schedulingGates": [{"name": CAPACITY_GATE}], "containers": [
            {"name": "c", "resources": {"limits": {resource: "1"}}}]}}


def test_unreadable_claims_stop_the_dra_pool_only() -> None:
    plugin_pod = whole_plugin_pod()
    kube = FakeKube([gpunode("a", 2), gpunode("plugin", 2, sharing="none")],
                    [node_object("a"), node_object("plugin", dra=False)],
                    [dra_pod("p", "team", dra_allocation("mps", "c-p"), uid="uid-p"), plugin_pod])
    kube.claim_list_error = KubeError(403, "resourceclaims is forbidden")
    report = controller(kube).cycle()
    assert report.released == ["team/w"] and kube.claims == {}
    assert [e for e in report.errors if e.startswith("dra-claims")] and len(report.errors) == 1


def test_a_foreign_claim_created_between_list_and_create_stops_the_release() -> None:
    kube = cluster(dra_pod("p", "team", dra_allocation("mps", "c-p"), uid="uid-p"))
    original = kube.create_resource_claim

    def racing(namespace: str, body: dict[str, Any]) -> None:
        kube.claims[f"{namespace}/c-p"] = {"metadata": {"namespace": namespace, "name": "c-p", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "q", "uid": "uid-q"}]}}
        original(namespace, body)

    kube.create_resource_claim = racing  # type: ignore[method-assign]
    report = controller(kube).cycle()
    assert report.released == [] and kube.pod_patches == []
    assert [reason for _, reason, _ in kube.events] == ["ClaimNotOwned"]
    assert any("not this pod's" in e for e in report.errors)


def test_the_device_plugin_planner_never_uses_a_dra_node() -> None:
    pod = whole_plugin_pod()
    only_dra = FakeKube([gpunode("a", 2, sharing="none")], [node_object("a")], [pod])
    assert controller(only_dra).cycle().released == []
    both = FakeKube([gpunode("a", 2, sharing="none"), gpunode("plugin", 2, sharing="none")],
                    [node_object("a"), node_object("plugin", dra=False)], [pod])
    assert controller(both).cycle().plan.releases[0].node == "plugin"


# ------------------------------------------------------------------ the cluster figures
def test_a_dra_gpu_counts_what_its_claims_hold() -> None:
    from controller.metrics import cluster_figures
    from controller.state.snapshot import Snapshot

    node = node_from_objects(gpunode("a", 2), node_object("a"))
    assert node is not None
    claims: list[dict[str, Any]] = [
        {"metadata": {"namespace": "n", "name": f"c{k}"}, "status": {"allocation": {"devices": {"results": [
            {"request": "gpu-0", "driver": names.DRIVER, "pool": "a", "device": "gpu-1-shared",
             "consumedCapacity": {names.MILLI: milli, names.MEMORY: "1Gi"}}]}}}}
        for k, milli in enumerate(("250", "500"))
    ]
    holds = read_usage(claims, [node]).holds
    ratio, fragmentation, gpus = cluster_figures(Snapshot(nodes=(node,), pods=()), holds)
    assert gpus == 2
    assert ratio == pytest.approx(0.75 / 2)  # GPU 1 holds 750 milli, GPU 0 nothing
    assert fragmentation == pytest.approx(0.25 / 1.25)  # of 1.25 GPUs free, 0.25 is on the shared GPU
    assert cluster_figures(Snapshot(nodes=(node,), pods=()))[0] == 0.0  # no claims: nothing held


def test_a_cycle_pins_and_ungates_a_pod_that_asks_for_no_gpu_without_a_claim() -> None:
    from sharing.admission.decision import cpu_pod_decision

    record = cpu_pod_decision().allocation()
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "cpu", "namespace": "team", "uid": "uid-cpu", "creationTimestamp": "2026-11-30T01:00:00Z",
                        "labels": {BACKEND_LABEL: "dra"},
                        "annotations": {ALLOCATION_ANNOTATION: record.to_annotation()}},
           "spec": {"schedulingGates": [{"name": CAPACITY_GATE}],
                    "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": BACKEND_LABEL, "operator": "In", "values": ["dra"]}]}]}}}}}
    kube = cluster(pod)
    report = controller(kube).cycle()
    assert report.errors == [] and report.released == ["team/cpu"]
    assert kube.claims == {}  # no GPU, no claim
    (release,) = kube.pod_patches
    assert pinned_node(release[1]) == ["a"] and release[1][-1] == {"op": "remove", "path": "/spec/schedulingGates"}


def test_a_released_pods_claim_whose_device_a_users_claim_took_is_replaced_on_its_node() -> None:
    kube = cluster(dra_pod("p", "team", dra_allocation("mps", "gpupack-pod-p", milli=(400,)), uid="uid-p"))
    first = controller(kube)
    assert first.cycle().released == ["team/p"]
    claim = kube.claims["team/gpupack-pod-p"]
    gpu = Pinned.from_annotation(claim["metadata"]["annotations"][ANNOTATION]).devices[0].gpu
    claim["metadata"].update(uid="claim-uid-1", resourceVersion="5")
    pod = kube.pods[0]
    pod["spec"].pop("schedulingGates")  # as the release left it: pinned to a, ungated, not bound
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"].append({"key": HOSTNAME_LABEL, "operator": "In", "values": ["a"]})
    # Before kube-scheduler allocated it, a user's own claim was allocated 700 milli of that GPU.
    kube.claims["other/users"] = {"metadata": {"namespace": "other", "name": "users"}, "status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.gpupack.io", "pool": "a",
                                 "device": f"gpu-{gpu}-shared",
                                 "consumedCapacity": {"gpu.gpupack.io/milli": "700",
                                                      "gpu.gpupack.io/memory": "1Gi"}}]}}}}
    del kube.pod_patches[:]
    report = first.cycle()
    assert report.errors == [] and report.released == ["team/p"]
    assert kube.deleted == ["team/gpupack-pod-p"]
    again = Pinned.from_annotation(kube.claims["team/gpupack-pod-p"]["metadata"]["annotations"][ANNOTATION])
    assert again.node == "a" and again.devices[0].gpu != gpu  # the same node, the other GPU
    assert kube.pod_patches == []  # the pod is pinned and ungated already: nothing to write on it


def test_a_requeued_claim_carries_its_count() -> None:
    body = claim_body({"metadata": {"name": "p", "uid": "u1", "namespace": "team"}},
                      dra_allocation("mps", "claim-p", milli=(100,)), Pinned("a", (PinnedDevice("gpu-0", "shared", 0, 100, 2**30),)), SHARES, 2)
    assert body["metadata"]["annotations"][DRA_REQUEUES_ANNOTATION] == "2"
    first = claim_body({"metadata": {"name": "p", "uid": "u1", "namespace": "team"}},
                       dra_allocation("mps", "claim-p", milli=(100,)), Pinned("a", (PinnedDevice("gpu-0", "shared", 0, 100, 2**30),)), SHARES)
    assert DRA_REQUEUES_ANNOTATION not in first["metadata"]["annotations"]

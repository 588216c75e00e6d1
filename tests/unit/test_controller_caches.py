"""controller.watch_caches: reads answered from the watch caches, what is kept of each object, which
changes wake a cycle, and reading past a cache that has not seen the controller's own write yet."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from controller.watch_caches import CachedKube, ClusterCaches, keep_node, keep_pod
from controller.kube import Kube
from kube.informer import Informer


class Answer:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


def lister(*items: dict[str, Any]) -> Callable[..., Answer]:
    def call(**_: Any) -> Answer:
        return Answer({"metadata": {"resourceVersion": "100"}, "items": list(items)})
    return call


def obj(name: str, rv: str, namespace: str | None = None, **rest: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, **rest}


def node(name: str, rv: str, labels: dict[str, str], **status: Any) -> dict[str, Any]:
    out = obj(name, rv, status=status)
    out["metadata"]["labels"] = labels
    return out


def gpunode(name: str, rv: str, beat: str = "2026-12-01T00:00:00Z", percent: int = 10,
            layout: str = "1g.10gb") -> dict[str, Any]:
    return obj(name, rv, spec={"gpus": [{"index": 0, "layout": [{"profile": layout}]}]},
               status={"heartbeatTime": beat, "gpus": [{"index": 0, "utilization": {"gpuPercent": percent}}]})


def synced(caches: ClusterCaches, *kinds: str) -> ClusterCaches:
    """The caches as if started and listed (no threads: the lists are read here)."""
    for kind in kinds:
        caches.informers[kind].relist()
        caches.started.add(kind)
    return caches


def cached_kube(caches: ClusterCaches) -> CachedKube:
    return CachedKube(client.ApiClient(), caches)


def test_reads_come_from_the_caches_once_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    node = gpunode("n1", "5")
    caches = synced(ClusterCaches({"gpunodes": lister(node), "pods": lister()}), "gpunodes")
    kube = cached_kube(caches)
    monkeypatch.setattr(Kube, "list_pods", lambda self: [obj("direct", "1", "ns")])
    assert kube.list_gpunodes() == [node]
    # The pod cache has not listed yet: its kind is read by a direct list meanwhile.
    assert [p["metadata"]["name"] for p in kube.list_pods()] == ["direct"]
    assert kube.listed_directly == 1
    synced(caches, "pods")
    assert kube.list_pods() == []
    assert kube.listed_directly == 1


def test_claims_are_cached_only_once_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    claim = obj("c1", "3", "ns")
    caches = ClusterCaches({"resourceclaims": lister(claim), "gpunodes": lister()})
    started: list[str] = []
    monkeypatch.setattr(Informer, "start", lambda self: started.append(self.name) or self.relist() or self)
    caches.start()
    assert started == ["gpunodes"]  # claims are not among the kinds started with the caches
    kube = cached_kube(caches)
    assert kube.list_resource_claims() == [claim]
    assert started == ["gpunodes", "resourceclaims"] and kube.listed_directly == 0


def test_kept_pod_and_node_lose_what_the_controller_never_reads() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ns", "managedFields": [{"manager": "x"}], "annotations": {"a": "b"}},
           "spec": {"volumes": [{"name": "v"}], "nodeName": "n1", "schedulingGates": [{"name": "g"}],
                    "containers": [{"name": "c", "image": "x", "env": [{"name": "E"}],
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready"}], "containerStatuses": [{"name": "c"}]}}
    assert keep_pod(pod) == {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "annotations": {"a": "b"}},
        "spec": {"nodeName": "n1", "schedulingGates": [{"name": "g"}],
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}]}}
    node = {"metadata": {"name": "n1", "uid": "u", "resourceVersion": "7", "labels": {"l": "v"},
                         "managedFields": [{}], "annotations": {"big": "x" * 100}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"allocatable": {"cpu": "8"}, "images": [{"names": ["a"]}], "conditions": [{"type": "Ready"}]}}
    assert keep_node(node) == {"metadata": {"name": "n1", "uid": "u", "resourceVersion": "7", "labels": {"l": "v"}},
                               "status": {"allocatable": {"cpu": "8"}}}


def test_heartbeats_and_node_status_noise_wake_no_cycle() -> None:
    woken: list[str] = []
    caches = ClusterCaches({"gpunodes": lister(gpunode("n1", "1")), "nodes": lister(node("n1", "1", {"a": "1"})),
                            "pods": lister()}, on_change=woken.append)
    for kind in ("gpunodes", "nodes", "pods"):
        caches.informers[kind].relist()
    assert sorted(woken) == ["gpunodes", "nodes"]  # the first list: everything is new
    woken.clear()
    gpunodes, nodes, pods = (caches.informers[k] for k in ("gpunodes", "nodes", "pods"))
    gpunodes.apply({"type": "MODIFIED", "object": gpunode("n1", "2", beat="2026-12-01T00:01:00Z", percent=55)})
    nodes.apply({"type": "MODIFIED", "object": node("n1", "2", {"a": "1"}, images=[{"names": ["x"]}])})
    assert woken == []
    gpunodes.apply({"type": "MODIFIED", "object": gpunode("n1", "3", layout="3g.40gb")})
    nodes.apply({"type": "MODIFIED", "object": node("n1", "3", {"a": "2"})})
    pods.apply({"type": "ADDED", "object": obj("p", "4", "ns")})
    nodes.apply({"type": "DELETED", "object": node("n1", "5", {"a": "2"})})
    assert woken == ["gpunodes", "nodes", "pods", "nodes"]


def test_cached_kube_remembers_its_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    pod = obj("p", "1", "ns", spec={"schedulingGates": [{"name": "gpupack.io/capacity"}]})
    caches = synced(ClusterCaches({"pods": lister(pod)}), "pods")
    kube = cached_kube(caches)
    answer = obj("p", "2", "ns", spec={}, status={"phase": "Pending"})
    answer["metadata"]["managedFields"] = [{"manager": "gpupack"}]
    monkeypatch.setattr(Kube, "json_patch_pod", lambda self, namespace, name, ops: answer)
    kube.json_patch_pod("ns", "p", [{"op": "remove", "path": "/spec/schedulingGates"}])
    (read,) = kube.list_pods()
    assert read["metadata"]["resourceVersion"] == "2" and read["spec"] == {}
    assert "managedFields" not in read["metadata"]  # kept as the cache keeps pods


# ------------------------------------------------------------- a whole cycle
PRODUCT = "NVIDIA-H100-80GB-HBM3"


def gated_pod() -> dict[str, Any]:
    from sharing.api.allocation import Allocation, ContainerAllocation
    from sharing.api.keys import ALLOCATION_ANNOTATION

    allocation = Allocation(mode="mig", gated=True, capacity_existed=True, policy="p", reason="r", gpu_model=PRODUCT,
                            containers=(ContainerAllocation("c", "containers", 100, None, "nvidia.com/mig-1g.10gb",
                                                            "1g.10gb"),)).to_annotation()
    return {"metadata": {"name": "p", "namespace": "team", "uid": "u1", "resourceVersion": "10",
                         "creationTimestamp": "2026-12-01T11:00:00Z", "annotations": {ALLOCATION_ANNOTATION: allocation}},
            "spec": {"schedulingGates": [{"name": "gpupack.io/capacity"}],
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
            "status": {"phase": "Pending"}}


def one_gpu_node() -> dict[str, Any]:
    return {"kind": "GPUNode", "metadata": {"name": "n1", "generation": 1, "resourceVersion": "20"},
            "spec": {"sharing": {"mode": "none", "replicas": 1}},
            "status": {"observedGeneration": 1, "product": PRODUCT, "gpus": [
                {"index": 0, "uuid": "GPU-0", "product": PRODUCT, "memoryMiB": 81559, "migEnabled": True,
                 "instances": [{"profile": "1g.10gb", "start": 0, "size": 1}]}]}}


def patched(pod: dict[str, Any], ops: list[dict[str, Any]], version: str) -> dict[str, Any]:
    """The pod after the controller's release patch (the ops it writes, applied)."""
    out = json.loads(json.dumps(pod))
    for op in ops:
        if op["op"] == "remove" and op["path"] == "/spec/schedulingGates":
            del out["spec"]["schedulingGates"]
        elif op["op"] == "add" and op["path"] == "/spec/affinity":
            out["spec"]["affinity"] = op["value"]
    out["metadata"]["resourceVersion"] = version
    return out


def test_a_cache_that_has_not_seen_a_release_does_not_release_the_pod_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller.reconcile import Controller
    from controller.settings import ControllerSettings

    pod = gated_pod()
    caches = synced(ClusterCaches({"gpunodes": lister(one_gpu_node()), "nodes": lister(), "pods": lister(pod),
                                   "sharingpolicies": lister(), "namespaces": lister()}),
                    "gpunodes", "nodes", "pods", "sharingpolicies", "namespaces")
    kube = cached_kube(caches)
    writes: list[list[dict[str, Any]]] = []
    server = {"pod": pod}

    def json_patch_pod(self: Kube, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        writes.append(ops)
        server["pod"] = patched(server["pod"], ops, str(11 + len(writes)))
        return server["pod"]

    def patch_gpunode(self: Kube, name: str, body: dict[str, Any]) -> dict[str, Any]:
        current = caches.informers["gpunodes"].get(name) or {}
        meta = {**current["metadata"], **body.get("metadata", {}), "resourceVersion": "21"}
        return {**current, "metadata": meta}

    monkeypatch.setattr(Kube, "json_patch_pod", json_patch_pod)
    monkeypatch.setattr(Kube, "patch_gpunode", patch_gpunode)
    controller = Controller(kube, ControllerSettings())
    first = controller.cycle()
    assert first.released == ["team/p"] and len(writes) == 1  # pinned and ungated in one patch
    # The watch has not brought either write back: the cache still shows the gated pod.
    assert caches.informers["pods"].get("team/p") == pod
    second = controller.cycle()
    assert second.released == [] and second.errors == [] and len(writes) == 1
    # Once the cache shows the write, it is read from the cache again.
    caches.informers["pods"].apply({"type": "MODIFIED", "object": server["pod"]})
    assert controller.cycle().released == [] and len(writes) == 1
    assert len(kube.written) == 1  # the GPUNode's idle record: its watch event has not come yet


def test_a_pod_that_cannot_be_placed_is_told_why_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cycle writes the gpupack.io/Placement condition (controller.writes.wait_status) through the status
    subresource, and a second cycle, its cache not yet showing the write, writes nothing again."""
    from controller.reconcile import Controller
    from controller.settings import ControllerSettings
    from sharing.api.placement_status import read_placement

    pod = gated_pod()
    node = one_gpu_node()
    node["status"]["gpus"][0]["instances"][0]["inUse"] = True  # the only 1g.10gb is taken
    node["status"]["gpus"][0]["instances"][0]["pods"] = ["other/q"]
    caches = synced(ClusterCaches({"gpunodes": lister(node), "nodes": lister(), "pods": lister(pod),
                                   "sharingpolicies": lister(), "namespaces": lister()}),
                    "gpunodes", "nodes", "pods", "sharingpolicies", "namespaces")
    kube = cached_kube(caches)
    status_writes: list[dict[str, Any]] = []

    def patch_pod_status(self: Kube, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        status_writes.append(body)
        out = json.loads(json.dumps(pod))
        out["status"]["conditions"] = body["status"]["conditions"]
        out["metadata"]["resourceVersion"] = str(30 + len(status_writes))
        return out

    monkeypatch.setattr(Kube, "patch_pod_status", patch_pod_status)
    monkeypatch.setattr(Kube, "patch_gpunode", lambda self, name, body: None)
    controller = Controller(kube, ControllerSettings())
    first = controller.cycle()
    assert first.released == [] and first.errors == [] and len(status_writes) == 1
    (written,) = kube.list_pods()
    said = read_placement(written)
    assert said is not None and not said.placed and said.message
    controller.cycle()
    assert len(status_writes) == 1  # the same word is not written twice


def test_a_claim_the_controller_created_is_read_before_its_watch_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Else the next cycle counts its devices free and pins another pod's claim to them."""
    caches = synced(ClusterCaches({"resourceclaims": lister(obj("theirs", "1", "ns"))}), "resourceclaims")
    kube = cached_kube(caches)
    monkeypatch.setattr(Kube, "create_resource_claim", lambda self, namespace, body: obj("mine", "5", namespace))
    kube.create_resource_claim("ns", {"metadata": {"name": "mine"}})
    assert sorted(c["metadata"]["name"] for c in kube.list_resource_claims()) == ["mine", "theirs"]

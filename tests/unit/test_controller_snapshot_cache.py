"""The snapshot cache re-reads only what changed, and builds exactly what a from-scratch build does."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.state.build import build_snapshot, encode_idle
from controller.state.incremental import SnapshotCache
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION, IDLE_SINCE_ANNOTATION

PRODUCT = "NVIDIA-H100-80GB-HBM3"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")


class World:
    """A cluster's raw objects, changed at random the way the API server would (new resourceVersions)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.version = 0
        self.gpunodes: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {}
        for n in range(6):
            self.put_node(f"n{n}")
        for i in range(12):
            self.put_pod(f"p{i}")
        self.put_policy("pol")

    def rv(self) -> str:
        self.version += 1
        return str(self.version)

    def put_node(self, name: str) -> None:
        rng = self.rng
        gpus = []
        for g in range(rng.randint(1, 3)):
            mig = rng.random() < 0.7
            instances = [{"profile": "3g.40gb", "start": 0, "size": 4, "inUse": rng.random() < 0.5},
                         {"profile": "1g.10gb", "start": 4, "size": 1}] if mig else []
            gpus.append({"index": g, "uuid": f"GPU-{name}-{g}", "product": PRODUCT, "memoryMiB": 81559,
                         "migEnabled": mig, "instances": instances,
                         "utilization": {"gpuPercent": rng.choice([0, 30, 70])}})
        meta: dict[str, Any] = {"name": name, "generation": rng.randint(1, 3), "resourceVersion": self.rv()}
        if rng.random() < 0.5:
            meta["annotations"] = {IDLE_SINCE_ANNOTATION: encode_idle({0: NOW - timedelta(minutes=rng.randint(1, 60))})}
        sharing = rng.choice([{"mode": "none", "replicas": 1}, {"mode": "mps", "replicas": 4}])
        self.gpunodes[name] = {
            "kind": "GPUNode", "metadata": meta, "spec": {"sharing": sharing},
            "status": {"observedGeneration": 1, "product": PRODUCT, "sharing": sharing, "gpus": gpus,
                       "heartbeatTime": (NOW - timedelta(seconds=rng.choice([10, 400]))).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        if rng.random() < 0.9:
            self.nodes[name] = {"metadata": {"name": name, "resourceVersion": self.rv(),
                                             "labels": {"pool": rng.choice("ab"), "kubernetes.io/hostname": name}},
                                "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}
        else:
            self.nodes.pop(name, None)

    def put_pod(self, name: str) -> None:
        rng = self.rng
        profile = rng.choice(PROFILES)
        gated = rng.random() < 0.5
        allocation = Allocation(mode="mig", gated=gated, capacity_existed=True, policy="p", reason="r",
                                containers=(ContainerAllocation("c", "containers", 100, None,
                                                                f"nvidia.com/mig-{profile}", profile),)).to_annotation()
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}
        if gated:
            spec["schedulingGates"] = [{"name": "gpupack.io/capacity"}]
        elif self.gpunodes:
            spec["nodeName"] = rng.choice(sorted(self.gpunodes))
        annotations = {ALLOCATION_ANNOTATION: allocation} if rng.random() < 0.8 else {}
        if not annotations and rng.random() < 0.5:  # somebody else's pod holding whole GPUs
            spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        self.pods[name] = {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}-{self.version}",
                                        "resourceVersion": self.rv(), "creationTimestamp": "2026-12-01T11:00:00Z",
                                        "annotations": annotations},
                           "spec": spec, "status": {"phase": "Pending" if gated else "Running"}}

    def put_policy(self, name: str) -> None:
        self.policies[name] = {"metadata": {"name": name, "resourceVersion": self.rv()}, "spec": {
            "nodeSelector": {"matchLabels": {"pool": self.rng.choice("ab")}},
            "reshaping": {"idleSeconds": self.rng.choice([30, 600])}}}

    def change(self) -> None:
        rng = self.rng
        what = rng.choice(["node", "node", "new-node", "drop-node", "pod", "pod", "new-pod", "drop-pod", "policy",
                           "idle-copy", "relabel"])
        if what == "relabel" and self.nodes:  # the Node alone changes (a label GPU feature discovery writes)
            name = rng.choice(sorted(self.nodes))
            obj = self.nodes[name]
            labels = {**obj["metadata"]["labels"], "pool": rng.choice("abc")}
            self.nodes[name] = {**obj, "metadata": {**obj["metadata"], "labels": labels, "resourceVersion": self.rv()}}
        elif what in ("node", "new-node") or (what == "drop-node" and len(self.gpunodes) < 2):
            self.put_node(rng.choice(sorted(self.gpunodes)) if what == "node" else f"n{self.version}")
        elif what == "drop-node":
            name = rng.choice(sorted(self.gpunodes))
            del self.gpunodes[name]
            self.nodes.pop(name, None)
        elif what in ("pod", "new-pod") or (what == "drop-pod" and not self.pods):
            self.put_pod(rng.choice(sorted(self.pods)) if what == "pod" and self.pods else f"p{self.version}")
        elif what == "drop-pod":
            del self.pods[rng.choice(sorted(self.pods))]
        elif what == "policy":
            self.put_policy("pol")
        else:
            # The controller's own copy of a GPUNode with a new idle record and the same resourceVersion
            # (controller.reconcile, before the API server's answer comes back through the cache).
            name = rng.choice(sorted(self.gpunodes))
            obj = self.gpunodes[name]
            meta = {**obj["metadata"], "annotations": {IDLE_SINCE_ANNOTATION: encode_idle({0: NOW - timedelta(seconds=rng.randint(1, 999))})}}
            self.gpunodes[name] = {**obj, "metadata": meta}

    def lists(self) -> tuple[list[dict[str, Any]], ...]:
        return (list(self.gpunodes.values()), list(self.nodes.values()), list(self.pods.values()),
                list(self.policies.values()))


@pytest.mark.parametrize("seed", range(8))
def test_cached_build_equals_a_build_from_scratch_after_random_changes(seed: int) -> None:
    world = World(random.Random(seed))
    cache = SnapshotCache()
    for _ in range(40):
        for _ in range(world.rng.randint(0, 3)):
            world.change()
        lists = world.lists()
        cached = cache.build(*lists, now=NOW, stale_after_s=180)
        fresh = build_snapshot(*lists, now=NOW, stale_after_s=180)
        assert cached == fresh


def test_only_changed_objects_are_read_again() -> None:
    world = World(random.Random(1))
    cache = SnapshotCache()
    cache.build(*world.lists())
    assert (cache.parsed_nodes, cache.parsed_pods) == (len(world.gpunodes), len(world.pods))
    cache.build(*world.lists())
    assert (cache.parsed_nodes, cache.parsed_pods) == (0, 0)
    world.put_pod("p3")
    world.put_node("n2")
    cache.build(*world.lists())
    assert (cache.parsed_nodes, cache.parsed_pods) == (1, 1)


def test_a_node_objects_change_reads_its_gpunode_again() -> None:
    world = World(random.Random(2))
    cache = SnapshotCache()
    cache.build(*world.lists())
    name = next(n for n in world.nodes)
    world.nodes[name] = {**world.nodes[name], "metadata": {**world.nodes[name]["metadata"], "resourceVersion": world.rv(),
                                                           "labels": {"pool": "c"}}}
    snapshot = cache.build(*world.lists())
    assert cache.parsed_nodes == 1
    node = snapshot.node(name)
    assert node is not None and node.label_map == {"pool": "c"}


def test_objects_without_a_resource_version_are_read_every_time() -> None:
    world = World(random.Random(3))
    for pod in world.pods.values():
        del pod["metadata"]["resourceVersion"]
    cache = SnapshotCache()
    cache.build(*world.lists())
    cache.build(*world.lists())
    assert cache.parsed_pods == len(world.pods)
    assert cache.parsed_nodes == 0

"""Building the controller's snapshot from raw API objects, and the idle record."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from controller.state.build import (
    build_snapshot,
    busy_gpus,
    encode_idle,
    idle_record,
    pod_from_object,
    refused_gpus,
    update_idle,
)
from kube.times import format_time
from mig.catalog import get_model
from mig.model import Placement as MigPlacement
from sharing.api.keys import IDLE_SINCE_ANNOTATION
from node.layouts.direct import layout_report
from node.base.snapshot import read_snapshot, status_from_snapshot
from node.base.journal import Journal
from node.nvml.simulated import SimulatedNvml
from node.layouts.reshape_start import StartDecision
from sharing.api.allocation import Allocation, ContainerAllocation

NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
PRODUCT = "NVIDIA-H100-80GB-HBM3"


def pod(name: str, *, gated: bool = True, node: str | None = None, pinned: str | None = None,
        phase: str = "Pending", annotation: Any = None) -> dict[str, Any]:
    # The webhook's own writer (sharing.api.allocation), so the reader is tested on what it will get.
    allocation = annotation if annotation is not None else Allocation(
        mode="mig", gated=gated, capacity_existed=True, policy="p", reason="r", gpu_model=PRODUCT,
        containers=(ContainerAllocation("c", "containers", 100, None, "nvidia.com/mig-1g.10gb", "1g.10gb"),),
    ).to_annotation()
    terms = [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [PRODUCT]}]}]
    if pinned:
        terms[0]["matchExpressions"].append({"key": "kubernetes.io/hostname", "operator": "In", "values": [pinned]})
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                                   "limits": {"nvidia.com/mig-1g.10gb": "1"}}}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
    }
    if gated:
        spec["schedulingGates"] = [{"name": "gpupack.io/capacity"}]
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-30T01:00:00Z",
                     "annotations": {"gpupack.io/allocation": allocation}},
        "spec": spec,
        "status": {"phase": phase},
    }


def gpunode(name: str, idle: dict[int, datetime] | None = None, spec_layout: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": 3}
    if idle is not None:
        meta["annotations"] = {IDLE_SINCE_ANNOTATION: encode_idle(idle)}
    spec: dict[str, Any] = {"sharing": {"mode": "none", "replicas": 1}}
    if spec_layout is not None:
        spec["gpus"] = [{"index": 0, "migEnabled": True, "layout": spec_layout}]
    return {
        "kind": "GPUNode",
        "metadata": meta,
        "spec": spec,
        "status": {
            "observedGeneration": 3,
            "product": PRODUCT,
            "gpus": [
                {"index": 0, "uuid": "GPU-0", "product": PRODUCT, "memoryMiB": 81559, "migEnabled": True,
                 "instances": [{"profile": "1g.10gb", "start": 0, "size": 1, "inUse": True},
                               {"profile": "3g.40gb", "start": 4, "size": 4}]},
                {"index": 1, "uuid": "GPU-1", "product": PRODUCT, "memoryMiB": 81559, "migEnabled": False},
            ],
        },
    }


def test_pod_fields() -> None:
    p = pod_from_object(pod("a", gated=False, pinned="n1"))
    assert p is not None
    assert (p.mode, p.profiles, p.node, p.bound, p.gated) == ("mig", ("1g.10gb",), "n1", False, False)
    assert p.products == (PRODUCT,) and p.cpu_milli == 500 and p.memory_mib == 1024


def test_a_forged_allocation_is_not_trusted() -> None:
    """A pod creator wrote the annotation by hand: three 7g.80gb instances on a pod that requests no GPU.
    It used to be released and its instances counted as taken while real pods waited."""
    forged = Allocation(
        mode="mig", gated=True, capacity_existed=False, policy="p", reason="r", gpu_model=PRODUCT,
        containers=tuple(ContainerAllocation("c", "containers", 1000, None, "nvidia.com/mig-7g.80gb", "7g.80gb")
                         for _ in range(3)),
    ).to_annotation()
    obj = pod("forged-1", annotation=forged)
    del obj["spec"]["containers"][0]["resources"]["limits"]
    assert pod_from_object(obj) is None
    snap = build_snapshot([gpunode("n1")], [], [obj, pod("honest")], [])
    assert [p.name for p in snap.pods] == ["honest"]
    assert len(snap.untrusted_pods) == 1
    assert snap.untrusted_pods[0].startswith("team/forged-1: gpupack.io/allocation does not match the pod's requests")


def test_finished_unannotated_and_malformed_pods_are_skipped() -> None:
    assert pod_from_object(pod("done", phase="Succeeded")) is None
    assert pod_from_object(pod("junk", annotation="{not json")) is None
    assert pod_from_object(pod("mode", annotation=json.dumps({"mode": "magic", "containers": [{}]}))) is None
    assert pod_from_object({"metadata": {"name": "plain"}, "spec": {}}) is None


def test_snapshot_reads_instances_reshaping_and_policies() -> None:
    policy = {"kind": "SharingPolicy", "metadata": {"name": "pol"},
              "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}, "reshaping": {"maxConcurrent": 2}}}
    bad_policy = {"kind": "SharingPolicy", "metadata": {"name": "bad"}, "spec": {"reshaping": {"maxConcurrent": "two"}}}
    nodes = [{"metadata": {"name": "n1", "labels": {"pool": "a"}}, "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}},
             {"metadata": {"name": "n2", "labels": {"pool": "b"}}}]
    layout = [{"profile": "1g.10gb", "start": 0}, {"profile": "3g.40gb", "start": 4}, {"profile": "2g.20gb"}]
    snap = build_snapshot([gpunode("n1", spec_layout=layout), gpunode("n2")], nodes, [pod("a")], [policy, bad_policy])
    n1 = snap.node("n1")
    assert n1 is not None and n1.model is not None and n1.cpu_milli == 16000
    assert [g.reshaping for g in n1.gpus] == [True, False]
    assert [len(g.in_use) for g in n1.gpus] == [1, 0]
    assert set(snap.policies) == {"n1"} and snap.policies["n1"].max_concurrent == 2
    assert len(snap.pods) == 1


def _agent_status(report: Any, generation: int) -> dict[str, Any]:
    """A GPUNode status as the agent writes it (its own code), with ``report``'s answers."""
    sim = SimulatedNvml(get_model("H100-80GB"), 2)
    sim.create_gpu_instance(0, sim.model.profile("1g.10gb").profile_id, MigPlacement(0, 1))
    return status_from_snapshot(read_snapshot(sim, sim.kind), {}, observed_generation=generation, sharing=None,
                                conditions=[], reconfiguration=None, refusals=report.refusals)


def test_a_refused_layout_holds_no_reshaping_slot() -> None:
    """The agent's answer, built by the agent's own code, read by the controller's."""
    layout = [{"profile": "7g.80gb"}]
    refused = gpunode("n1", spec_layout=layout)
    problems = {0: "would destroy in-use instance 1g.10gb@0:1"}
    refused["status"] = _agent_status(layout_report(None, {}, problems, generation=3), 3)
    assert refused["status"]["gpus"][0]["layoutRefusal"] == {"phase": "Refused", "reason": problems[0], "generation": 3}
    assert refused_gpus(refused) == {0}
    n1 = build_snapshot([refused], [], [], []).node("n1")
    assert n1 is not None and [g.reshaping for g in n1.gpus] == [False, False]
    # An answer to an older generation says nothing about the current spec.
    stale = json.loads(json.dumps(refused))
    stale["metadata"]["generation"] = 4
    assert refused_gpus(stale) == frozenset()
    n1 = build_snapshot([stale], [], [], []).node("n1")
    assert n1 is not None and n1.gpus[0].reshaping
    # Waiting for idle is not a refusal: the reshape is still pending.
    waiting = json.loads(json.dumps(refused))
    waiting["status"] = _agent_status(layout_report(None, {0: StartDecision("wait", "instance in use")}, {}, 3), 3)
    assert "layoutRefusal" not in waiting["status"]["gpus"][0] and refused_gpus(waiting) == frozenset()
    # A reshape that failed and was rolled back is given up on too; a malformed answer is none.
    failed = json.loads(json.dumps(refused))
    journal = Journal("GPU-0", 0, 3, (), (), (), (), "Failed", 0.0, 1.0, reason="NVML error; rolled back")
    failed["status"] = _agent_status(layout_report(journal, {}, {}, 3), 3)
    assert failed["status"]["gpus"][0]["layoutRefusal"]["phase"] == "Failed" and refused_gpus(failed) == {0}
    failed["status"]["gpus"][0]["layoutRefusal"]["phase"] = "Maybe"
    assert refused_gpus(failed) == frozenset()


def test_idle_record_round_trip_and_update() -> None:
    record = {0: NOW - timedelta(minutes=5)}
    assert idle_record({"metadata": {"annotations": {IDLE_SINCE_ANNOTATION: encode_idle(record)}}}) == record
    assert idle_record({"metadata": {"annotations": {IDLE_SINCE_ANNOTATION: "garbage"}}}) == {}
    updated = update_idle(record, {0: False, 1: False, 2: True}, NOW)
    assert updated == {0: record[0], 1: NOW}  # 0 keeps its start, 1 starts now, busy 2 drops out


def test_unreported_claims_make_a_gpu_busy() -> None:
    snap = build_snapshot([gpunode("n1")], [], [pod("a", gated=False, node="n1"), pod("b", gated=False, node="n1")], [])
    n1 = snap.node("n1")
    assert n1 is not None
    # Two pods on 1g.10gb, only one reported in use: GPU 0 (which has 1g instances) counts as busy.
    assert busy_gpus(n1, snap.pods) == {0: True, 1: False}


def test_whole_gpus_taken_and_waiting_count_every_pod() -> None:
    plain_bound = {"metadata": {"name": "trainer", "namespace": "ml"},
                   "spec": {"nodeName": "a", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                            "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                   "status": {"phase": "Running"}}
    plain_waiting = {"metadata": {"name": "big", "namespace": "ml"},
                     "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
                     "status": {"phase": "Pending", "conditions": [
                         {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    finished = {**plain_bound, "metadata": {"name": "done"}, "status": {"phase": "Succeeded"}}
    garbage = {"metadata": {"name": "odd"}, "spec": {"nodeName": "a", "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}
    snapshot = build_snapshot([gpunode("a")], [], [plain_bound, plain_waiting, finished, garbage], [])
    (node,) = snapshot.nodes
    assert node.whole_taken == 2 and snapshot.whole_waiting == 4


def test_a_silent_agent_makes_its_node_stale() -> None:
    now = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)

    def beating(name: str, seconds_ago: float | None) -> dict[str, Any]:
        obj = gpunode(name)
        if seconds_ago is not None:
            obj["status"]["heartbeatTime"] = format_time(now - timedelta(seconds=seconds_ago))
        return obj

    objs = [beating("fresh", 30), beating("silent", 600), beating("old-agent", None)]
    snap = build_snapshot(objs, [], [], [], now=now, stale_after_s=180)
    assert {n.name: n.stale for n in snap.nodes} == {"fresh": False, "silent": True, "old-agent": False}
    assert {n.name: n.silent_seconds for n in snap.nodes} == {"fresh": 30.0, "silent": 600.0, "old-agent": None}
    assert not any(n.stale for n in build_snapshot(objs, [], [], []).nodes)  # no clock, no judgement


def test_cpu_and_memory_used_count_every_pod_holding_the_node() -> None:
    """As kube-scheduler counts them: bound pods (gpupack's or not), gpupack's pods pinned and
    released but not bound yet, the larger of the app containers together and the largest
    init container, plus the overhead; finished and gated pods hold nothing."""
    def plain_pod(name: str, node: str | None, phase: str = "Running", **spec: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "250m"}}}], **spec}
        if node:
            body["nodeName"] = node
        return {"metadata": {"name": name, "namespace": "ml"}, "spec": body, "status": {"phase": phase}}

    big_init = plain_pod("init", "n1", initContainers=[{"name": "i", "resources": {"requests": {"cpu": "3"}}}],
                         overhead={"cpu": "100m", "memory": "64Mi"})
    pods = [
        plain_pod("cpu-only", "n1"),                   # 1250m, 2048Mi
        big_init,                                      # 3000m + 100m, 2048Mi + 64Mi
        plain_pod("done", "n1", phase="Succeeded"),    # nothing
        plain_pod("pending", None, phase="Pending"),   # nothing
        plain_pod("odd", "n1", containers=[{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]),
        pod("pinned", gated=False, pinned="n1"),       # gpupack's, released to n1: 500m, 1024Mi
        pod("gated", gated=True, pinned="n1"),         # still gated: not placed yet
        pod("elsewhere", gated=False, node="n2"),
    ]
    snapshot = build_snapshot([gpunode("n1"), gpunode("n2")], [], pods, [])
    n1, n2 = snapshot.node("n1"), snapshot.node("n2")
    assert n1 is not None and n2 is not None
    assert (n1.cpu_used_milli, n1.memory_used_mib) == (1250 + 3100 + 500, 2048 + 2112 + 1024)
    assert (n2.cpu_used_milli, n2.memory_used_mib) == (500, 1024)
    assert n1.room is None  # no Node object: allocatable unknown, so no limit


def test_pods_asking_whole_gpus_themselves_are_the_engines_gpu_pods_too() -> None:
    """Pods asking ``nvidia.com/gpu`` that are not gpupack's, placed or waiting, are among the GPU
    pods that exist, which the packing engine measures fragmentation against."""
    def whole(name: str, node: str | None, phase: str = "Running", products: list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": "2"}}}]}
        if node:
            spec["nodeName"] = node
        if products:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": products}]}]}}}
        return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "status": {"phase": phase}}

    pods = [whole("bound", "n1"), whole("waiting", None, "Pending", ["Tesla-T4"]), whole("done", "n1", "Succeeded"),
            pod("gpupack-pod", gated=False, node="n1")]
    snapshot = build_snapshot([gpunode("n1")], [], pods, [])
    assert [(p.key, p.gpus, p.cpu_milli, p.products) for p in snapshot.plain_gpu_pods] == [
        ("ml/bound", 2, 4000, ()), ("ml/waiting", 2, 4000, ("Tesla-T4",))]
    # Where each is and its priority: the placement preference by priority counts them.
    pods[0]["spec"]["priority"] = 1000
    again = build_snapshot([gpunode("n1")], [], pods, [])
    assert [(p.node, p.priority) for p in again.plain_gpu_pods] == [("n1", 1000), (None, 0)]

"""The demo's right-sizing summary and rules (``gpupack.demo.rightsizing``), on hand-made API objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupack.demo.rightsizing import (
    APP_LABEL, BUILTIN_TRACE_PODS, Scenario, deployment, held_milli, label_value, move_rows, playing_kubelet,
    recommendation_rows, text_lines, timings, write_builtin_trace,
)
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION, MILLI_RESOURCE, RIGHT_SIZED_ANNOTATION
from sharing.api.right_sized import RightSizedFrom, SizedContainer
from gpupack.cli import load_usage_trace

GIB = 2**30


def _rec(workload: str, milli: int, memory: str, provided: bool) -> dict[str, Any]:
    return {
        "apiVersion": "gpupack.io/v1alpha1", "kind": "GPURecommendation",
        "metadata": {"name": f"deployment-{workload}", "namespace": "gpupack-demo", "generation": 1},
        "spec": {"targetRef": {"kind": "Deployment", "name": workload}},
        "status": {"source": "Agents", "mode": "Initial", "lastUpdateTime": "2026-12-04T17:00:00Z",
                   "containers": [{"containerName": "main", "gpuMilli": milli, "gpuMemory": memory,
                                   "observedSeconds": 20, "confidenceDays": 0.0, "ooms": 0, "pods": 1}],
                   "conditions": [{"type": "RecommendationProvided", "status": "True" if provided else "False",
                                   "reason": "Provided" if provided else "NotEnoughHistory", "message": "",
                                   "lastTransitionTime": "2026-12-04T17:00:00Z"}]},
    }


def _pod(name: str, workload: str | None, *, milli: int = 1000, node: str | None = "a100-w",
         sized_to: int | None = None) -> dict[str, Any]:
    allocation = Allocation(mode="whole", gated=False, capacity_existed=True, policy="demo", reason="test",
                            containers=(ContainerAllocation("main", "containers", milli, 64 * GIB, "nvidia.com/gpu"),))
    annotations = {ALLOCATION_ANNOTATION: allocation.to_annotation()}
    if sized_to is not None:
        annotations[RIGHT_SIZED_ANNOTATION] = RightSizedFrom(f"deployment-{workload}", 1, None, (
            SizedContainer("main", 1000, 64 * GIB, sized_to, 12 * GIB, sized_to),)).to_annotation()
    labels = {APP_LABEL: workload} if workload else {"app": "gpupack-demo"}
    return {"metadata": {"name": name, "namespace": "gpupack-demo", "labels": labels, "annotations": annotations},
            "spec": {"nodeName": node} if node else {}, "status": {}}


def test_label_values_are_the_modes_capitalised_and_a_bad_mode_is_named() -> None:
    assert [label_value(m) for m in ("off", "initial", "recreate")] == ["Off", "Initial", "Recreate"]
    with pytest.raises(ValueError, match="one of off, initial, recreate, got 'Auto'"):
        label_value("Auto")


def test_timings_are_the_product_defaults_in_trace_time() -> None:
    t = timings(60.0)
    assert (t.min_observed_s, t.publish_s) == (60.0, 5.0)
    assert t.controller_args() == ("--recommend-seconds", "1", "--recommend-min-observed-seconds", "60")
    assert timings(3600.0).agent_args() == ("--usage-publish-seconds", "1")  # never below a second
    with pytest.raises(ValueError, match="positive"):
        timings(0.0)


def test_the_builtin_trace_reads_back_with_every_pod(tmp_path: Path) -> None:
    trace = load_usage_trace(write_builtin_trace(tmp_path, steps=30))
    assert sorted(p.pod for p in trace.pods) == sorted(name for name, _, _ in BUILTIN_TRACE_PODS)
    assert trace.steps == 30 and all(0 < d < 100 for p in trace.pods for d in p.duty_percent)


def test_the_deployment_asks_a_whole_gpu_in_one_replica_and_surges() -> None:
    d = deployment("svc-a", "ns")
    assert d["spec"]["replicas"] == 1
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    limits = d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[MILLI_RESOURCE] == "1000"
    assert d["spec"]["template"]["metadata"]["labels"] == {APP_LABEL: "svc-a"}


def test_recommendation_rows_show_each_container_and_leave_out_what_does_not_validate() -> None:
    broken = {"metadata": {"name": "x"}, "spec": {}}
    rows = recommendation_rows([_rec("svc-b", 149, "9Gi", True), broken, _rec("svc-a", 0, "1Gi", False)])
    assert rows == [
        {"workload": "Deployment/svc-a", "container": "main", "gpu_milli": 0, "gpu_memory": "1Gi", "provided": False},
        {"workload": "Deployment/svc-b", "container": "main", "gpu_milli": 149, "gpu_memory": "9Gi",
         "provided": True},
    ]


def test_held_milli_counts_bound_pods_only() -> None:
    assert held_milli([_pod("a", "svc-a"), _pod("b", "svc-b", milli=150), _pod("c", "svc-c", node=None)]) == 1150


def test_move_rows_keep_the_controllers_moves_oldest_first() -> None:
    events = [
        {"reason": "RolledOutToRightSize", "involvedObject": {"kind": "Deployment", "name": "svc-b"},
         "message": "b", "firstTimestamp": "2026-12-04T17:00:05Z"},
        {"reason": "Scheduled", "involvedObject": {"kind": "Pod", "name": "p"}, "message": "x"},
        {"reason": "EvictedToRightSize", "involvedObject": {"kind": "Pod", "name": "svc-a-1"},
         "message": "a", "firstTimestamp": "2026-12-04T17:00:01Z"},
    ]
    assert move_rows(events) == [{"reason": "EvictedToRightSize", "object": "Pod/svc-a-1", "message": "a"},
                                 {"reason": "RolledOutToRightSize", "object": "Deployment/svc-b", "message": "b"}]


def test_the_demo_plays_the_kubelet_for_its_own_pods_only() -> None:
    assert playing_kubelet(_pod("a", "svc-a")) == "ready"
    assert playing_kubelet(_pod("a", "svc-a", node=None)) is None  # not bound: nothing runs yet
    assert playing_kubelet(_pod("j", None)) is None  # the stream's pods are left as they are
    ready = _pod("a", "svc-a")
    ready["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    assert playing_kubelet(ready) is None
    ready["metadata"]["deletionTimestamp"] = "2026-12-04T17:00:00Z"
    assert playing_kubelet(ready) == "remove"


def test_initial_is_done_once_every_workload_is_provided_and_has_a_sized_pod() -> None:
    s = Scenario("initial", ("svc-a", "svc-b"))
    s.observe([_rec("svc-a", 150, "12Gi", True), _rec("svc-b", 100, "8Gi", False)],
              [_pod("svc-a-1", "svc-a"), _pod("svc-b-1", "svc-b"), _pod("job-1", None)], [])
    assert s.provided() == {"svc-a"} and not s.done()
    assert s.milli_before == 2000  # both workloads bound: what they held before anything was sized
    s.observe([_rec("svc-a", 150, "12Gi", True), _rec("svc-b", 100, "8Gi", True)],
              [_pod("svc-a-2", "svc-a", milli=150, sized_to=150), _pod("svc-b-1", "svc-b")], [])
    assert not s.done()  # svc-b's pod is not sized yet
    s.observe([_rec("svc-a", 150, "12Gi", True), _rec("svc-b", 100, "8Gi", True)],
              [_pod("svc-a-2", "svc-a", milli=150, sized_to=150), _pod("svc-b-2", "svc-b", milli=100, sized_to=100)],
              [])
    assert s.done()
    summary = s.summary()
    assert summary["right_sizing"] == "Initial" and summary["recommendations_provided"] == 2
    assert [p["pod"] for p in summary["pods_right_sized"]] == ["svc-a-2", "svc-b-2"]
    assert summary["pods_right_sized"][0]["containers"][0] == {
        "name": "main", "asked_milli": 1000, "milli": 150, "accounted_milli": 150, "memory_gib": 12.0}
    assert (summary["right_sizing_gpus_before"], summary["right_sizing_gpus_after"]) == (2.0, 0.25)
    assert "2/2 provided" in s.line() and "Deployment/svc-a 150m 12Gi" in s.line()


def test_recreate_needs_a_move_per_workload_and_off_only_the_recommendations() -> None:
    recs = [_rec("svc-a", 150, "12Gi", True)]
    sized = [_pod("svc-a-2", "svc-a", milli=150, sized_to=150)]
    recreate = Scenario("recreate", ("svc-a",))
    recreate.observe(recs, sized, [])
    assert not recreate.done()
    recreate.observe(recs, sized, [{"reason": "RolledOutToRightSize", "message": "m",
                                    "involvedObject": {"kind": "Deployment", "name": "svc-a"}}])
    assert recreate.done() and "1 moves" in recreate.line()
    off = Scenario("off", ("svc-a",))
    off.observe(recs, [_pod("svc-a-1", "svc-a")], [])
    assert off.done() and off.summary()["pods_right_sized"] == []


def test_the_text_summary_shows_each_listed_item_on_a_line() -> None:
    s = Scenario("recreate", ("svc-a",))
    s.observe([_rec("svc-a", 150, "12Gi", True)], [_pod("svc-a-2", "svc-a", milli=150, sized_to=150)],
              [{"reason": "RolledOutToRightSize", "message": "m", "involvedObject": {"kind": "Deployment",
                                                                                     "name": "svc-a"}}])
    assert text_lines(s.summary()) == [
        "  recommendation: Deployment/svc-a main: 150 milli, 12Gi",
        "  right-sized: svc-a-2 from deployment-svc-a: main 1000 -> 150 milli, 12.0 GiB",
        "  moved: Deployment/svc-a (RolledOutToRightSize): m",
    ]

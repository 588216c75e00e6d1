"""``gpupack replay --priority qos``: openb's classes as PriorityClasses, pods preempted live, figures per class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from gpupack.cli import main
from gpupack.replay import runner
from gpupack.replay.figures import live_alloc_at
from gpupack.replay.mapping import replay_pod
from gpupack.replay.outcome import classify
from gpupack.replay.priority import (
    Preempted, live_priority_figures, pod_classes, preempted_by, priority_class_name, priority_classes,
)
from gpupack.replay.runner import LiveRun, PodResult, Replayer
from sharing.api.keys import PREEMPTION_REASON
from sharing.packing.specs import PodSpec
from sharing.rules.priority import QOS_PRIORITIES, qos_priority
from sharing.simulator.arrivals import RunPlan, plan_run
from sharing.simulator.traces import load_nodes, load_pods
from tests.unit.test_simulator_priority import write_trace

@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return write_trace(tmp_path, pods=40)


def pod(name: str, milli: int = 500, count: int = 1) -> PodSpec:
    return PodSpec(name=name, cpu_milli=1000, memory_mib=1024, gpu_count=count, gpu_milli=milli)


# ------------------------------------------------------------------ classes and pods


def test_one_priority_class_per_openb_class_valued_as_the_simulator_values_it() -> None:
    classes = {m["metadata"]["name"]: m for m in priority_classes()}
    assert set(classes) == {priority_class_name(q) for q in QOS_PRIORITIES} >= {"openb-ls", "openb-be"}
    for qos, value in QOS_PRIORITIES.items():
        manifest = classes[priority_class_name(qos)]
        assert manifest["value"] == value and manifest["kind"] == "PriorityClass"
        assert manifest["preemptionPolicy"] == "PreemptLowerPriority"
    assert classes["openb-be"]["value"] < classes["openb-ls"]["value"]


def test_a_pod_names_its_class_only_when_asked() -> None:
    p = pod("openb-pod-0001")
    assert "priorityClassName" not in replay_pod(p, "ns", "run")["spec"]
    assert replay_pod(p, "ns", "run", "openb-be")["spec"]["priorityClassName"] == "openb-be"


def test_every_plan_pod_gets_its_qos_class_and_a_pod_without_one_is_refused() -> None:
    priorities = {"openb-pod-0001": qos_priority("LS"), "openb-pod-0002": qos_priority("BE")}
    assert pod_classes([pod("openb-pod-0001"), pod("openb-pod-0002")], priorities) == {
        "openb-pod-0001": "openb-ls", "openb-pod-0002": "openb-be"}
    with pytest.raises(ValueError, match="openb-pod-0003"):
        pod_classes([pod("openb-pod-0003")], priorities)


# ------------------------------------------------------------------ preempted live


def _condition(reason: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason}]}}


def test_who_preempted_is_read_from_the_disruption_target_condition() -> None:
    assert preempted_by(_condition(PREEMPTION_REASON)) == "controller"
    assert preempted_by(_condition("PreemptionByScheduler")) == "scheduler"
    assert preempted_by(_condition("EvictionByEvictionAPI")) == "unknown"
    assert preempted_by({}) == "unknown"


def test_a_pod_kube_scheduler_preempted_for_waits_rather_than_counting_as_never_placed() -> None:
    unschedulable = {"spec": {}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    assert classify(unschedulable) == ("unplaceable", "scheduler")
    nominated = {**unschedulable, "status": {**unschedulable["status"], "nominatedNodeName": "openb-node-0001"}}
    assert classify(nominated) == ("waiting", None)


def _replayer(plan: Any = None) -> Replayer:
    return Replayer(stack=cast(Any, None), plan=cast(Any, plan))


def test_a_bound_pod_deleted_by_someone_else_is_preempted_during_the_attempt_in_flight() -> None:
    r = _replayer()
    bound = {"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}}
    r._attempt = 0
    r._watched("MODIFIED", bound)
    r._watched("ADDED", {"metadata": {"name": "never"}, "spec": {}})
    r._attempt = 3
    r._watched("MODIFIED", {**bound, "metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                            **_condition(PREEMPTION_REASON)})
    r._watched("DELETED", bound)  # seen once
    r._watched("DELETED", {"metadata": {"name": "never"}, "spec": {}})  # the replay's own delete: never bound
    assert list(r._preempted.values()) == [Preempted("a", 3, "controller")]


# ------------------------------------------------------------------ figures


def test_a_preempted_pod_leaves_the_allocation_from_the_attempt_it_went_in() -> None:
    pods = [pod("p0", 1000), pod("p1", 1000)]
    assert live_alloc_at(pods, [True, True], 2)[100] == 100.0
    # p0 preempted while p1 was placed: after p1 only p1 holds a GPU of the two.
    levels = live_alloc_at(pods, [True, True], 2, withdrawn=[0, 1000])
    assert levels[50] == 50.0 and levels[100] == 50.0
    with pytest.raises(ValueError, match="withdrawals"):
        live_alloc_at(pods, [True, True], 2, withdrawn=[0])


def test_live_figures_per_class_count_a_victim_as_not_placed() -> None:
    pods = [pod("openb-pod-0000", 1000), pod("openb-pod-0001", 1000), pod("openb-pod-0002", 500)]
    priorities = {"openb-pod-0000": qos_priority("BE"), "openb-pod-0001": qos_priority("LS"),
                  "openb-pod-0002": qos_priority("BE")}
    names = [p.name for p in pods]
    figures = live_priority_figures(pods, names, [True, True, False], [Preempted("openb-pod-0000", 1, "scheduler")],
                                    priorities, total_gpus=1)
    assert figures["placed_by_class"] == {"BE": 0.0, "LS": 100.0}
    assert figures["preemptions"] == 1 and figures["preempted_pods"] == 1 and figures["preempted_milli"] == 1000
    assert figures["preempted_by"] == {"scheduler": 1}
    assert figures["final_alloc_percent"] == 100.0
    none = live_priority_figures(pods, names, [True, True, False], [], priorities, total_gpus=1)
    assert none["placed_by_class"]["BE"] == round(100 * 1000 / 1500, 2) and none["preemptions"] == 0


# ------------------------------------------------------------------ the command's wiring


def _fake_run_live(calls: list[dict[str, Any]], preempt_first_bound: bool) -> Any:
    def run_live(workdir: Path, plan: RunPlan, **kw: Any) -> LiveRun:
        calls.append(kw)
        results = [PodResult(p.name, p, "bound", node=plan.nodes[0].name, bound_seconds=0.1) for p in plan.workload.pods]
        preempted = [Preempted(results[0].name, 2, "controller")] if preempt_first_bound else []
        return LiveRun(plan=plan, results=results, agents="fleet", preempted=preempted)
    return run_live


def test_priority_qos_names_classes_and_reports_live_beside_the_model(
        files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "run_live", _fake_run_live(calls, preempt_first_bound=True))
    assert main(["replay", "--nodes", str(files[0]), "--pods", str(files[1]), "--priority", "qos", "--json",
                 "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = plan_run(load_nodes(files[0]), load_pods(files[1]).pods, 42, 1.3, None)
    classes = calls[0]["priority_classes"]
    assert set(classes) == {p.name for p in plan.workload.pods}
    assert set(classes.values()) <= {priority_class_name(q) for q in QOS_PRIORITIES}
    priority = report["priority"]
    assert priority["live"]["preempted_pods"] == 1 and priority["live"]["preempted_by"] == {"controller": 1}
    assert priority["live"]["preempted"] == [{"pod": plan.workload.pods[0].name, "attempt": 2, "by": "controller"}]
    assert set(priority["simulated"]) >= {"alloc_at_by_class", "placed_by_class", "preemptions", "preempted_milli"}
    assert set(priority["live"]["placed_by_class"]) == set(priority["simulated"]["placed_by_class"])
    # The victim's milli leaves the run's allocation.
    held = sum(p.gpu_total_milli for p in plan.workload.pods) - plan.workload.pods[0].gpu_total_milli
    assert report["final_alloc_percent"] == round(100.0 * held / (plan.gpus * 1000), 2)


def test_the_text_summary_shows_classes_and_preemptions_live_and_modelled(
        files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "run_live", _fake_run_live([], preempt_first_bound=True))
    assert main(["replay", "--nodes", str(files[0]), "--pods", str(files[1]), "--priority", "qos",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "placed at the end, % of each class's arrived milli (live / product model" in out
    assert "pods preempted 1 / " in out


def test_priority_none_is_todays_run(files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "run_live", _fake_run_live(calls, preempt_first_bound=False))
    assert main(["replay", "--nodes", str(files[0]), "--pods", str(files[1]), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert calls[0]["priority_classes"] is None and "priority" not in report


def test_priority_qos_on_a_pod_list_without_qos_exits_2_before_any_stack(
        files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "run_live", _fake_run_live(calls, preempt_first_bound=False))
    (tmp_path / "bare").mkdir()
    nodes, bare = write_trace(tmp_path / "bare", pods=20, qos=False)
    assert main(["replay", "--nodes", str(nodes), "--pods", str(bare), "--priority", "qos"]) == 2
    assert "no qos column" in capsys.readouterr().err and calls == []
    odd = tmp_path / "odd.csv"
    odd.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos\npod-0000,1000,1024,1,500,Platinum\n")
    assert main(["replay", "--nodes", str(files[0]), "--pods", str(odd), "--priority", "qos"]) == 2
    assert "qos 'Platinum' is unknown" in capsys.readouterr().err and calls == []

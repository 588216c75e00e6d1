"""``gpupack replay --priority qos`` end to end: the synthetic openb-like trace with a ``qos`` column,
``--max-nodes 20``, through the real stack (control plane with kwok, KWOK nodes, the agent fleet, the
webhook over TLS, the controller, kube-scheduler).

The API server resolves each pod's PriorityClass (``openb-ls``, ``openb-be``, ...: the replay creates
them), so pods preempt live; the test asserts that every pod is decided (none left to the per-pod
limit), that pods were preempted and each by a component that said so (``DisruptionTarget``), that
every victim is a BE pod (the only class below another), and that the report carries the live and
the product model's figures per class. About a minute on a 2-core machine.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.openb_synthetic import synthetic_trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_a_replay_with_priorities_preempts_only_best_effort_pods_and_reports_both_sides(tmp_path: Path) -> None:
    nodes, pods = synthetic_trace(tmp_path, qos=True)
    run = subprocess.run(
        [sys.executable, "-m", "gpupack", "replay", "--nodes", str(nodes), "--pods", str(pods), "--seed", "42",
         "--max-nodes", "20", "--priority", "qos", "--json", "--no-progress", "--workdir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=840,
    )
    logs = tmp_path / "work" / "logs"
    assert run.returncode == 0, run.stderr[-3000:] + "".join(
        f"\n--- {p.name} ---\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log")))
    assert "priority classes: openb-ls, openb-guaranteed, openb-burstable, openb-be" in run.stderr
    report = json.loads(run.stdout)
    assert report["pods_timed_out"] == 0
    assert report["pods_bound"] + report["pods_unplaceable"] == report["pods_submitted"] == report["pods_planned"]
    live, simulated = report["priority"]["live"], report["priority"]["simulated"]
    qos = {row["name"]: row["qos"] for row in csv.DictReader(pods.open())}
    victims = live["preempted"]
    assert victims, "no pod was preempted live: did the API server resolve the pods' PriorityClasses?"
    assert {qos[v["pod"]] for v in victims} == {"BE"}
    assert {v["by"] for v in victims} <= {"controller", "scheduler"}  # each said so with DisruptionTarget
    assert live["preempted_pods"] == len(victims) == sum(live["preempted_by"].values())
    bound = {p["name"] for p in report["pods"] if p["result"] == "bound"}
    assert {v["pod"] for v in victims} <= bound
    assert set(live["placed_by_class"]) == set(simulated["placed_by_class"]) >= {"LS", "BE"}
    assert live["placed_by_class"]["LS"] > live["placed_by_class"]["BE"]
    assert simulated["preempted_equal_or_higher"] == 0 and simulated["preemption_loops"] == 0

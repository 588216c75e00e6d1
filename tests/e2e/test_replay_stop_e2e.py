"""A replay stopped early, end to end: ``--stop-after`` and SIGTERM on the real stack (control plane
with kwok, KWOK nodes, the agent fleet, the webhook over TLS, the controller, kube-scheduler).

A whole-cluster replay runs for hours; one cut short by a deadline or a batch system must still
report what it measured, compare it with the model where it got to, and leave nothing running.
The synthetic trace of ``test_replay_e2e`` at ``--max-nodes 50`` plans about 280 pods, far more
than either run submits. About a minute each on a 2-core machine (mostly the stack's setup).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupack.replay.runner import submission_order
from sharing.simulator.arrivals import plan_run
from sharing.simulator.traces import load_nodes, load_pods
from tests.e2e.openb_synthetic import synthetic_trace

ROOT = Path(__file__).resolve().parents[2]


def _argv(nodes: Path, pods: Path, work: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gpupack", "replay", "--nodes", str(nodes), "--pods", str(pods), "--seed", "42",
            "--max-nodes", "50", "--json", "--workdir", str(work), *extra]


def _left_running(work: Path) -> list[str]:
    """Processes whose command line names the run's work dir (the control plane's, the fleet's)."""
    found = subprocess.run(["pgrep", "-af", str(work)], capture_output=True, text=True, check=False)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def _check_prefix(report: dict[str, Any], nodes: Path, pods: Path) -> None:
    """The pods submitted are the plan's first ones, each decided, and the model followed them."""
    plan = plan_run(load_nodes(nodes), load_pods(pods).pods, 42, 1.3, 50)
    submitted = report["pods_submitted"]
    assert report["pods_planned"] == len(plan.workload.pods) > submitted
    assert [p["name"] for p in report["pods"]] == submission_order(plan)[:submitted]
    assert report["pods_bound"] + report["pods_unplaceable"] + report["pods_timed_out"] == submitted
    assert report["complete"] is False and report["alloc_at_130"]["live"] is None
    if submitted:
        assert report["model_following_live"]["pods"] == submitted
        assert report["model_following_live"]["divergences"] == 0, report["model_following_live"]
    for name in ("controller", "webhook", "agents"):
        assert report["components"][name]["peak_rss_mib"] > 0, name


@pytest.mark.timeout(600)
def test_stop_after_ends_the_submissions_and_reports_the_pods_submitted(tmp_path: Path) -> None:
    nodes, pods = synthetic_trace(tmp_path)
    work = tmp_path / "work"
    # 0.6 s of submissions: a pod takes tens of milliseconds at the least (admission, a planning
    # cycle, kube-scheduler's binding), so a few dozen at most of the ~280 planned.
    run = subprocess.run(_argv(nodes, pods, work, "--stop-after", "0.01"), cwd=ROOT, capture_output=True,
                         text=True, timeout=540)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["stopped"] == "budget" and report["pods_submitted"] >= 1
    assert "--stop-after's 0m01s are spent" in run.stderr
    _check_prefix(report, nodes, pods)
    assert _left_running(work) == []


@pytest.mark.timeout(600)
def test_sigterm_mid_run_stops_the_submissions_measures_and_stops_the_stack(tmp_path: Path) -> None:
    nodes, pods = synthetic_trace(tmp_path)
    work = tmp_path / "work"
    proc = subprocess.Popen(_argv(nodes, pods, work), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:  # the progress bar writes a line every 5 % when stderr is not a terminal
        seen.append(line)
        if " pods  bound " in line:
            proc.send_signal(signal.SIGTERM)
            break
    else:
        pytest.fail("the replay ended before its progress bar moved:\n" + "".join(seen)[-3000:])
    out, err = proc.communicate(timeout=540)
    assert proc.returncode == 1, err[-3000:]
    report = json.loads(out)
    assert report["stopped"] == "interrupted" and report["pods_submitted"] >= 1
    assert "interrupted after" in err
    _check_prefix(report, nodes, pods)
    assert _left_running(work) == []

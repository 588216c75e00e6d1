"""``gpupack replay usage`` end to end on a tiny synthetic usage trace (written in tmp_path, GenTD26 format).

Three pods of light use (10 % duty cycle or less, 10-15 GiB of an 80 GB GPU) for a little over three
trace hours, played at 60x on the real stack: kube-apiserver, etcd, kube-scheduler,
kube-controller-manager (the Deployments), kwok, the webhook over TLS, the controller (recommender on
the trace's clock, ``Recreate`` updater) and an agent per one-GPU node playing the trace. Each pod
is a Deployment created asking for a whole GPU; after an hour of trace time its workload is
recommended, the updater moves it by a rollout, the webhook sizes the replacement and it shares a
GPU. Asserts that the right-sizer observed, recommended, resized and packed every workload's pod,
and that the live figures, read by the simulator's own measure, agree with ``gpupack simulate
usage`` on the same pods within 2 points of ``gpu_hours_saved_pct`` (the command's exit code says
so too). No timing assertion. About four minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupack.testing.usage_traces import GIB, write_usage_trace

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200


def _trace(folder: Path) -> Path:
    return write_usage_trace(folder, {
        "p-a": [(10.0, 10 * GIB)] * STEPS,
        "p-b": [(5.0 if i % 5 else 30.0, 12 * GIB) for i in range(STEPS)],
        "p-c": [(8.0, 15 * GIB)] * (STEPS - 10),
    }, first={"p-c": 5})


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("usage-live")
    trace = _trace(tmp_path / "trace")
    run = subprocess.run(
        [sys.executable, "-m", "gpupack", "replay", "usage", "--trace", str(trace), "--gpu", "H100-80GB",
         "--mode", "recreate", "--time-scale", "60", "--json", "--workdir", str(tmp_path / "work")],
        cwd=ROOT, capture_output=True, text=True, timeout=840,
    )
    logs = tmp_path / "work" / "logs"
    report: dict[str, Any] = json.loads(run.stdout) if run.stdout.strip() else {}
    assert report, run.stderr[-3000:] + "".join(
        f"\n--- {p.name} ---\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log")))
    return {"report": report, "returncode": run.returncode, "stderr": run.stderr}


@pytest.mark.timeout(900)
def test_every_workload_is_observed_recommended_resized_and_packed(replayed: dict[str, Any]) -> None:
    right_sizer = replayed["report"]["right_sizer"]
    assert right_sizer["deployments"] == 3
    assert right_sizer["observed_workloads"] == 3  # the agents published each Deployment's pod's use
    assert right_sizer["recommended_workloads"] == 3  # a GPURecommendation provided for each
    assert right_sizer["resized_pods"] >= 3 and right_sizer["moves"] >= 3  # each moved by a rollout, sized
    assert right_sizer["shared_gpu_steps"] > 0  # and two of them shared a GPU
    live = replayed["report"]["live"]
    assert live["pods"] == 3 and live["gpu_hours"] < live["gpu_hours_baseline"]


@pytest.mark.timeout(900)
def test_the_live_figures_agree_with_the_simulators(replayed: dict[str, Any]) -> None:
    report = replayed["report"]
    assert set(report["live"]) == set(report["simulator"]) == set(report["difference"])
    assert report["live"]["gpu_hours_baseline"] == report["simulator"]["gpu_hours_baseline"]
    assert abs(report["difference"]["gpu_hours_saved_pct"]) <= 2.0, json.dumps(report, indent=1)
    assert abs(report["agreement_gap"]) <= 2.0 and report["agreement_against"] == "simulator_draws.mean"
    assert report["agrees"] is True and replayed["returncode"] == 0

"""``gpupack demo --json`` end to end: its own control plane, agents, webhook and controller.

The demo starts a separate control plane (its own ports and temp dir), so it
does not disturb the session's; it reuses the binaries the session built.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("pods_submitted", "pods_scheduled", "pods_rejected", "gpus_reshaped", "allocation_ratio", "occupied_ratio",
        "seconds")


def test_demo_json_summary(control_plane: Any) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gpupack", "demo", "--json", "--pods", "16", "--submit-seconds", "4", "--seed", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    for key in KEYS:
        assert key in summary, f"missing {key}"
    assert summary["pods_submitted"] == 16
    assert summary["pods_scheduled"] + summary["pods_rejected"] == 16
    assert summary["gpus_reshaped"] >= 1  # the GPUs start without instances: every MIG pod needs a reshape
    # Asked-for milli never exceeds what the pods' slices and replicas reserve (requests round up).
    assert 1.0 >= summary["occupied_ratio"] >= summary["allocation_ratio"] > 0.0
    assert "submitting 16 pods" in run.stderr  # progress goes to stderr with --json


def test_demo_rejects_bad_input() -> None:
    run = subprocess.run([sys.executable, "-m", "gpupack", "demo", "--pods", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "--pods must be 1..500" in run.stderr


def test_demo_with_faults_routes_around_them(control_plane: Any) -> None:
    """``gpupack demo --fault``: an XID on a busy MIG instance, a lost GPU and an ECC burst (later acknowledged)
    during the run; every fault is seen and excluded, no pod lands on a failed device, no instance in use on a
    healthy GPU is destroyed, and the run exits 0."""
    run = subprocess.run(
        [sys.executable, "-m", "gpupack", "demo", "--json", "--fault", "--pods", "24", "--submit-seconds", "12",
         "--seed", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["faults_injected"] == 3 and summary["faults_excluded"] == 3
    assert summary["pods_placed_on_unhealthy"] == 0
    assert summary["in_use_instances_destroyed"] == 0
    assert summary["fault_to_excluded_seconds_p95"] is not None
    assert {f["withdrawn_by_device_plugin"] for f in summary["faults"]} == {True, False}
    assert "FAULT: XID 94 on MIG instance" in run.stderr and "acknowledges" in run.stderr


def test_demo_on_a_dra_node_pool(control_plane: Any) -> None:
    """``gpupack demo --backend dra``: the same pods on a DRA node pool; every admitted pod's claim is
    allocated by kube-scheduler (MIG placements on the H100s, exact shares on the MPS node), and the
    summary has the device-plugin demo's keys plus ``claims_allocated``."""
    run = subprocess.run(
        [sys.executable, "-m", "gpupack", "demo", "--json", "--backend", "dra", "--pods", "16", "--submit-seconds",
         "4", "--seed", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    for key in KEYS:
        assert key in summary, f"missing {key}"
    admitted = summary["pods_submitted"] - summary["pods_rejected"]
    assert summary["pods_scheduled"] == admitted > 0
    # One claim per admitted pod, each seen allocated (finished pods' claims are counted before they go).
    assert summary["claims_allocated"] == admitted
    assert summary["gpus_reshaped"] == 0  # on DRA nothing is reshaped ahead: a claim's placement is its instance
    assert 1.0 >= summary["occupied_ratio"] >= summary["allocation_ratio"] > 0.0


def test_demo_shows_right_sizing_by_recreate(control_plane: Any) -> None:
    """``gpupack demo --right-sizing recreate`` on the built-in trace (no shared trace needed): each of the
    three Deployments that ask a whole GPU gets a provided GPURecommendation below it, the controller rolls
    each out once (the optional grant installed by the demo), and the new pods are right-sized at admission,
    holding less than the whole GPUs they held before."""
    run = subprocess.run(
        [sys.executable, "-m", "gpupack", "demo", "--json", "--right-sizing", "recreate", "--usage-time-scale", "360",
         "--pods", "6", "--submit-seconds", "3", "--seed", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["right_sizing"] == "Recreate"
    provided = [r for r in summary["recommendations"] if r["workload"].startswith("Deployment/") and r["provided"]]
    assert len(provided) == 3 and all(0 < r["gpu_milli"] < 1000 for r in provided)
    assert summary["recommendations_provided"] >= 3
    sized = summary["pods_right_sized"]
    assert len(sized) >= 3
    assert all(c["asked_milli"] == 1000 and c["milli"] < 1000 for p in sized for c in p["containers"])
    assert {m["object"] for m in summary["right_size_moves"]} == {"Deployment/svc-a", "Deployment/svc-b",
                                                                  "Deployment/svc-c"}
    assert all(m["reason"] == "RolledOutToRightSize" for m in summary["right_size_moves"])
    assert summary["right_sizing_gpus_before"] == 3.0 > summary["right_sizing_gpus_after"] > 0.0
    assert "right-sizing Recreate:" in run.stderr  # the progress lines show it


def test_demo_right_sizing_runs_on_its_own() -> None:
    run = subprocess.run([sys.executable, "-m", "gpupack", "demo", "--right-sizing", "initial", "--fault"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--right-sizing runs on its own" in run.stderr

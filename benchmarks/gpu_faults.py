"""Measure how fast GPU faults are routed around (a script, not a test; results in benchmarks/gpu_faults.md).

Runs ``gpupack demo --fault --json`` (the real control plane, three simulated nodes
with their agents, the webhook and the controller; fractional pods arriving while
an XID hits a busy MIG instance, a GPU falls off the bus, and an ECC burst hits the
MPS node, later acknowledged) once per seed, and pools the per-fault times:

* fault -> GPUNode status (the agent saw it and published it),
* fault -> the controller's planning cycle leaves it out (its metrics say so),
* fault -> the node no longer offers it (the device leaves the Node's allocatable,
  or, for a fault the device plugin keeps advertising, the node is labelled degraded),
* fault -> excluded (the later of the last two);

and sums the invariants: pods bound to a failed device after it was reported, and MIG
instances in use on healthy GPUs that vanished (both must be 0).

    python benchmarks/gpu_faults.py                     # 5 seeds, about 10 minutes on 2 cores
    python benchmarks/gpu_faults.py --seeds 7 8 --pods 80 --submit-seconds 40
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[rank], 2)


def run(seed: int, pods: int, submit_seconds: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "gpupack", "demo", "--fault", "--json", "--seed", str(seed),
               "--pods", str(pods), "--submit-seconds", str(submit_seconds)]
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if not done.stdout.strip():
        raise SystemExit(f"seed {seed}: the demo printed no summary (exit {done.returncode}):\n{done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout)
    summary["exit_code"] = done.returncode
    summary["wall_seconds"] = round(time.monotonic() - began, 1)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9, 10, 11], help="workload seeds, one run each")
    parser.add_argument("--pods", type=int, default=40, help="pods per run (default 40, the demo's)")
    parser.add_argument("--submit-seconds", type=float, default=20.0, help="submission window per run (default 20, the demo's)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_faults.json", help="JSON results")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        print(f"seed {seed}: running the demo with faults ...", file=sys.stderr, flush=True)
        summary = run(seed, args.pods, args.submit_seconds)
        runs.append({"seed": seed, **summary})
        print(f"seed {seed}: exit {summary['exit_code']}, {summary['faults_injected']} faults, excluded p95 "
              f"{summary['fault_to_excluded_seconds_p95']} s, placed on unhealthy "
              f"{summary['pods_placed_on_unhealthy']}, in-use destroyed {summary['in_use_instances_destroyed']}",
              file=sys.stderr, flush=True)
    faults = [f for r in runs for f in r["faults"]]

    def pooled(key: str, withdrawn: bool | None = None) -> dict[str, Any]:
        values = [f[key] for f in faults if f[key] is not None
                  and (withdrawn is None or f["withdrawn_by_device_plugin"] == withdrawn)]
        return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
                "max": round(max(values), 2) if values else None}

    result = {
        "machine": f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.system()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python", "benchmarks/gpu_faults.py", "--seeds", *map(str, args.seeds), "--pods",
                             str(args.pods), "--submit-seconds", f"{args.submit_seconds:g}"]),
        "runs": len(runs),
        "faults": len(faults),
        "faults_not_excluded": sum(1 for f in faults if f["to_excluded_seconds"] is None),
        "pods_placed_on_unhealthy": sum(r["pods_placed_on_unhealthy"] for r in runs),
        "in_use_instances_destroyed": sum(r["in_use_instances_destroyed"] for r in runs),
        "runs_completed": sum(1 for r in runs if r["exit_code"] == 0),
        "to_status_seconds": pooled("to_status_seconds"),
        "to_planner_seconds": pooled("to_planner_seconds"),
        "to_withdrawn_seconds": pooled("to_withdrawn_seconds"),
        "to_excluded_seconds": pooled("to_excluded_seconds"),
        "to_excluded_seconds_withdrawn_by_plugin": pooled("to_excluded_seconds", True),
        "to_excluded_seconds_kept_off_by_gpupack": pooled("to_excluded_seconds", False),
        "per_run": runs,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "per_run"}, indent=1))
    return 0 if result["pods_placed_on_unhealthy"] == 0 and result["in_use_instances_destroyed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

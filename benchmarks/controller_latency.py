"""Pod creation to scheduled, with and without a reshape, measured by ``gpupack demo``.

Runs ``gpupack demo --json`` (real control plane, webhook, controller, three
simulated GPU nodes with their agents and emulated device plugins) for several
seeds and reports the demo's per-pod latencies: pods the webhook gated (their
capacity had to be created: a MIG reshape or a node sharing change) versus
pods whose capacity existed at admission. The emulated device plugin
re-advertises at once, so no device-plugin restart delay is included.

    python benchmarks/controller_latency.py --seeds 3 --pods 60
    python benchmarks/controller_latency.py --seeds 3 --pods 60 --placement scheduler

``--placement`` sets the webhook's placement (``GPUPACK_WEBHOOK_PLACEMENT``):
``engine`` (the default: every pod gated, pinned by the controller's engine) or
``scheduler`` (pods whose capacity exists go straight to kube-scheduler), so the
cost of the engine's round trip is measured on the same demo.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--submit-seconds", type=float, default=30.0)
    parser.add_argument("--placement", choices=["engine", "scheduler"], default="engine")
    args = parser.parse_args(argv)
    env = dict(os.environ, GPUPACK_WEBHOOK_PLACEMENT=args.placement)
    rows = []
    for seed in range(1, args.seeds + 1):
        run = subprocess.run(
            [sys.executable, "-m", "gpupack", "demo", "--json", "--pods", str(args.pods),
             "--submit-seconds", str(args.submit_seconds), "--seed", str(seed)],
            cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
        )
        if run.returncode not in (0, 1):
            print(run.stderr[-2000:], file=sys.stderr)
            return run.returncode
        summary = json.loads(run.stdout)
        summary["seed"] = seed
        rows.append(summary)
    print(f"placement: {args.placement}")
    print("| seed | submitted | scheduled | rejected | GPUs reshaped | median s (reshape) | p95 s (reshape) "
          "| median s (capacity existed) | allocation (asked) | occupied |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['seed']} | {r['pods_submitted']} | {r['pods_scheduled']} | {r['pods_rejected']} | {r['gpus_reshaped']} | "
              f"{r['schedule_seconds_median_with_reshape']} | {r['schedule_seconds_p95_with_reshape']} | "
              f"{r['schedule_seconds_median_capacity_existed']} | {r['allocation_ratio']:.2f} | {r['occupied_ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

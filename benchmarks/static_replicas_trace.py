"""Static MPS/time-slicing replicas on the GenTD26 usage trace: what the device-plugin backend gives.

Each pod of the trace (``../shared/traces/genai-usage``) takes one replica, on 8-GPU nodes of
one GPU model whose GPUs are all shared into ``N`` replicas, the pool growing as needed
(``sharing.simulator.usage_replicas``: placement, memory limits, pods never moved), for every
``N`` in the default SharingPolicy's range (``replicas.min .. replicas.max``; ``N = 1`` is one
GPU per pod), by time-slicing (no memory limit) and by MPS (each pod limited to ``1 / N`` of the
GPU's memory).

Figures (``sharing.simulator.usage_figures``): GPU-hours against one GPU per pod, saturated
GPU-minutes (duty cycles summing above 100 %), GPU-memory overflow minutes (memory summing above
the GPU's), pod-minutes over the pod's MPS limit (each an OOM).

This is the static arm of the measurement that removed the replica feedback loop (issue 35,
item 4; the loop arm ran the controller's own ``decide_replicas`` before its removal):
benchmarks/controller.md, "The replica loop on real use".

    python benchmarks/static_replicas_trace.py --trace ../shared/traces/genai-usage --gpu H100-80GB H200-141GB
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupack.cli import UsageError  # noqa: E402
from gpupack.cli_simulate_usage import load_trace  # noqa: E402
from mig.errors import UnknownModelError  # noqa: E402
from sharing.api.crd import ReplicaPolicy  # noqa: E402
from sharing.simulator.usage import gpu_memory_bytes  # noqa: E402
from sharing.simulator.usage_figures import measure  # noqa: E402
from sharing.simulator.usage_replicas import SHARINGS, ReplicaReplay, Sharing  # noqa: E402
from sharing.usage.trace import UsageTrace  # noqa: E402


def row(trace: UsageTrace, model: str, replicas: int, sharing: Sharing) -> dict[str, Any]:
    """One replica count's figures on one GPU model."""
    _, memory = gpu_memory_bytes(model)
    figures = measure(trace, memory, ReplicaReplay(trace, memory, replicas, sharing).seatings())
    return {"gpu": model, "sharing": sharing, "replicas": replicas, **dataclasses.asdict(figures)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, required=True, metavar="DIR")
    parser.add_argument("--gpu", nargs="+", default=["H100-80GB", "H200-141GB"], metavar="MODEL")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        trace = load_trace(args.trace)
        for model in args.gpu:
            gpu_memory_bytes(model)
    except (UsageError, UnknownModelError) as exc:
        print(f"static_replicas_trace: {exc}", file=sys.stderr)
        return 2
    policy = ReplicaPolicy()
    began = time.perf_counter()
    rows = [row(trace, model, n, sharing)
            for model in args.gpu for sharing in SHARINGS for n in range(policy.min, policy.max + 1)]
    if args.json:
        print(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - began, 1)}, indent=2))
        return 0
    print("| GPU | sharing | N | GPU-hours (one per pod) | saved | saturated GPU-min | memory overflow min "
          "| pod-min over MPS limit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['gpu']} | {r['sharing']} | {r['replicas']} | {r['gpu_hours']:.1f} "
              f"({r['gpu_hours_baseline']:.1f}) | {r['gpu_hours_saved_pct']:.1f} % | "
              f"{r['saturated_gpu_minutes_pct']:.2f} % | {r['gpu_memory_overflow_minutes']:,.0f} | "
              f"{r['pod_minutes_over_limit_pct']:.2f} % |")
    print(f"({time.perf_counter() - began:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

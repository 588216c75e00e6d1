"""Replica feedback loop vs static replicas, on the shared pods of the openb traces.

What it replays: every fractional pod (one GPU, gpu_milli < 1000) of an openb
pod list, arriving at its ``creation_time`` and leaving at its
``deletion_time``, onto a pool of 8-GPU nodes sharing their GPUs by MPS. The
pool grows on demand, so the result is the number of GPUs the workload *needs*.

Placement (both runs): a pod asking ``m`` milli belongs to class
``k = min(8, floor(1000 / m))`` (the webhook's rule: ``k`` replicas of ``1/k``
GPU each cover ``m``); it goes to the first node of its class with a free
replica (first GPU with a free replica), and a new node of the class is opened
when none has one. Static: every node keeps ``r = k``. Loop: every control
period each node's ``r`` is re-decided by ``controller.planning.feedback.decide_replicas``
(the controller's own code) from the measured busy percent of its GPUs;
running pods keep their replica when ``r`` drops (changes affect new pods only).

Synthetic utilisation model (an assumption, stated and varied, not a
measurement): pod ``i`` uses on average ``f_i`` of what it asked, with
``f_i ~ Beta(a, b)`` of mean ``--use-mean`` (default 0.4, a = 2); each sample
is that mean times ``(1 + 0.3 z)``, ``z ~ N(0, 1)``, clipped to [0, 1] GPU. A
GPU's busy percent is the sum of its pods' samples, capped at 100; a
**saturation event** is one GPU-sample whose uncapped demand exceeds 100 %.
Each control period holds ``SUB_SAMPLES`` instantaneous samples; all are
checked for saturation, and the loop sees their mean (as the node agent
reports utilisation averaged over its sampling window), held at its peak over
the last ``--window`` periods (as the controller holds it).

    python benchmarks/controller_feedback.py --pods ../shared/traces/openb/openb_pod_list_gpushare40.csv
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.planning.feedback import FeedbackSettings, GpuLoad, decide_replicas  # noqa: E402
from sharing.simulator.traces import load_pods  # noqa: E402

GPUS_PER_NODE = 8
MAX_REPLICAS = 8
SUB_SAMPLES = 4
"""Instantaneous samples per control period: each is checked for saturation; the loop sees their mean."""


@dataclass
class SimNode:
    cls: int
    replicas: int
    gpus: list[list[int]] = field(default_factory=lambda: [[] for _ in range(GPUS_PER_NODE)])
    last_change: float = -1e18
    history: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    mode: str
    peak_gpus: int
    mean_gpus: float
    saturation_events: int
    gpu_samples: int
    replica_changes: int

    @property
    def saturation_rate(self) -> float:
        return self.saturation_events / self.gpu_samples if self.gpu_samples else 0.0


def run(path: Path, *, loop: bool, use_mean: float, seed: int, period: int, target: int, window: int = 6) -> Result:
    trace = load_pods(path)
    rng = np.random.default_rng(seed)
    pods = [
        (c, d, p.gpu_milli)
        for p, c, d in zip(trace.pods, trace.created, trace.deleted)
        if p.gpu_count == 1 and p.gpu_milli < 1000 and c is not None and d is not None and d > c
    ]
    a = 2.0
    b = a * (1 - use_mean) / use_mean
    factor = rng.beta(a, b, size=len(pods))
    mean_use = np.array([m / 1000 for _, _, m in pods]) * factor  # GPU fraction
    events: list[tuple[float, int, int]] = []  # (time, kind 0=leave 1=arrive, pod)
    for i, (c, d, _) in enumerate(pods):
        events.append((float(c), 1, i))
        events.append((float(d), 0, i))
    heapq.heapify(events)
    start, end = min(c for c, _, _ in pods), max(d for _, d, _ in pods)
    nodes: list[SimNode] = []
    where: dict[int, tuple[int, int]] = {}
    settings = FeedbackSettings(cooldown_seconds=period)
    sat = samples = changes = peak = 0
    gpu_time = 0.0
    t = float(start)
    while t <= end:
        while events and events[0][0] <= t:
            _, kind, i = heapq.heappop(events)
            if kind == 0:
                n, g = where.pop(i)
                nodes[n].gpus[g].remove(i)
                continue
            k = min(MAX_REPLICAS, 1000 // pods[i][2])
            placed = False
            for n, node in enumerate(nodes):
                if node.cls != k:
                    continue
                for g, residents in enumerate(node.gpus):
                    if len(residents) < node.replicas:
                        residents.append(i)
                        where[i] = (n, g)
                        placed = True
                        break
                if placed:
                    break
            if not placed:
                nodes.append(SimNode(cls=k, replicas=k))
                nodes[-1].gpus[0].append(i)
                where[i] = (len(nodes) - 1, 0)
        in_use = 0
        for node in nodes:
            loads = []
            for residents in node.gpus:
                if not residents:
                    loads.append(GpuLoad(0.0, 0))
                    continue
                in_use += 1
                draws = mean_use[residents][None, :] * (1 + 0.3 * rng.standard_normal((SUB_SAMPLES, len(residents))))
                demand_each = np.clip(draws, 0, 1).sum(axis=1)
                samples += SUB_SAMPLES
                sat += int((demand_each > 1.0).sum())
                demand = float(np.minimum(demand_each, 1.0).mean())
                loads.append(GpuLoad(min(100.0, 100 * demand), len(residents)))
            if loop:
                # Peak-hold over the last ``window`` periods, as the controller does
                # (ControllerSettings.feedback_window_seconds): heavy phases are remembered.
                node.history = [*node.history, [load.busy_percent for load in loads]][-window:]
                held = [max(h[g] for h in node.history) for g in range(GPUS_PER_NODE)]
                loads = [GpuLoad(held[g], load.pods) for g, load in enumerate(loads)]
                decision = decide_replicas(
                    node.replicas, loads, minimum=1, maximum=MAX_REPLICAS, target=target, settings=settings,
                )
                if decision.changed:
                    node.replicas = decision.proposed
                    changes += 1
        peak = max(peak, in_use)
        gpu_time += in_use
        t += period
    steps = max(1, int((end - start) // period) + 1)
    return Result("loop" if loop else "static", peak, gpu_time / steps, sat, samples, changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=Path, nargs="+", required=True)
    parser.add_argument("--use-mean", type=float, nargs="+", default=[0.4])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--period", type=int, default=3600, help="control/sampling period, trace seconds")
    parser.add_argument("--target", type=int, default=70)
    parser.add_argument("--window", type=int, default=6, help="peak-hold window of the loop, in periods")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for path in args.pods:
        if not path.is_file():
            print(f"controller_feedback: no such pod list: {path}", file=sys.stderr)
            return 2
        for use in args.use_mean:
            for loop in (False, True):
                began = time.perf_counter()
                results = [run(path, loop=loop, use_mean=use, seed=42 + s, period=args.period, target=args.target, window=args.window) for s in range(args.seeds)]
                rows.append({
                    "workload": path.stem, "use_mean": use, "mode": results[0].mode,
                    "peak_gpus": float(np.mean([r.peak_gpus for r in results])),
                    "mean_gpus": float(np.mean([r.mean_gpus for r in results])),
                    "saturation_events": float(np.mean([r.saturation_events for r in results])),
                    "saturation_rate": float(np.mean([r.saturation_rate for r in results])),
                    "replica_changes": float(np.mean([r.replica_changes for r in results])),
                    "seconds": time.perf_counter() - began,
                })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| workload | use mean | replicas | peak GPUs | mean GPUs | saturation events | saturated GPU-samples | replica changes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['workload']} | {r['use_mean']} | {r['mode']} | {r['peak_gpus']:.1f} | {r['mean_gpus']:.1f} | "
              f"{r['saturation_events']:.0f} | {100 * r['saturation_rate']:.2f} % | {r['replica_changes']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The replica loop vs static replicas, on the GenTD26 usage trace (issue 35, item 4).

Each pod of the trace (``../shared/traces/genai-usage``) takes one MPS/time-slicing replica,
on 8-GPU nodes of one GPU model, the pool growing as needed
(``sharing.simulator.usage_replicas``: placement, memory limits, pods never moved). Arms:

* **static N**: every node shares its GPUs into ``N`` replicas, for every ``N`` in the default
  SharingPolicy's range (``replicas.min .. replicas.max``; ``N = 1`` is one GPU per pod);
* **loop from N**: nodes start at ``N`` and, after every step of the trace (57 s), each node's
  count is re-decided by the controller's own ``controller.planning.feedback.decide_replicas``,
  fed as ``Controller._feedback`` feeds it: per GPU the busy percent (the pods' duty cycles
  summed, capped at 100 %) and the pods, each GPU held at its peak over
  ``feedback_window_seconds``, the policy's default bounds and ``targetUtilization``, the
  controller's default ``feedback_cooldown_seconds``. The loop starts at 2 or more: a node of
  one replica is not shared, and the controller leaves it alone.

What a change of ``r`` does in the product, from its code: the controller patches the GPUNode's
``spec.sharing.replicas``; the agent rewrites the device plugin's config and restarts the
plugin, which advertises ``r`` replicas per GPU. Nothing evicts or moves a running pod (the
docs: "changes affect only new pods"), so pods keep their GPU and their MPS limit, and a GPU can
hold more pods than its new ``r`` until some leave. Moves forced: none; the price is counted as
``oversubscribed_gpu_minutes`` and, under MPS, as limits that no longer sum to the GPU's memory.

Figures (``sharing.simulator.usage_figures``): GPU-hours against one GPU per pod, saturated
GPU-minutes (duty cycles summing above 100 %), GPU-memory overflow minutes (memory summing above
the GPU's), pod-minutes over the pod's MPS limit, and the loop's replica changes (each one a
device-plugin restart on the node).

    python benchmarks/replica_loop_trace.py --trace ../shared/traces/genai-usage --gpu H100-80GB H200-141GB
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.planning.feedback import FeedbackSettings, GpuLoad, decide_replicas  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from gpupack.cli import UsageError  # noqa: E402
from gpupack.cli_simulate_usage import load_trace  # noqa: E402
from sharing.api.crd import ReplicaPolicy  # noqa: E402
from sharing.simulator.usage import gpu_memory_bytes  # noqa: E402
from sharing.simulator.usage_figures import measure  # noqa: E402
from sharing.simulator.usage_replicas import SHARINGS, ReplicaReplay, SharedNode, Sharing  # noqa: E402
from sharing.usage.trace import UsageTrace  # noqa: E402

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Loop:
    """The controller's feedback step for every node of a replay (module docstring)."""

    def __init__(self, step_s: float, policy: ReplicaPolicy = ReplicaPolicy(),
                 controller: ControllerSettings = ControllerSettings()) -> None:
        self.step_s = step_s
        self.policy = policy
        self.window_s = controller.feedback_window_seconds
        self.settings = FeedbackSettings(cooldown_seconds=controller.feedback_cooldown_seconds)
        self.history: dict[int, list[tuple[datetime, Sequence[float]]]] = {}
        self.last_change: dict[int, datetime] = {}

    def __call__(self, step: int, index: int, node: SharedNode, busy: Sequence[float]) -> int:
        now = EPOCH + timedelta(seconds=step * self.step_s)
        # The controller's peak-hold (Controller._held): each GPU at its peak over the window.
        history = [(t, b) for t, b in self.history.get(index, []) if (now - t).total_seconds() <= self.window_s]
        history.append((now, busy))
        self.history[index] = history
        loads = [GpuLoad(max(b[g] for _, b in history), len(pods)) for g, pods in enumerate(node.gpus)]
        decision = decide_replicas(node.replicas, loads, minimum=self.policy.min, maximum=self.policy.max,
                                   target=self.policy.target_utilization, settings=self.settings,
                                   last_change=self.last_change.get(index), now=now)
        if decision.changed:
            self.last_change[index] = now
        return decision.proposed


def arm(trace: UsageTrace, model: str, replicas: int, sharing: Sharing, *, loop: bool) -> dict[str, Any]:
    """One arm's figures on one GPU model."""
    _, memory = gpu_memory_bytes(model)
    replay = ReplicaReplay(trace, memory, replicas, sharing, retune=Loop(trace.step_s) if loop else None)
    figures = measure(trace, memory, replay.seatings())
    return {
        "gpu": model, "sharing": sharing, "arm": "loop" if loop else "static", "replicas": replicas,
        **dataclasses.asdict(figures),
        "replica_changes": replay.replica_changes,
        "oversubscribed_gpu_minutes": round(replay.oversubscribed_gpu_steps * trace.step_s / 60.0, 1),
        "final_replicas": sorted(n.replicas for n in replay.nodes),
    }


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
    except (UsageError, ValueError) as exc:
        print(f"replica_loop_trace: {exc}", file=sys.stderr)
        return 2
    policy = ReplicaPolicy()
    began = time.perf_counter()
    rows = [arm(trace, model, n, sharing, loop=loop)
            for model in args.gpu for sharing in SHARINGS for n in range(policy.min, policy.max + 1)
            for loop in (False, True) if not (loop and n < 2)]
    if args.json:
        print(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - began, 1)}, indent=2))
        return 0
    print("| GPU | sharing | arm | N | GPU-hours (one per pod) | saved | saturated GPU-min | memory overflow min "
          "| pod-min over MPS limit | oversubscribed GPU-min | replica changes | final r per node |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['gpu']} | {r['sharing']} | {r['arm']} | {r['replicas']} | {r['gpu_hours']:.1f} "
              f"({r['gpu_hours_baseline']:.1f}) | {r['gpu_hours_saved_pct']:.1f} % | "
              f"{r['saturated_gpu_minutes_pct']:.2f} % | {r['gpu_memory_overflow_minutes']:.0f} | "
              f"{r['pod_minutes_over_limit_pct']:.2f} % | {r['oversubscribed_gpu_minutes']:.0f} | "
              f"{r['replica_changes']} | {','.join(map(str, r['final_replicas']))} |")
    print(f"({time.perf_counter() - began:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where gpupack's margin under the product model comes from: its node-wide rules or its score.

    python benchmarks/product_ablation.py                      # 13 workloads x 3 seeds (about 12 min on 2 cores)
    python benchmarks/product_ablation.py --workloads default,cpu050 --seeds 1

gpupack's policy differs from FGD in two ways under ``gpupack simulate --model
product``: its *score* (FGD's fragmentation gradient plus the regret and
stranding terms, ``sharing.packing.gpupack_policy`` items 1-3) and its
*node-wide rules* (items 4-6: which idle node is split, where pods above half a
GPU go, a replica of the pod's own size before a larger one). This script runs,
with the same seeds and the weights ``manifests/`` ships:

- ``FGD``: FGD's score, the default rules;
- ``FGD + gpupack's rules``: FGD's score with gpupack's three rules (the rules
  are gpupack's own methods, called from a policy that scores as FGD does);
- ``gpupack``: both.

It prints a Markdown table (docs/simulator.md quotes it). Nothing is written.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.simulate_product import _trace, replay_arguments  # noqa: E402
from sharing.packing.cluster import BoolArray, ClusterState  # noqa: E402
from sharing.packing.fgd import FgdPolicy  # noqa: E402
from sharing.packing.gpupack_policy import GpupackPolicy  # noqa: E402
from sharing.packing.specs import PodPlacement, PodSpec, Refusal  # noqa: E402
from sharing.packing.policy import Policy  # noqa: E402
from sharing.packing.typical import TypicalPods  # noqa: E402
from sharing.simulator.product import run_product  # noqa: E402
from sharing.simulator.scheduler_config import load_weights  # noqa: E402
from sharing.simulator.workload import published_seeds  # noqa: E402

CONFIGS = ("FGD", "FGD + gpupack's rules", "gpupack")


class FgdScoreGpupackRules(FgdPolicy):
    """FGD's node and GPU score; gpupack's node-wide rules, taken from a gpupack policy."""

    splits_before_wasting = GpupackPolicy.splits_before_wasting

    def __init__(self, typical: TypicalPods) -> None:
        super().__init__(typical)
        self._rules = GpupackPolicy(typical)

    def place_whole(self, cluster: ClusterState, pod: PodSpec, in_use: BoolArray, idle: BoolArray) -> PodPlacement | Refusal:
        return self._rules.place_whole(cluster, pod, in_use, idle)

    def switch_choice(self, cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: object,
                      small_only: bool = False) -> int | None:
        # gpupack's choice among the most feedable idle nodes, made with FGD's score.
        return GpupackPolicy.switch_choice(self, cluster, pod, candidates, replicas, small_only)  # type: ignore[arg-type]

    @property
    def _shared_cpu(self) -> float:  # read by GpupackPolicy.switch_choice
        return self._rules._shared_cpu


def _ablation(_name: str, _rng: np.random.Generator, typical: TypicalPods) -> Policy:
    return FgdScoreGpupackRules(typical)


def _one(job: tuple[str, str, int, str]) -> tuple[str, str, int, float]:
    workload, config, seed, traces = job
    nodes, pods = _trace(traces, workload)
    if config == "FGD + gpupack's rules":
        run = run_product(nodes, pods, "FGD", seed, load_weights(), policy_factory=_ablation)
    else:
        run = run_product(nodes, pods, config, seed, load_weights())
    value = run.alloc_at[130]
    assert value is not None
    return workload, config, seed, value


def main() -> None:
    args = replay_arguments(__doc__, seeds=3).parse_args()
    if not (args.traces / "openb_node_list_gpu_node.csv").exists():
        sys.exit(f"no openb traces in {args.traces} (see README: they live beside the checkout)")
    workloads = args.workloads.split(",")
    seeds = list(published_seeds(args.seeds))
    jobs = [(w, c, s, str(args.traces)) for w in workloads for c in CONFIGS for s in seeds]
    start = time.perf_counter()
    values: dict[tuple[str, str], list[float]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, (w, c, s, v) in enumerate(pool.map(_one, jobs), 1):
            values.setdefault((w, c), []).append(v)
            print(f"[{i}/{len(jobs)}] {w} {c} seed {s}: {v:.2f}", file=sys.stderr, flush=True)
    minutes = (time.perf_counter() - start) / 60
    print(f"Product model, allocation % at 130 % arrived demand, mean of seeds {seeds[0]}..{seeds[-1]}. "
          f"Machine: {os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.system()}; "
          f"{minutes:.1f} min with {args.jobs} worker process(es).\n")
    print("| workload | FGD | FGD + gpupack's rules | gpupack | rules − FGD | gpupack − (FGD + rules) |")
    print("|---|---|---|---|---|---|")
    for w in workloads:
        fgd, rules, gp = (sum(values[(w, c)]) / len(values[(w, c)]) for c in CONFIGS)
        print(f"| {w} | {fgd:.2f} | {rules:.2f} | {gp:.2f} | {rules - fgd:+.2f} | {gp - rules:+.2f} |")


if __name__ == "__main__":
    main()

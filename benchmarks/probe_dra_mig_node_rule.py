"""Probe of a candidate node rule for the engine's MIG choice on a DRA pool (issue 15, item 2).

Not the product's rule: ``sharing.dra.mig_choice`` (what the controller pins and
``benchmarks/simulate_dra_mig.py`` measures) ranks GPUs by best fit and ignores
the node's CPU and memory, and falls below kube-scheduler's unguided choice on
10 of 13 workloads. This script measures one alternative in the same model
(``sharing.simulator.dra_mig``) before it is built into the product:

    node: kube-scheduler's MostAllocated score with the node's MIG compute slices
          (held, plus the pod's) as a third resource of weight ``--gpu-weight``
          beside CPU and memory (the weights ``manifests/`` ships), ties to the
          lowest tie rank, as kube-scheduler's own pick;
    GPU and placement on that node: ``sharing.dra.mig_choice.choose`` / ``place_all``.

    python benchmarks/probe_dra_mig_node_rule.py --seeds 10              # about 12 min on 2 cores
    python benchmarks/probe_dra_mig_node_rule.py --workloads default,cpu200 --seeds 1 --gpu-weight 10

Prints, per workload, the mean over the seeds of the probe and of the unguided choice.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from simulate_product import _trace  # noqa: E402
from mig.catalog import find_model  # noqa: E402
from mig.model import PlacedInstance  # noqa: E402
from sharing.dra.mig_choice import choose, place_all  # noqa: E402
from sharing.packing.specs import PodSpec  # noqa: E402
from sharing.simulator import dra_mig  # noqa: E402
from sharing.simulator.product import scheduler_pick  # noqa: E402
from sharing.simulator.scheduler_config import load_weights  # noqa: E402

WORKLOADS = ("default", "cpu050", "cpu100", "cpu200", "gpushare40", "gpushare60", "gpushare80",
             "multigpu20", "multigpu30", "multigpu40")
"""gpuspec10/20/25 replay as default does on one GPU model (their GPU types are dropped)."""


class NodeRuleReplay(dra_mig.DraMigReplay):
    """The DRA MIG model with the probed node rule for GPU pods (module docstring)."""

    gpu_weight = 100

    def _choose(self, asked: tuple[str, ...], hosts: np.ndarray,
                cpu_shape: PodSpec) -> list[tuple[int, int, PlacedInstance]] | None:
        gpus, model = self.gpus, self.model
        candidates = np.flatnonzero(hosts)
        if candidates.size == 0:
            return None
        held = np.array([sum(model.profile(i.profile).compute_slices for layout in gpus.layouts[n] for i in layout)
                         for n in candidates])
        total = np.array([model.compute_slices * len(gpus.layouts[n]) for n in candidates])
        asks = sum(model.profile(p).compute_slices for p in asked)
        node = scheduler_pick(self.cluster, cpu_shape, candidates, self.weights, held + asks, total, self.gpu_weight)
        on_node = [gpus.mig_gpu(node, g) for g in range(len(gpus.layouts[node]))]
        if len(asked) == 1:
            one = choose(on_node, asked[0])
            picks = None if one is None else [one]
        else:
            picks = place_all(on_node, asked)
        return None if picks is None else [(node, gpu.index, instance) for gpu, instance in picks]


def _run(workload: str, seed: int, traces: str, model_name: str, probe: bool) -> float:
    nodes, pods = _trace(traces, workload)
    model = find_model(model_name)
    assert model is not None, model_name
    if not probe:
        run = dra_mig.run_dra_mig(nodes, pods, model, seed, load_weights(), "scheduler")
    else:
        original = dra_mig.DraMigReplay
        dra_mig.DraMigReplay = NodeRuleReplay  # type: ignore[misc]
        try:
            run = dra_mig.run_dra_mig(nodes, pods, model, seed, load_weights(), "engine")
        finally:
            dra_mig.DraMigReplay = original  # type: ignore[misc]
    value = run.alloc_at[130]
    assert value is not None
    return value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=str(HERE.parent.parent / "shared" / "traces" / "openb"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="published seeds 42.. (default 3)")
    parser.add_argument("--model", default="H100-80GB")
    parser.add_argument("--gpu-weight", type=int, default=100, help="weight of the MIG compute slices (default 100)")
    args = parser.parse_args(argv)
    NodeRuleReplay.gpu_weight = args.gpu_weight
    began = time.perf_counter()
    print(f"| workload | probe (gpu weight {args.gpu_weight}) | unguided | probe − unguided |")
    print("|---|---:|---:|---:|")
    wins = 0
    names = [w for w in args.workloads.split(",") if w]
    for workload in names:
        seeds = range(42, 42 + args.seeds)
        probe = float(np.mean([_run(workload, s, args.traces, args.model, True) for s in seeds]))
        unguided = float(np.mean([_run(workload, s, args.traces, args.model, False) for s in seeds]))
        wins += probe > unguided
        print(f"| {workload} | {probe:.2f} | {unguided:.2f} | {probe - unguided:+.2f} |", flush=True)
    print(f"\nprobe above unguided on {wins} of {len(names)}; {args.seeds} seed(s); "
          f"{(time.perf_counter() - began) / 60:.1f} min")


if __name__ == "__main__":
    main()

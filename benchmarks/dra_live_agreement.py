"""Live DRA path against the simulator's DRA model, at demo size (a script, not a test).

``gpupack.demo.agreement`` has the method: a DRA demo stack of shared nodes,
fractional pods submitted one at a time (the model's protocol: pods arrive one
by one and never leave), then the same pods replayed by the DRA model
(``sharing.simulator.dra``) in the same order; compared pod by pod.

    python benchmarks/dra_live_agreement.py                    # 3 seeds x 60 pods, about 10 min on 2 cores
    python benchmarks/dra_live_agreement.py --seeds 7 --pods 40 --policy FGD
    python benchmarks/dra_live_agreement.py --mixed --out benchmarks/dra_live_agreement_mixed.json
        # pods ask CPU too, every third asks for no GPU and is placed by the engine as well
    python benchmarks/dra_live_agreement.py --mig --pods 40 --out benchmarks/dra_live_agreement_mig.json
        # MIG nodes in dynamic mode, MIG pods asking CPU; compared with the DRA model on MIG GPUs

Writes benchmarks/dra_live_agreement.json (``--out`` to change) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpupack.demo.agreement import (  # noqa: E402
    DEFAULT_NODES, MIG_NODES, compare, live_placements, mig_claim_device, mig_model_placements, mig_pods, mixed_pods,
    model_placements, shared_pods)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def _workdir() -> Iterator[Path]:
    """A demo stack's working directory for one seed, removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="gpupack-agreement-"))
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9], help="workload seeds (default 7 8 9)")
    parser.add_argument("--pods", type=int, default=60,
                        help="pods per seed (default 60: more than the 16 GPUs hold, so some wait)")
    parser.add_argument("--policy", default="gpupack", help="the engine's policy, live (--policy) and model")
    parser.add_argument("--mixed", action="store_true",
                        help="pods ask 4-12 cores, and every third asks for no GPU (8-32 cores) and is labelled "
                             "for the DRA pool, so the engine places it too (gpupack.demo.agreement.mixed_pods)")
    parser.add_argument("--mig", action="store_true",
                        help="MIG nodes in dynamic mode (gpupack.demo.agreement.MIG_NODES) and MIG pods asking 2-16 "
                             "cores (mig_pods), against the DRA model on MIG GPUs; compares node and device")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "dra_live_agreement.json")
    args = parser.parse_args()
    if args.pods < 1:
        parser.error("--pods must be at least 1")
    if args.mig and args.mixed:
        parser.error("--mig and --mixed are two workloads: choose one")
    nodes = MIG_NODES if args.mig else DEFAULT_NODES
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        if args.mig:
            pods = mig_pods(args.pods, seed)
            with _workdir() as workdir:
                live_mig = live_placements(workdir, nodes, pods, args.policy, _say, where_of=mig_claim_device)
            result = compare(nodes, pods, live_mig, mig_model_placements(nodes, pods)).as_json()
        else:
            pods = mixed_pods(args.pods, seed) if args.mixed else shared_pods(args.pods, seed)
            with _workdir() as workdir:
                live = live_placements(workdir, nodes, pods, args.policy, _say)
            model = model_placements(nodes, pods, args.policy)
            workload = model_placements(nodes, pods, args.policy, typical="workload")
            result = compare(nodes, pods, live, model, workload).as_json()
        runs.append({"seed": seed, **result})
        print(json.dumps(runs[-1]), flush=True)
    report = {
        "command": "python benchmarks/dra_live_agreement.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.system()}",
        "nodes": [f"{n.name}: {n.gpus} x {n.model} ({'MIG, dynamic' if args.mig else n.sharing})" for n in nodes],
        "policy": args.policy,
        "pods": ("mig_pods (MIG, CPU asks; compared by node and device)" if args.mig else
                 "mixed_pods (CPU asks; every third asks for no GPU)" if args.mixed else "shared_pods"),
        "runs": runs,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'seed':>5} {'pods':>5} {'live':>5} {'model':>6} {'alloc live':>11} {'alloc model':>12} {'same GPU':>9}")
    for r in runs:
        print(f"{r['seed']:>5} {r['pods']:>5} {r['placed_live']:>5} {r['placed_model']:>6} "
              f"{r['allocation_live_percent']:>10.2f}% {r['allocation_model_percent']:>11.2f}% "
              f"{r['same_gpu']:>4}/{r['placed_by_both']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The DRA backend on MIG GPUs: gpupack's pinned placement against kube-scheduler unguided.

    python benchmarks/simulate_dra_mig.py                       # 13 workloads x 3 seeds, H100-80GB (~15 min on 2 cores)
    python benchmarks/simulate_dra_mig.py --model A100-80GB --seeds 1 --workloads default

Issue 15's item 2 asks that the allocation reached through DRA be shown, on the
openb traces, MIG variant and shared, to match the engine's and to beat
kube-scheduler's unguided choice. The shared half is ``simulate_dra.py``'s
``kube-scheduler unguided`` column; this is the MIG half:
``sharing.simulator.dra_mig.run_dra_mig`` on every openb node with its GPUs made
``--model`` GPUs in dynamic MIG mode (partitionable devices), the protocol's
arrivals at 130 %, once with the engine's choice pinned
(``sharing.dra.mig_choice.place_pod``, what the live controller pins: the node
fullest in CPU, memory and MIG slices, then the GPU and placement) and once
unguided (kube-scheduler's node, its allocator's first fit).

Writes ``benchmarks/dra_mig_results.json`` (``--out``) and re-renders the "DRA
backend" section of ``benchmarks/RESULTS.md`` (``simulate_dra.write_section``,
which shows these runs under "MIG GPUs" when the JSON exists).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulate_dra import DEFAULT_OUT as DRA_OUT  # noqa: E402
from simulate_dra import HERE, write_section  # noqa: E402
from simulate_product import _trace, replay_arguments  # noqa: E402
from mig.catalog import find_model, model_names  # noqa: E402
from sharing.simulator.dra_mig import run_dra_mig  # noqa: E402
from sharing.simulator.scheduler_config import load_weights  # noqa: E402
from sharing.simulator.workload import published_seeds  # noqa: E402

DEFAULT_OUT = HERE / "dra_mig_results.json"
PLACERS = ("engine", "scheduler")

Job = tuple[str, str, int, str, str]
"""workload, placer (engine or scheduler), seed, traces folder, MIG model."""


def _one(job: Job) -> dict[str, Any]:
    workload, placer, seed, traces, model_name = job
    nodes, pods = _trace(traces, workload)
    model = find_model(model_name)
    assert model is not None
    start = time.perf_counter()
    run = run_dra_mig(nodes, pods, model, seed, load_weights(), placer)  # type: ignore[arg-type]
    return {"workload": workload, "placer": placer, "seed": seed, "model": model.product,
            "alloc_130": run.alloc_at[130], "occupied_130": run.occupied_at[130], "failed_pods": run.failed_pods,
            "wall_s": round(time.perf_counter() - start, 2)}


def main() -> None:
    ap = replay_arguments(__doc__, seeds=3)
    ap.add_argument("--model", default="H100-80GB", help="the MIG-capable GPU every node gets (default H100-80GB)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="raw results; RESULTS.md is re-rendered only when this is the default file")
    args = ap.parse_args()
    model = find_model(args.model)
    if model is None:
        sys.exit(f"--model: unknown GPU model {args.model!r}; choose one of {', '.join(model_names())}")
    if not (args.traces / "openb_node_list_gpu_node.csv").exists():
        sys.exit(f"no openb traces in {args.traces} (see README: they live beside the checkout)")
    jobs: list[Job] = [(w, placer, seed, str(args.traces), args.model) for seed in published_seeds(args.seeds)
                       for w in args.workloads.split(",") for placer in PLACERS]
    start = time.perf_counter()
    runs = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, result in enumerate(pool.map(_one, jobs), 1):
            runs.append(result)
            print(f"[{i}/{len(jobs)} {(time.perf_counter() - start) / 60:.1f} min] {result['workload']} "
                  f"{result['placer']} seed {result['seed']}: {result['alloc_130']:.2f} ({result['wall_s']:.1f} s)",
                  file=sys.stderr, flush=True)
    data = {
        "command": "python benchmarks/simulate_dra_mig.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.system()}, shared with "
                   "other work",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "wall_s": round(time.perf_counter() - start, 1),
        "model": model.product,
        "seeds": list(published_seeds(args.seeds)),
        "runs": runs,
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    if args.out == DEFAULT_OUT and DRA_OUT.exists():
        write_section(json.loads(DRA_OUT.read_text()), HERE / "RESULTS.md")


if __name__ == "__main__":
    main()

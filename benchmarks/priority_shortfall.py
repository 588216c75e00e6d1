"""Why high-priority pods go unplaced in the product model (issue 36): what each one asked and what stopped it.

    nice python benchmarks/priority_shortfall.py --workloads default,gpushare40,cpu200 --seeds 10 --jobs 2

A measurement harness beside ``benchmarks/priority.py``; it changes no product code. For each
workload and published seed it runs ``--priority qos --preemption engine`` (the run
``benchmarks/priority.py`` reports) and watches every high pod (LS, Guaranteed, Burstable) that fits
nowhere even after the preemption step (:meth:`sharing.simulator.preempting.Preempting.make_room`
returned None). For each it records what the pod asked (whole GPUs or a fraction, CPU, memory), which
path preempts for it live (kube-scheduler's default for an ``nvidia.com/gpu`` pod, then the engine's;
the engine for a fraction), and, on the cluster at that moment with every lower-priority pod gone:

- *plan possible*: nodes where a GPU (free, or held by lower pods only, or a node whose GPU pods are
  all lower and may be reshaped), the CPU and the memory are all there: only on such a node can any
  preemption, the engine's or kube-scheduler's, make room (the upper bound both use);
- *GPU, short of CPU/memory*: a GPU could be freed, but nowhere beside the CPU and memory;
- *no GPU*: no node can free a GPU of the pod's kind at all;
- *lower pods left*: the GPU milli lower-priority pods still held, as a share of the cluster's;
- *able nodes*: the nodes whose totals (GPU count and model, CPU, memory) could hold the pod on an
  empty cluster, and how many of them hold a high pod that kube-scheduler placed (``nvidia.com/gpu``,
  CPU-only) and how many one the engine placed (a fraction: a replica, or a whole GPU for one above
  half a GPU): those are the pods that stand in the way, and no preemption may take them.

It also runs two other placements of kube-scheduler's pods, each over the same arrivals, for their
high placed, allocation, preempted milli and paired preempted milli: without gpupack's prioritize
extender (MostAllocated alone, the product before it), and with the engine's own rule instead of the
extender's (``sharing.packing.priority_affinity``: no GPU pod of another priority first, against no
GPU pod of lower priority first). And a bound: the same arrivals with every low (BE) pod dropped at arrival, so that no
lower pod is ever placed: the high pods' placed share with nothing of lower priority in the way
and kube-scheduler and the engine placing as they do. It is a reference, not a proof: preemption
removes lower pods and never moves high ones, so its best is a cluster whose high pods sit where
they were placed beside lower ones; the bound shows what those same placement rules reach when
nothing lower was ever there.

The watch wraps ``Preempting.make_room`` and ``ProductReplay.place`` for the run's duration only.
Writes ``benchmarks/priority_shortfall.json`` and ``benchmarks/priority_shortfall.md`` (both only
when ``--out`` is the default) and prints the table.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority import _trace  # noqa: E402
from simulate_product import replay_arguments  # noqa: E402
from sharing.packing import preemption as engine  # noqa: E402
from sharing.packing.cluster import BoolArray  # noqa: E402
from sharing.packing.specs import GPU_MILLI, PodSpec  # noqa: E402
from sharing.rules.priority import HIGH_PRIORITY  # noqa: E402
from sharing.simulator import preempting, product  # noqa: E402
from sharing.simulator.scheduler_config import load_weights  # noqa: E402
from sharing.simulator.tally import ArrivalTally  # noqa: E402
from sharing.simulator.workload import published_seeds, trace_name  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "priority_shortfall.json"
POLICY = "gpupack"


def _failure(state: preempting.Preempting, pod: PodSpec, view: PodSpec, fractions: set[str]) -> dict[str, Any]:
    """What ``pod`` asked and what stood in its way, on the state after its preemption step failed."""
    replay, placed = state.replay, state.placed
    cluster, modes, used = replay.cluster, replay.modes, replay.used
    priority = state.of(pod)
    kinds = engine._kinds(cluster, modes, view, preempting.own_size(pod, view, replay.live_path), reshape=True)
    able = kinds != engine._NONE
    lower = placed.below(priority.value)
    ones = np.ones_like(placed.node)
    cpu_mem = able & (cluster.cpu_free + placed.per_node(lower, placed.cpu) >= view.cpu_milli)
    cpu_mem &= cluster.mem_free + placed.per_node(lower, placed.mem) >= view.memory_mib
    gpu = engine._upper_bound(cluster, modes, used, placed, view, priority, kinds)
    # _upper_bound asks for CPU and memory too; the GPU alone, as it counts it:
    gpu_rows = placed.alive & placed.gpu_pod
    replicas = engine._free_replicas(cluster, modes, used) + placed.per_node(lower & placed.replica, ones)
    whole = cluster.full_count + placed.per_node(lower, placed.gpus)
    all_lower = placed.per_node(gpu_rows, ones) == placed.per_node(lower & gpu_rows, ones)
    gpu_only = able & np.select([kinds == engine._REPLICA, kinds == engine._GPUS, kinds == engine._RESHAPE],
                                [replicas > 0, whole >= view.gpu_count, all_lower], default=True)
    totals = able & (cluster.cpu_total >= view.cpu_milli) & (cluster.mem_total >= view.memory_mib)
    # Per node, the high pods there by who placed them (a fraction's is the engine's, live too).
    kube_high = np.zeros(len(cluster), dtype=bool)
    engine_high = np.zeros(len(cluster), dtype=bool)
    for node in np.flatnonzero(totals):
        for v in placed.on_node(int(node)):
            if v.priority >= priority.value:
                if trace_name(v.key) in fractions:
                    engine_high[node] = True
                else:
                    kube_high[node] = True
    return {
        "milli": pod.gpu_total_milli, "gpus": view.gpu_count, "fraction": pod.is_shared,
        "cpu": view.cpu_milli, "mem": view.memory_mib,
        "lower_gpu_milli": int(placed.milli[lower & placed.gpu_pod].sum()),
        "capacity": int(cluster.gpu_count.sum()) * GPU_MILLI,
        "plan_possible": bool(gpu.any()), "gpu_only": bool(gpu_only.any()), "cpu_mem_only": bool(cpu_mem.any()),
        "able_nodes": int(totals.sum()),
        "able_with_kube_high": int(kube_high.sum()), "able_with_engine_high": int(engine_high.sum()),
        "able_with_engine_high_only": int((engine_high & ~kube_high).sum()),
        "able_without_high": int((totals & ~engine_high & ~kube_high).sum()),
    }


@contextmanager
def _patched(owner: type, name: str, value: object) -> Iterator[None]:
    """``owner.name`` is ``value`` for the duration of the block, and what it was after."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _watch(failures: list[dict[str, Any]], fractions: set[str]) -> AbstractContextManager[None]:
    """Record every high pod whose preemption step fails, for the duration of the block."""
    make_room = preempting.Preempting.make_room

    def watched(self: preempting.Preempting, pod: PodSpec, view: PodSpec, tally: ArrivalTally) -> float | None:
        taken = make_room(self, pod, view, tally)
        if taken is None and self.of(pod).value >= HIGH_PRIORITY:
            failures.append(_failure(self, pod, view, fractions))
        return taken

    return _patched(preempting.Preempting, "make_room", watched)


@contextmanager
def _without_low(priority_of: Callable[[str], int]) -> Iterator[None]:
    """Drop every pod below HIGH_PRIORITY at arrival (never placed, never preempting), for the block."""
    place, make_room = product.ProductReplay.place, preempting.Preempting.make_room

    def place_high(self: product.ProductReplay, pod: PodSpec) -> float | None:
        if priority_of(pod.name) < HIGH_PRIORITY:
            self.last_node = self.last_placement = None
            return None
        return place(self, pod)

    def room_high(self: preempting.Preempting, pod: PodSpec, view: PodSpec, tally: ArrivalTally) -> float | None:
        return None if self.of(pod).value < HIGH_PRIORITY else make_room(self, pod, view, tally)

    with _patched(product.ProductReplay, "place", place_high), \
            _patched(preempting.Preempting, "make_room", room_high):
        yield


def _no_extender() -> AbstractContextManager[None]:
    """kube-scheduler places its pods by MostAllocated alone, as without gpupack's prioritize extender
    (the product before it), for the block."""

    def everywhere(self: preempting.Preempting, pod: PodSpec) -> BoolArray:
        return np.ones(len(self.replay.cluster), dtype=bool)

    return _patched(preempting.Preempting, "no_lower", everywhere)


def _kube_unmixed() -> AbstractContextManager[None]:
    """kube-scheduler's pods prefer the engine's rule (no GPU pod of another priority) instead of the
    extender's (no GPU pod of lower priority), for the block."""
    return _patched(preempting.Preempting, "no_lower", preempting.Preempting.unmixed)


VARIANTS: dict[str, Callable[[], AbstractContextManager[None]]] = {"no_extender": _no_extender,
                                                                   "kube_unmixed": _kube_unmixed}
"""Rule changes tried against the engine run (module docstring)."""


def _figures(run: product.ProductRun) -> dict[str, float]:
    arrived, placed = _high_placed(run)
    assert run.priority is not None
    return {"high_placed_percent": 100 * placed / arrived, "alloc_130": float(run.alloc_at[130] or 0.0),
            "preempted_milli": run.priority.preempted_milli, "paired_engine_milli": run.priority.paired_engine_milli,
            "paired_scheduler_milli": run.priority.paired_scheduler_milli}


def _high_placed(run: product.ProductRun) -> tuple[int, int]:
    figures = run.priority
    assert figures is not None
    high = [c for c, (_, _) in figures.milli_by_class.items() if c != "BE"]
    return (sum(figures.milli_by_class[c][0] for c in high), sum(figures.milli_by_class[c][1] for c in high))


def _one(job: tuple[str, int, str]) -> dict[str, Any]:
    workload, seed, traces = job
    nodes, pods, priorities = _trace(traces, workload)
    fractions = {p.name for p in pods if p.is_shared}
    failures: list[dict[str, Any]] = []
    with _watch(failures, fractions):
        run = product.run_product(nodes, pods, POLICY, seed, load_weights(), priorities=priorities,
                                  preemption="engine")
    arrived, placed = _high_placed(run)
    with _without_low(lambda name: priorities[trace_name(name)].value):
        bound = product.run_product(nodes, pods, POLICY, seed, load_weights(), priorities=priorities,
                                    preemption="engine")
    bound_arrived, bound_placed = _high_placed(bound)
    variants = {"engine": _figures(run)}
    for name, variant in VARIANTS.items():
        with variant():
            variants[name] = _figures(product.run_product(nodes, pods, POLICY, seed, load_weights(),
                                                          priorities=priorities, preemption="engine"))
    return {"workload": workload, "seed": seed, "high_arrived": arrived, "high_placed": placed,
            "bound_arrived": bound_arrived, "bound_placed": bound_placed, "summary": summary(failures),
            "variants": variants}


def summary(failures: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's failures summed: milli per kind of failure, and milli-weighted sums of the shares."""

    def milli(pred: Callable[[dict[str, Any]], bool]) -> int:
        return int(sum(f["milli"] for f in failures if pred(f)))

    def weighted(key: str) -> float:
        # Over the failures, the share of their able nodes that hold such a pod, weighted by milli.
        return float(sum(f["milli"] * f[key] / max(1, f["able_nodes"]) for f in failures))

    asks: dict[str, int] = {}
    for f in failures:
        key = "f" if f["fraction"] else str(f["gpus"])
        asks[key] = asks.get(key, 0) + f["milli"]
    return {
        "pods": len(failures), "milli": milli(lambda f: True), "fraction": milli(lambda f: f["fraction"]),
        "plan_possible": milli(lambda f: f["plan_possible"]),
        "gpu_short": milli(lambda f: f["gpu_only"] and not f["plan_possible"]),
        "no_gpu": milli(lambda f: not f["gpu_only"]),
        "lower_left": sum(f["milli"] * f["lower_gpu_milli"] / f["capacity"] for f in failures),
        **{key: weighted(f"able_{key}") for key in ("with_kube_high", "with_engine_high", "with_engine_high_only",
                                                    "without_high")},
        "asks": asks,
    }


def render(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | high placed | high unplaced, milli per run | whole-GPU pods (kube-scheduler's) | "
        "fractions (the engine's) | lower pods' GPU milli left, % of capacity | plan possible | "
        "GPU, short of CPU/memory | no GPU | able nodes holding a high pod: kube's / the engine's / "
        "the engine's only / none | bound: no BE pod |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in dict.fromkeys(r["workload"] for r in runs):
        sel = [r for r in runs if r["workload"] == w]
        n = len(sel)

        def total(key: str) -> float:
            return float(sum(r["summary"][key] for r in sel))

        milli = total("milli")

        def share(key: str) -> str:
            return f"{100 * total(key) / milli:.1f} %" if milli else "-"

        def able(key: str) -> str:
            return f"{100 * total(key) / max(1.0, milli):.1f}"

        placed = sum(100 * r["high_placed"] / r["high_arrived"] for r in sel) / n
        bound = [100 * r["bound_placed"] / r["bound_arrived"] for r in sel]
        lines.append(
            f"| {w} | {placed:.2f} | {milli / n:,.0f} | {100 - 100 * total('fraction') / max(1.0, milli):.1f} % | "
            f"{share('fraction')} | {100 * total('lower_left') / max(1.0, milli):.1f} | {share('plan_possible')} | "
            f"{share('gpu_short')} | {share('no_gpu')} | {able('with_kube_high')} / {able('with_engine_high')} / "
            f"{able('with_engine_high_only')} / {able('without_high')} % | "
            f"{sum(bound) / n:.2f} (min {min(bound):.2f}) |")
    lines += ["", "Unplaced high milli per run by what the pod asked (whole GPUs; `f`: a fraction):", ""]
    for w in dict.fromkeys(r["workload"] for r in runs):
        sel = [r for r in runs if r["workload"] == w]
        asks: dict[str, int] = {}
        for r in sel:
            for key, value in r["summary"]["asks"].items():
                asks[key] = asks.get(key, 0) + value
        lines.append(f"- {w}: " + ", ".join(f"{k}: {v / len(sel):,.0f}" for k, v in sorted(asks.items())))
    lines += ["", "kube-scheduler's placement, same seeds (means): high placed %, alloc@130 %, preempted milli per "
              "run, and the engine's own preemptions against kube-scheduler's default for the same pods on the same "
              "states (paired, summed over the seeds):", "",
              "| workload | with the extender: no lower-priority GPU pod first (the product) | without the extender "
              "(MostAllocated alone) | the engine's rule for kube-scheduler's pods (no GPU pod of another priority first) |",
              "|---|---|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in runs):
        sel = [r for r in runs if r["workload"] == w and "variants" in r]
        if not sel:
            continue

        def cell(name: str) -> str:
            def mean(key: str) -> float:
                return float(sum(r["variants"][name][key] for r in sel)) / len(sel)
            engine = sum(r["variants"][name].get("paired_engine_milli", 0) for r in sel)
            kube = sum(r["variants"][name].get("paired_scheduler_milli", 0) for r in sel)
            paired = f", paired {100.0 * (engine / kube - 1):+.1f} %" if kube else ""
            return (f"{mean('high_placed_percent'):.2f}, {mean('alloc_130'):.2f}, {mean('preempted_milli'):,.0f}"
                    f"{paired}")

        lines.append(f"| {w} | {cell('engine')} | {cell('no_extender')} | {cell('kube_unmixed')} |")
    return "\n".join(lines)


def main() -> None:
    ap = replay_arguments(__doc__, seeds=10)
    ap.set_defaults(workloads="gpushare40,cpu200")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="raw results")
    ap.add_argument("--from-json", action="store_true", help="run nothing: re-render the table from --out")
    args = ap.parse_args()
    if args.from_json:
        data = json.loads(args.out.read_text())
        print(render(data["runs"]))
        if args.out == DEFAULT_OUT:
            write_page(data)
        return
    jobs = [(w, seed, str(args.traces)) for seed in published_seeds(args.seeds) for w in args.workloads.split(",")]
    start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(_one, jobs):
            runs.append(result)
            print(f"{result['workload']} seed {result['seed']}: {result['summary']['pods']} high pods unplaced",
                  file=sys.stderr, flush=True)
    data = {"machine": f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.system()}",
            "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "wall_s": time.perf_counter() - start,
            "jobs": args.jobs, "runs": runs}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(render(runs))
    if args.out == DEFAULT_OUT:
        write_page(data)


def write_page(data: dict[str, Any]) -> None:
    seeds = sorted({r["seed"] for r in data["runs"]})
    workloads = ",".join(dict.fromkeys(r["workload"] for r in data["runs"]))
    page = "\n".join([
        "# Why high-priority pods go unplaced in the product model (issue 36)",
        "",
        f"Generated by `nice python benchmarks/priority_shortfall.py --workloads {workloads} --seeds "
        f"{len(seeds)} --jobs {data['jobs']}` (traces in `../shared/traces/openb`; seeds {seeds[0]}..{seeds[-1]}, "
        "`--priority qos --preemption engine`, 130 % arrived demand, the whole 1,213-node cluster, the runs "
        f"[priority.md](priority.md) reports). Machine: {data['machine']}; run at {data['date']} UTC, "
        f"{data['wall_s'] / 60:.1f} min. The script's docstring says what each column counts.",
        "",
        "Per workload, over the high pods (LS, Guaranteed, Burstable) that fit nowhere even after the "
        "preemption step, shares of their GPU milli: by who places them live (an `nvidia.com/gpu` pod: "
        "kube-scheduler, with its default preemption and then the engine's; a fraction: the engine); by what "
        "the cluster offered at that moment with every lower-priority pod gone (*plan possible*: a node with a "
        "GPU, the CPU and the memory, where some preemption could make room); and, over the nodes whose "
        "totals could hold the pod (*able nodes*), the share holding a high pod placed by kube-scheduler, by "
        "the engine, by the engine only, or none (milli-weighted means). *Bound*: the same arrivals with "
        "every BE pod dropped at arrival, the high pods' placed share (mean of the seeds): what the same "
        "placement rules reach when nothing lower was ever in the way (a reference: preemption removes lower "
        "pods and never moves high ones).",
        "",
        render(data["runs"]),
        "",
    ])
    (HERE / "priority_shortfall.md").write_text(page)


if __name__ == "__main__":
    main()

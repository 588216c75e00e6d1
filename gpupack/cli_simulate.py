"""``gpupack simulate``: replay an openb trace with one policy, under the FGD paper's protocol or the product's rules.

``--model fgd`` (the default, so published reproductions keep working) is the
FGD paper's protocol: any pod may take any milli of a GPU. It compares
algorithms with the literature; it is not what the live system can do.
``--model product`` applies the live rules of the device-plugin backend:
node-wide replica counts, a replica of 1000/r for a pod of m <= 1000/r milli,
whole GPUs for pods above half a GPU, shared and whole-GPU nodes kept apart,
and the pods kube-scheduler places (whole-GPU, CPU-only) scored with the
configuration manifests/ ships. ``--policy`` then names the packing engine's
policy for the pods the engine places; ``--live-path scheduler`` models the
earlier live path (fractional pods scored by kube-scheduler) for comparison.

``--model product --backend dra`` applies the rules of the DRA backend instead
(consumable capacity): a fractional pod claims its share rounded up to the
request policy's step (``--share-unit``, default 50 milli) on any GPU with room,
with no node-wide replica count; whole-GPU pods take GPUs with no share on
them; the engine (``--policy``) places every GPU pod, kube-scheduler the
CPU-only ones. FGD and gpupack measure fragmentation against ``--typical``
pods: ``present`` (the default), the live controller's rule, the GPU pods that
exist when a pod arrives (rebuilt at most every ``--typical-every`` arrivals,
the pods one planning cycle sees); ``workload``, the FGD protocol's, every pod
of the run known in advance. ``--backend device-plugin`` (the default) is the
model above.

Prints the allocation ratio at each arrived-demand level (0..130 %), the number
of failed pods and the median decision time per pod; ``--json`` prints the same
as one JSON object. ``--seeds N`` runs the published seeds 42.. (N of them) and
reports means.

``--max-nodes K`` replays onto a seeded sample of K of the node list's nodes
and scales the arrivals to the sample's GPU capacity as the protocol does for
the whole cluster (``--inflate`` times it); each seed draws its own sample, and
the seed's sample and arrival sequence are those ``gpupack replay --max-nodes K``
replays (``sharing.simulator.arrivals.plan_run``, the one source of both). K
at least the node count runs the whole cluster; ``--json`` says which, with
``max_nodes``, ``cluster_nodes``, ``nodes_used`` and ``gpus_used`` (per seed).

``--priority qos`` (with ``--model product``, device-plugin backend) gives each pod the
priority of its openb ``qos`` class (LS, Guaranteed and Burstable high, BE low), and a pod
that fits nowhere may preempt pods of lower priority: with the engine's choice of victims
(``--preemption engine``, the default) or kube-scheduler's default preemption
(``--preemption scheduler``); victims leave and count as failed. The output adds, per class,
the percentage of the class's arrived milli placed at each level (``alloc_at_by_class``) and at
the end, and the preemptions and milli preempted (means per run). ``--priority none`` places
as without the flag and adds the figures per class. docs/priority.md, "In the simulator".

``--mig MODEL`` replays the trace's GPU pods with their creation and deletion
times onto ``--mig-gpus`` MIG-capable GPUs of MODEL instead, under a layout
strategy (``--policy`` static-balanced, static-1g, static-whole, greedy,
gpupack or all), and reports allocation, pods never placed, mean wait and GPUs
reshaped (docs/simulator.md).

``gpupack simulate usage --trace DIR --gpu MODEL`` replays another kind of trace: per-pod
GPU use (GenTD26), through the right-sizer that sizes pods by what they use rather than
what they ask; ``gpupack simulate usage --help`` says more.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_OK, UsageError, check_trace_files, finite_float, non_negative_float
from gpupack.cli_simulate_usage import register as register_usage
from sharing.packing.mig_layouts import MIG_STRATEGIES, make_strategy
from sharing.packing.registry import POLICY_NAMES, canonical_policy_name
from sharing.packing.specs import NodeSpec
from sharing.simulator.arrivals import check_max_nodes, sample_nodes
from sharing.simulator.dra import (
    CPU_PODS,
    CpuPods,
    DEFAULT_SHARE_UNIT,
    DEFAULT_TYPICAL_EVERY,
    TYPICAL_RULES,
    DraRun,
    TypicalRule,
    check_share_unit,
    run_dra,
)
from sharing.simulator.mig_replay import replay_mig
from sharing.api.priority import PodPriority
from sharing.rules.priority import qos_priority
from sharing.simulator.preempting import PREEMPTION_MODES, PreemptionMode, PriorityFigures
from sharing.simulator.product import LIVE_PATHS, ProductRun, run_product
from sharing.simulator.replay import RunResult, SweepResult, summarise, sweep
from sharing.simulator.scheduler_config import SchedulerConfigError, load_weights
from sharing.simulator.traces import TraceError, load_nodes, load_pods, load_qos
from sharing.simulator.workload import published_seeds

SHARING_MODELS = ("fgd", "product")
BACKENDS = ("device-plugin", "dra")

PRIORITY_SOURCES = ("none", "qos")

TEXT_LEVELS = (0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 125, 130)
"""Levels shown in the text table (the reference table's columns); JSON has every level."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay an openb trace with a packing policy (FGD paper protocol)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # --nodes, --pods and --policy are required for an openb replay, checked in run():
    # `gpupack simulate usage` takes none of them.
    p.add_argument("--nodes", type=Path, help="node list CSV (openb_node_list_gpu_node.csv); required")
    p.add_argument("--pods", type=Path, help="pod list CSV (openb_pod_list_<workload>.csv); required")
    p.add_argument(
        "--policy",
        help=f"one of {', '.join(POLICY_NAMES)} (case-insensitive); with --mig: {', '.join(MIG_STRATEGIES)} or all; "
             "required",
    )
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, help="one run with this seed (default 42)")
    seeds.add_argument("--seeds", type=int, metavar="N", help="N runs with the published seeds 42, 43, ... and report means")
    p.add_argument("--inflate", type=finite_float, default=1.3, help="arrived demand as a multiple of GPU capacity (default 1.3)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument(
        "--max-nodes", type=int, default=None, metavar="K",
        help="replay onto a seeded sample of K nodes (each seed its own), the arrivals scaled to the sample's GPU "
        "capacity as the protocol does for the whole cluster; the same sample and arrival sequence as "
        "'gpupack replay --max-nodes K' for that seed. K at least the node count: the whole cluster "
        "(default: the whole cluster; not with --mig)",
    )
    p.add_argument(
        "--model", choices=SHARING_MODELS, default="fgd", dest="sharing_model",
        help="fgd: the FGD paper's protocol (default); product: the live rules of --backend (docs/simulator.md)",
    )
    p.add_argument(
        "--backend", choices=BACKENDS, default=None,
        help="with --model product: device-plugin (node-wide replicas; default) or dra (consumable capacity: "
        "each pod's share rounded up to --share-unit, on any GPU)",
    )
    p.add_argument(
        "--share-unit", type=int, default=None, metavar="MILLI",
        help=f"with --backend dra: the step of the milli capacity's request policy (default {DEFAULT_SHARE_UNIT}; "
        "must divide 1000 and be at most 500, as the API requires of a step: sharing.dra.share_policy)",
    )
    p.add_argument(
        "--cpu-pods", choices=CPU_PODS, default=None,
        help="with --backend dra: who places pods that ask for no GPU: scheduler (kube-scheduler, MostAllocated "
        "with the weights manifests/ ships; default, what an unlabelled pod gets) or engine (the packing engine, "
        "as for pods labelled gpupack.io/backend=dra: docs/dra-pods.md)",
    )
    p.add_argument(
        "--typical", choices=TYPICAL_RULES, default=None,
        help="with --model product: the typical pods FGD and gpupack measure fragmentation against: present (the GPU "
        "pods that exist when a pod arrives, as the live controller builds them; default) or workload (every pod "
        "of the run, known in advance, as the FGD protocol does)",
    )
    p.add_argument(
        "--typical-every", type=int, default=None, metavar="K",
        help=f"with --model product and --typical present: rebuild the typical pods at most every K arrivals, the pods one planning "
        f"cycle plans together (default {DEFAULT_TYPICAL_EVERY}; 1 rebuilds before every pod that changes them, "
        "some 20 minutes a gpupack run on openb)",
    )
    p.add_argument(
        "--live-path", choices=LIVE_PATHS, default="engine",
        help="with --model product: engine (every fractional pod placed by the packing engine; default) "
        "or scheduler (fractional pods scored by kube-scheduler, as gpupack's earlier live path did, here with "
        "the weights manifests/ ships now; benchmarks/simulate_product.py models the earlier weights too). With "
        "--backend dra, scheduler is kube-scheduler unguided: no pins, every pod placed by kube-scheduler and its "
        "DRA allocator's first fit (the baseline gpupack's placement is measured against)",
    )
    p.add_argument(
        "--priority", choices=PRIORITY_SOURCES, default=None,
        help="with --model product: none (no pod preempts; figures per openb qos class added) or qos (openb's "
        "qos as priorities: LS, Guaranteed, Burstable high, BE low; a pod that fits nowhere preempts lower ones)",
    )
    p.add_argument(
        "--preemption", choices=PREEMPTION_MODES, default=None,
        help="with --priority qos: engine (gpupack's choice of victims, which may reshape a node; default) or "
        "scheduler (kube-scheduler's default preemption, no reshaping), for comparison",
    )
    p.add_argument(
        "--mig",
        metavar="MODEL",
        help="replay onto MIG-capable GPUs of this model, with departures (e.g. A100-80GB; see docs/simulator.md)",
    )
    p.add_argument("--mig-gpus", type=int, default=64, metavar="N", help="GPUs in the MIG cluster, 8 per node (default 64)")
    p.add_argument(
        "--reshape-delay", type=non_negative_float, default=60.0, metavar="SECONDS",
        help="time a GPU is unavailable while reshaped (default 60)",
    )
    p.set_defaults(handler=run, simulate_parser=p)
    usage = p.add_subparsers(dest="simulation", title="another kind of trace (gpupack simulate usage --help)",
                             parser_class=type(p))
    register_usage(usage)


def _seeds(args: argparse.Namespace) -> tuple[int, ...]:
    if args.seeds is not None:
        if args.seeds < 1 or args.seeds > 1000:
            raise UsageError(f"--seeds must be between 1 and 1000, got {args.seeds}")
        return published_seeds(args.seeds)
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed must be a non-negative integer, got {args.seed}")
    return (42 if args.seed is None else args.seed,)


def _typical(args: argparse.Namespace) -> tuple[TypicalRule, int]:
    """The product model's typical-pods rule and arrivals per rebuild; UsageError for a K that cannot be."""
    rule: TypicalRule = args.typical or "present"
    if args.typical_every is not None and rule != "present":
        raise UsageError("--typical-every applies to --typical present only (the workload rule builds its typical pods once)")
    every = DEFAULT_TYPICAL_EVERY if args.typical_every is None else args.typical_every
    if every < 1:
        raise UsageError(f"--typical-every must be at least 1, got {every}")
    return rule, every


def _backend(args: argparse.Namespace) -> tuple[str, int | None]:
    """The backend the product model replays and, for DRA, its share unit; UsageError for a flag
    that does not apply."""
    if args.backend is not None and (args.sharing_model != "product" or args.mig):
        raise UsageError("--backend applies to --model product only (the FGD protocol and --mig model no backend)")
    backend: str = args.backend or "device-plugin"
    if args.share_unit is not None and backend != "dra":
        raise UsageError("--share-unit applies to --backend dra only (the device-plugin backend shares in replicas of 1000/r)")
    if args.typical is not None and args.sharing_model != "product":
        raise UsageError("--typical applies to --model product only (the FGD protocol measures fragmentation against "
                         "the whole run's pods)")
    if args.typical_every is not None and args.sharing_model != "product":
        raise UsageError("--typical-every applies to --model product only")
    if args.cpu_pods is not None and backend != "dra":
        raise UsageError("--cpu-pods applies to --backend dra only (the device-plugin backend leaves pods that ask "
                         "for no GPU to kube-scheduler)")
    if backend != "dra":
        return backend, None
    if args.live_path != "engine" and args.cpu_pods == "engine":
        raise UsageError("--cpu-pods engine needs --live-path engine: unguided (--live-path scheduler), kube-scheduler "
                         "places every pod")
    unit = DEFAULT_SHARE_UNIT if args.share_unit is None else args.share_unit
    try:
        return backend, check_share_unit(unit, "--share-unit")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _priorities(args: argparse.Namespace, backend: str) -> tuple[dict[str, PodPriority] | None, PreemptionMode]:
    """The pods' priorities by name (None: no ``--priority``) and the preemption the run makes;
    UsageError for a flag that does not apply, a trace without ``qos`` or a class openb lacks."""
    if args.preemption is not None and args.priority != "qos":
        raise UsageError("--preemption applies to --priority qos only (with --priority none no pod preempts)")
    if args.priority is None:
        return None, "none"
    if args.sharing_model != "product" or args.mig or backend != "device-plugin":
        raise UsageError("--priority applies to --model product with the device-plugin backend only")
    mode: PreemptionMode = "none" if args.priority == "none" else (args.preemption or "engine")
    return qos_priorities(args.pods), mode


def qos_priorities(pods: str | Path) -> dict[str, PodPriority]:
    """Each pod's priority by trace name, from the pod list's ``qos`` column (``--priority``, here
    and in ``gpupack replay``); UsageError for a trace without ``qos`` or a class openb lacks."""
    try:
        qos = load_qos(Path(pods))
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if qos is None:
        raise UsageError(f"{pods}: the pod list has no qos column, so its pods have no priority class "
                         "(openb's multigpu traces carry none)")
    priorities = {}
    for name, value in qos.items():
        try:
            priorities[name] = qos_priority(value)
        except ValueError as exc:
            raise UsageError(f"{pods}: pod {name!r}: {exc}") from None
    return priorities


def _node_sample(args: argparse.Namespace, nodes: Sequence[NodeSpec], seeds: Sequence[int]) -> dict[str, Any]:
    """What the runs replay onto, for the output: ``max_nodes``, ``cluster_nodes``, ``nodes_used`` and
    ``gpus_used`` (one per seed: each seed draws its own sample); UsageError for a sample without GPUs."""
    samples = [sample_nodes(nodes, s, args.max_nodes) for s in seeds]
    gpus = [sum(n.gpu_count for n in sample) for sample in samples]
    for seed, count in zip(seeds, gpus):
        if count == 0:
            raise UsageError(f"{args.nodes}: the seed-{seed} sample of {args.max_nodes} node(s) has no GPUs; "
                             "raise --max-nodes")
    return {"max_nodes": args.max_nodes, "cluster_nodes": len(nodes), "nodes_used": len(samples[0]), "gpus_used": gpus}


def run(args: argparse.Namespace) -> int:
    missing = [flag for flag, value in (("--nodes", args.nodes), ("--pods", args.pods), ("--policy", args.policy))
               if value is None]
    if missing:  # argparse's own words, as when the flags were required=True
        args.simulate_parser.error(f"the following arguments are required: {', '.join(missing)}")
    backend, share_unit = _backend(args)
    priorities, preemption = _priorities(args, backend)
    if args.max_nodes is not None:
        if args.mig:
            raise UsageError("--max-nodes does not apply to --mig: the MIG replay runs on a synthetic cluster of "
                             "--mig-gpus GPUs, not on the node list")
        try:
            check_max_nodes(args.max_nodes)
        except ValueError as exc:
            raise UsageError(f"--max-nodes: {exc}") from None
    if args.mig:
        return run_mig(args)
    try:
        policy = canonical_policy_name(args.policy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not 0.01 <= args.inflate <= 10:
        raise UsageError(f"--inflate must be between 0.01 and 10, got {args.inflate}")
    seeds = _seeds(args)
    try:
        check_trace_files(args.nodes, args.pods)
        nodes = load_nodes(args.nodes)
        trace = load_pods(args.pods)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if sum(n.gpu_count for n in nodes) == 0:
        raise UsageError(f"{args.nodes}: the node list has no GPUs")
    sampled = _node_sample(args, nodes, seeds)
    k = args.max_nodes
    if args.sharing_model == "product":
        try:
            weights = load_weights()
        except SchedulerConfigError as exc:
            raise UsageError(str(exc)) from None
        try:
            if share_unit is not None:
                rule, every = _typical(args)
                cpu_pods: CpuPods = args.cpu_pods or "scheduler"
                dra_runs = [run_dra(nodes, trace.pods, policy, s, weights, share_unit, cpu_pods, inflate=args.inflate,
                                    typical=rule, typical_every=every, max_nodes=k, gpu_pods=args.live_path)
                            for s in seeds]
                result = product_sweep(dra_runs, trace.workload)
                extra = {"backend": backend, "share_unit": share_unit, "cpu_pods": cpu_pods, "typical": rule,
                         **({"typical_every": every} if rule == "present" else {}), **dra_extra(dra_runs)}
            else:
                rule, every = _typical(args)
                runs = [run_product(nodes, trace.pods, policy, s, weights, args.live_path, args.inflate, max_nodes=k,
                                    typical=rule, typical_every=every, priorities=priorities, preemption=preemption)
                        for s in seeds]
                result = product_sweep(runs, trace.workload)
                extra = {"backend": backend, "typical": rule, **({"typical_every": every} if rule == "present" else {}),
                         **product_extra(runs)}
                if priorities is not None:
                    extra |= {"priority": args.priority,
                              **priority_extra([r.priority for r in runs if r.priority is not None])}
        except ValueError as exc:
            raise UsageError(f"{args.nodes}: {exc}") from None
    else:
        if args.live_path != "engine":
            raise UsageError("--live-path applies to --model product only")
        try:
            result = sweep(nodes, trace.pods, trace.workload, policy, seeds, args.inflate, max_nodes=k)
        except ValueError as exc:
            raise UsageError(f"{args.nodes}: {exc}") from None
        extra = {}
    extra = {**extra, **sampled}
    if args.json:
        print(json.dumps({**as_json(result), "sharing_model": args.sharing_model, **extra}, indent=2))
    else:
        print(as_text(result, args.sharing_model, extra))
    return EXIT_OK


def product_sweep(runs: Sequence[ProductRun | DraRun], workload: str) -> SweepResult:
    """Product runs averaged by the protocol's own ``summarise`` (same keys, same means)."""
    return summarise(
        [RunResult(r.policy, r.seed, r.pods, r.failed_pods, r.alloc_at, r.decision_us_median, r.final_alloc_percent)
         for r in runs],
        workload,
    )


def product_extra(runs: list[ProductRun]) -> dict[str, Any]:
    """What only the product model has: its live path, what the pods occupy, where capacity went."""
    return {
        "live_path": runs[0].live_path,
        **_occupied_and_split(runs),
        "node_modes": [r.node_modes for r in runs],
    }


def priority_extra(figures: Sequence[PriorityFigures]) -> dict[str, Any]:
    """Figures per class and of preemption, over the seeds: means per run; the two checks summed."""
    from sharing.simulator.metrics import mean_levels

    def mean(values: Sequence[float]) -> float:
        return round(sum(values) / len(values), 2)

    classes = sorted({c for f in figures for c in f.alloc_at_by_class})
    return {
        "preemption": figures[0].preemption,
        "alloc_at_by_class": {c: {str(k): v for k, v in mean_levels([f.alloc_at_by_class[c] for f in figures
                                                                     if c in f.alloc_at_by_class]).items()}
                              for c in classes},
        "placed_by_class": {c: mean([f.placed_by_class[c] for f in figures if c in f.placed_by_class]) for c in classes},
        "preemptions": mean([f.preemptions for f in figures]),
        "preempted_pods": mean([f.preempted_pods for f in figures]),
        "preempted_milli": mean([f.preempted_milli for f in figures]),
        "preemption_reasons": {r: mean([f.reasons.get(r, 0) for f in figures])
                               for r in sorted({r for f in figures for r in f.reasons})},
        "preempted_equal_or_higher": sum(f.equal_or_higher for f in figures),
        "preemption_loops": sum(f.loops for f in figures),
        "paired_engine_milli": mean([f.paired_engine_milli for f in figures]),
        "paired_scheduler_milli": mean([f.paired_scheduler_milli for f in figures]),
        "scheduler_could_not": mean([f.scheduler_could_not for f in figures]),
    }


def dra_extra(runs: list[DraRun]) -> dict[str, Any]:
    """The DRA model's own keys: the same as the device-plugin model's, with GPU states for node modes
    (``live_path``: who placed the GPU pods, ``engine`` or ``scheduler`` unguided)."""
    return {"live_path": runs[0].gpu_pods, **_occupied_and_split(runs), "gpu_modes": [r.gpu_modes for r in runs]}


def _occupied_and_split(runs: Sequence[ProductRun | DraRun]) -> dict[str, Any]:
    from sharing.simulator.metrics import mean_levels

    splits = [dataclasses.asdict(r.split) for r in runs]
    return {
        "occupied_at": {str(k): v for k, v in mean_levels([r.occupied_at for r in runs]).items()},
        "capacity_split_percent": {k: round(sum(s[k] for s in splits) / len(splits), 2) for k in splits[0]},
    }


def run_mig(args: argparse.Namespace) -> int:
    """The MIG variant: every strategy named by --policy on one trace."""
    from mig.catalog import find_model, model_names

    model = find_model(args.mig)
    if model is None:
        raise UsageError(f"unknown GPU model {args.mig!r} for --mig; choose one of {', '.join(model_names())}")
    names = MIG_STRATEGIES if args.policy.strip().lower() == "all" else tuple(p.strip() for p in args.policy.split(","))
    try:
        strategies = [make_strategy(n) for n in names]
    except ValueError as exc:
        raise UsageError(f"{exc} (or all)") from None
    if not 1 <= args.mig_gpus <= 100_000:
        raise UsageError(f"--mig-gpus must be between 1 and 100000, got {args.mig_gpus}")
    if args.reshape_delay < 0:
        raise UsageError(f"--reshape-delay must not be negative, got {args.reshape_delay}")
    try:
        load_nodes(args.nodes)  # validated for a consistent interface; the MIG cluster is synthetic
        trace = load_pods(args.pods)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if any(p.gpu_count and (c is None or d is None) for p, c, d in zip(trace.pods, trace.created, trace.deleted)):
        raise UsageError(f"{args.pods}: the MIG variant needs creation_time and deletion_time for every GPU pod")
    results = [
        replay_mig(trace.pods, trace.created, trace.deleted, model, s, gpus=args.mig_gpus, reshape_delay_s=args.reshape_delay)
        for s in strategies
    ]
    if args.json:
        print(json.dumps({
            "model": model.product,
            "workload": trace.workload,
            "gpus": args.mig_gpus,
            "reshape_delay_s": args.reshape_delay,
            "results": [dataclasses.asdict(r) for r in results],
        }, indent=2))
        return EXIT_OK
    print(f"workload {trace.workload} on {args.mig_gpus} x {model.product} (MIG), reshape delay {args.reshape_delay:g} s")
    print(f"{'strategy':16s} {'alloc %':>8s} {'placed':>7s} {'never':>6s} {'mean wait s':>12s} {'reshaped':>9s}")
    for r in results:
        print(
            f"{r.strategy:16s} {r.allocation_percent:8.2f} {r.placed:7d} {r.never_placed:6d} "
            f"{r.mean_wait_s:12.1f} {r.reshapes:9d}"
        )
    return EXIT_OK


def as_json(result: SweepResult) -> dict[str, Any]:
    """The documented JSON shape: policy, workload, seeds, alloc_at, failed_pods, decision_us_median."""
    return {
        "policy": result.policy,
        "workload": result.workload,
        "seeds": list(result.seeds),
        "alloc_at": {str(k): v for k, v in result.alloc_at.items()},
        "failed_pods": result.failed_pods,
        "decision_us_median": round(result.decision_us_median, 1),
    }


def as_text(result: SweepResult, sharing_model: str = "fgd", extra: dict[str, Any] | None = None) -> str:
    seeds = ", ".join(str(s) for s in result.seeds)
    extra = extra or {}
    policy = result.policy
    if sharing_model == "fgd":
        what = "FGD paper protocol"
    elif extra.get("backend") == "dra":
        pods = ("the pods present, rebuilt at most every "
                f"{extra.get('typical_every')} arrivals" if extra.get("typical") == "present" else "the whole run's pods")
        what = (f"product model, DRA backend (shares in {extra.get('share_unit')}-milli steps, pods that ask for no "
                f"GPU placed by {'the packing engine' if extra.get('cpu_pods') == 'engine' else 'kube-scheduler'}), "
                f"typical pods: {pods}")
        if extra.get("live_path") == "scheduler":
            policy = "none (unguided)"
            what = (f"product model, DRA backend, kube-scheduler unguided (no pins: every pod placed by kube-scheduler, "
                    f"devices by its allocator's first fit; shares in {extra.get('share_unit')}-milli steps)")
    else:
        what = f"product model, {extra.get('live_path')} live path"
    occupied: dict[str, float | None] = extra.get("occupied_at", {})
    lines = [
        f"workload {result.workload}, policy {policy}, {what}, seeds {seeds} (mean over {len(result.seeds)})",
        "arrived %  allocated %" + ("  occupied %" if occupied else ""),
    ]
    for level in TEXT_LEVELS:
        value = result.alloc_at.get(level)
        line = f"{level:9d}  {'-' if value is None else f'{value:.2f}':>11}"
        if occupied:
            held = occupied.get(str(level))
            line += f"  {'-' if held is None else f'{held:.2f}':>10}"
        lines.append(line)
    if extra.get("max_nodes") is not None:
        if extra["nodes_used"] < extra["cluster_nodes"]:
            gpus = ", ".join(str(g) for g in extra["gpus_used"])
            lines.append(f"nodes: a seeded sample of {extra['nodes_used']} of {extra['cluster_nodes']} per seed "
                         f"(GPUs: {gpus}), arrivals scaled to its capacity")
        else:
            lines.append(f"nodes: all {extra['cluster_nodes']} (--max-nodes {extra['max_nodes']} is at least the node count)")
    if "capacity_split_percent" in extra:
        parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in extra["capacity_split_percent"].items())
        lines.append(f"capacity at the end (% of GPU milli): {parts}")
    if "placed_by_class" in extra:
        parts = ", ".join(f"{c} {v:.2f}" for c, v in extra["placed_by_class"].items())
        lines.append(f"placed at the end, % of each class's arrived milli (priority {extra['priority']}): {parts}")
        if extra["preemption"] != "none":
            lines.append(f"preemptions ({extra['preemption']}): {extra['preemptions']:g} per run, "
                         f"{extra['preempted_pods']:g} pods and {extra['preempted_milli']:g} milli preempted; "
                         f"victims of equal or higher priority {extra['preempted_equal_or_higher']}, "
                         f"loops {extra['preemption_loops']}")
    lines.append(f"failed pods: {result.failed_pods:g} (mean per run, of {result.runs[0].pods} arrived)")
    lines.append(f"decision time: {result.decision_us_median:.0f} us median per pod")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from gpupack.cli import main

    sys.exit(main(["simulate", *sys.argv[1:]]))

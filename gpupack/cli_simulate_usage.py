"""``gpupack simulate usage``: replay a GPU usage trace through the right-sizer, with its bounds.

The trace is a folder in the GenTD26 format (the public Alibaba ``cluster-trace-v2026-GenAI``):
``pod_gpu_duty_cycle_anon.csv`` and ``pod_gpu_memory_used_bytes_anon.csv``. Each pod of the
trace first asks for a whole GPU of ``--gpu`` and lives from its first sample to its last; it is
its own workload of one replica unless ``--workloads FILE`` (a CSV: ``container_ip,workload``)
groups pods into workloads. ``--mode`` is the right-sizer's: ``off`` recommends only,
``initial`` sizes new pods of a workload from its recommendation, ``recreate`` also moves running
pods far from theirs (make-before-break). The run itself draws nothing at random. ``--draws N``
adds N more runs with observation noise drawn from ``--seed``, ``--seed`` + 1, ...: each GPU's
agent publishes at its own phase and each sample is missed with probability ``--missed-samples``,
as a live run's agents do (``sharing.simulator.usage_replay``, "Observation noise"); the JSON's
``draws`` holds each figure's mean, least and most over them. On few pods the saving is a
distribution: compare a live run with its mean.

Prints the run's figures beside the oracle's saving (a per-minute re-pack knowing the future)
and the naive static packing's figures; ``--json`` prints them as one JSON object with the keys
``pods``, ``gpu_hours_baseline``, ``gpu_hours``, ``gpu_hours_saved_pct``,
``oracle_gpu_hours_saved_pct``, ``saturated_gpu_minutes_pct``, ``gpu_memory_overflow_minutes``,
``pod_minutes_over_limit_pct``, ``evictions_per_pod_day`` and ``static``, and
``peak_oracle_gpu_hours_saved_pct``: the oracle with each pod's memory at its life's peak, the
bound of any packing by per-pod hard memory limits. ``--compute-overcommit F`` lets predicted
duty cycles on a GPU sum to F x 100 %, as a SharingPolicy that allows it would, and
``--duty-quantile Q`` also bounds the *predicted sum* of a GPU's pods' duty cycles at that
quantile. ``--learn-minutes``, ``--memory-margin``, ``--first-memory-margin``, ``--oom-bump``,
``--oom-floor`` and ``--max-drains`` change the right-sizer's settings, to measure
alternatives (docs/usage.md). ``--backend device-plugin`` and ``--publish-seconds 300`` model
the live device-plugin path that ``gpupack replay usage`` runs. Bad input (a missing column, a row that cannot be placed, an
unknown GPU model) is refused in one line; dropped and filled samples are counted under ``trace``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_OK, UsageError, finite_float, load_usage_trace
from kube.inputfile import read_text
from mig.errors import UnknownModelError
from sharing.simulator.usage import gpu_memory_bytes, parse_workloads, run_usage, run_usage_draws
from sharing.simulator.usage_replay import BACKENDS, MODES, RightSizing
from sharing.usage.recommender import RecommenderSettings, WorkloadKey
from sharing.usage.trace import DUTY_FILE, MEMORY_FILE

SHOWN = ("gpu_hours_saved_pct", "saturated_gpu_minutes_pct", "gpu_memory_overflow_minutes",
         "pod_minutes_over_limit_pct", "evictions_per_pod_day", "evictions_after_first_per_pod_day")


def register(subparsers: Any) -> None:
    """Add ``usage`` to ``gpupack simulate``'s sub-commands."""
    p = subparsers.add_parser("usage", help="replay a GPU usage trace (GenTD26 format) through the right-sizer",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, type=Path, metavar="DIR",
                   help=f"folder holding {DUTY_FILE} and {MEMORY_FILE}")
    p.add_argument("--gpu", required=True, metavar="MODEL",
                   help="GPU model the pods run on (e.g. H100-80GB, H200-141GB)")
    p.add_argument("--mode", choices=MODES, default="recreate", help="the right-sizer's mode (default recreate)")
    p.add_argument("--seed", type=int, default=42, metavar="N",
                   help="the first draw's seed of --draws (default 42); the run itself draws nothing at random")
    p.add_argument("--draws", type=int, default=0, metavar="N",
                   help="also run N times with observation noise (each GPU's publication phase drawn, samples "
                        "missed at --missed-samples) and report each figure's mean, least and most under `draws` "
                        "(default 0: none)")
    p.add_argument("--missed-samples", type=finite_float, default=0.0, metavar="P",
                   help="with --draws: the probability that an agent misses a pod's sample of a trace step "
                        "(default 0; a live replay's agents miss steps when a poll outlasts a scaled step)")
    p.add_argument("--workloads", type=Path, metavar="FILE",
                   help="CSV container_ip,workload grouping pods into workloads")
    p.add_argument("--compute-overcommit", type=finite_float, default=1.0, metavar="F",
                   help="predicted duty cycles on a GPU may sum to F x 100 %% (as a SharingPolicy allowing "
                        "over-commit would; default 1.0, none); memory is never over-committed")
    p.add_argument("--duty-quantile", type=finite_float, metavar="Q",
                   help="also admit a share only while the GPU's predicted duty-cycle sum (its pods' duty "
                        "histograms convolved) stays at most 100 %% at quantile Q (e.g. 0.995). Over-commit: "
                        "needs --compute-overcommit above 1")
    p.add_argument("--learn-minutes", type=finite_float, metavar="M",
                   help="history before a pod's first recommendation (default 60)")
    p.add_argument("--memory-margin", type=finite_float, metavar="F",
                   help="memory headroom over the peak once settled (default 0.05)")
    p.add_argument("--first-memory-margin", type=finite_float, metavar="F",
                   help="memory headroom of the first recommendation, shrinking to --memory-margin over "
                        "6 hours of history (default 0.5)")
    p.add_argument("--oom-bump", type=finite_float, metavar="F",
                   help="after an OOM, memory is at least F x the limit hit (default 1.1)")
    p.add_argument("--oom-floor", action="store_true",
                   help="an OOM's bump is a floor of the memory recommendation, not a peak the margin multiplies "
                        "(VPA's way, the default)")
    p.add_argument("--max-drains", type=int, default=1, metavar="N",
                   help="GPUs one hourly consolidation may empty (default 1)")
    p.add_argument("--shared-compute-observed", action="store_true",
                   help="observe the compute of pods on shares too; the product cannot (under MPS NVML gives "
                        "clients' SM samples to the MPS server), so by default only their memory is observed")
    p.add_argument("--backend", choices=BACKENDS, default="dra",
                   help="whose shares: the DRA pool's exact shares (dra, the default) or the device plugin's equal "
                        "replicas, a GPU split for the first pod it takes and no consolidation (device-plugin, what "
                        "`gpupack replay usage` runs live)")
    p.add_argument("--publish-seconds", type=finite_float, metavar="S",
                   help="the recommender sees use as of the agents' last publication, every S seconds (live: 300); "
                        "default: as it happens")
    p.add_argument("--pods", dest="usage_pods", type=int, metavar="N",
                   help="the first N pods of the trace, by first sample (as `gpupack replay usage --pods N`); "
                        "default: all")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def recommender_settings(args: argparse.Namespace) -> RecommenderSettings:
    """The recommender's settings with the flags given; each flag's range is checked here."""
    changes: dict[str, Any] = {}
    ranges = (("learn_minutes", "min_observed_s", 60.0, 0.0, 24 * 60.0),
              ("memory_margin", "memory_margin", 1.0, 0.0, 2.0),
              ("first_memory_margin", "first_memory_margin", 1.0, 0.0, 2.0),
              ("oom_bump", "oom_bump_ratio", 1.0, 1.0, 3.0))  # (flag, setting, to the setting's unit, range)
    for flag, field, scale, low, high in ranges:
        value = getattr(args, flag)
        if value is None:
            continue
        if not low <= value <= high:
            raise UsageError(f"--{flag.replace('_', '-')} must be between {low:g} and {high:g}, got {value:g}")
        changes[field] = value * scale
    return dataclasses.replace(RecommenderSettings(), margin_over_oom=not args.oom_floor, **changes)


def run(args: argparse.Namespace) -> int:
    if args.nodes is not None or args.pods is not None or args.policy is not None:
        raise UsageError("--nodes, --pods and --policy belong to `gpupack simulate`; `gpupack simulate usage` "
                         "reads --trace")
    try:
        gpu_memory_bytes(args.gpu)
    except UnknownModelError as exc:
        raise UsageError(f"--gpu: {exc}") from None
    trace = load_usage_trace(args.trace)
    if args.usage_pods is not None:
        from gpupack.replay.usage_live import first_pods

        try:
            trace = first_pods(trace, args.usage_pods)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    workloads: dict[str, WorkloadKey] | None = None
    if args.workloads is not None:
        try:
            workloads = parse_workloads(read_text(args.workloads), str(args.workloads), [p.pod for p in trace.pods])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not 1.0 <= args.compute_overcommit <= 10.0:
        raise UsageError(f"--compute-overcommit must be between 1 and 10, got {args.compute_overcommit}")
    if args.duty_quantile is not None and not 0.5 <= args.duty_quantile <= 1.0:
        raise UsageError(f"--duty-quantile must be between 0.5 and 1, got {args.duty_quantile}")
    if args.max_drains < 0:
        raise UsageError(f"--max-drains must not be negative, got {args.max_drains}")
    if args.publish_seconds is not None and not 0 < args.publish_seconds <= 86400:
        raise UsageError(f"--publish-seconds must be above 0 and at most a day, got {args.publish_seconds:g}")
    if not 0 <= args.draws <= 1000:
        raise UsageError(f"--draws must be between 0 and 1000, got {args.draws}")
    if not 0.0 <= args.missed_samples < 1.0:
        raise UsageError(f"--missed-samples must be at least 0 and below 1, got {args.missed_samples:g}")
    if args.missed_samples and not args.draws:
        raise UsageError("--missed-samples needs --draws N: the samples missed are drawn per run")
    policy = RightSizing(mode=args.mode, compute_overcommit=args.compute_overcommit,
                         recommender=recommender_settings(args), max_drains=args.max_drains,
                         duty_quantile=args.duty_quantile, shared_compute_observed=args.shared_compute_observed,
                         backend=args.backend, publish_every_s=args.publish_seconds)
    result = run_usage(trace, args.gpu, policy, workloads)
    if args.draws:
        result["draws"] = run_usage_draws(trace, args.gpu, policy, args.draws, args.seed, args.missed_samples,
                                          workloads)
    counts = {"duty": dataclasses.asdict(trace.duty), "memory": dataclasses.asdict(trace.memory),
              "left_out": list(trace.left_out), "step_s": trace.step_s}
    result = {**result, "compute_overcommit": args.compute_overcommit, "seed": args.seed, "trace": counts}
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    print(f"{result['pods']} pods on {result['gpu']}, mode {result['mode']}: "
          f"{result['gpu_hours_baseline']} GPU-hours at one GPU per pod")
    print(f"{'':36s} {'run':>10s} {'static':>10s}")
    for key in SHOWN:
        print(f"{key:36s} {result[key]:10g} {result['static'][key]:10g}")
    if "draws" in result:
        drawn = result["draws"]
        print(f"over {drawn['count']} draws of observation noise (seeds {args.seed}-{args.seed + drawn['count'] - 1}, "
              f"samples missed {drawn['missed_samples']:g}): gpu_hours_saved_pct mean {drawn['mean']['gpu_hours_saved_pct']:g}, "
              f"least {drawn['min']['gpu_hours_saved_pct']:g}, most {drawn['max']['gpu_hours_saved_pct']:g}")
    print(f"oracle_gpu_hours_saved_pct {result['oracle_gpu_hours_saved_pct']:g} (per-pod hard limits at their "
          f"peaks, re-packed every minute: {result['peak_oracle_gpu_hours_saved_pct']:g})")
    return EXIT_OK

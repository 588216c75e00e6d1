"""``gpupack replay usage``: a GPU usage trace played on the real control plane, beside the simulator.

Each pod of the trace (GenTD26 format: ``pod_gpu_duty_cycle_anon.csv`` and
``pod_gpu_memory_used_bytes_anon.csv``) becomes a Deployment of one replica, created at its first
sample and deleted at its last, time-scaled (``--time-scale F`` trace seconds per second), asking
gpupack for one whole GPU of ``--gpu``. The stack is real: kube-apiserver, etcd, kube-scheduler,
kube-controller-manager (Deployments), kwok (the pods run on KWOK nodes of one GPU each), the
webhook over TLS, the controller with its recommender (and ``Recreate`` updater), and a simulated
node agent per node whose GPU processes play the trace. The namespace is opted in with
``--mode``: ``off`` recommends only, ``initial`` sizes new pods, ``recreate`` also moves running
pods far from their recommendation.

Time-scaled: the agents time the use and the recommender reads time on the trace's clock, so an
hour of history, the half-life and the hourly memory peaks mean what they mean in the simulator;
publication (300 s), the recommender's cycle (60 s) and the eviction budget (per hour) are passed
scaled. What stays in wall time, the latency of admission, scheduling and a rollout, becomes
``F`` times longer in trace time (docs/usage.md, "Live replay").

Every trace step the replay reads where each pod sits and computes the figures of ``gpupack
simulate usage`` with its code, beside the simulator's run of the same pods, GPU and mode, and
each difference, and 20 runs of the simulator with the observation noise a live run has (each
agent's publication phase drawn; on few pods the saving is a distribution). Progress goes to
stderr. Exit codes: 0 = the live ``gpu_hours_saved_pct`` is within 2 points of the mean of those
draws; 1 = it is not, or the stack failed; 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError, load_usage_trace, positive_float

MODES = ("off", "initial", "recreate")
DEFAULT_POLICY = "BestFit"
MAX_TIME_SCALE = 600.0
"""Above it a trace step (57 s) lasts less than a tenth of a second: the stack's own latency is
then most of what is measured."""


def register(subparsers: Any) -> None:
    """Add ``usage`` to ``gpupack replay``'s sub-commands."""
    p = subparsers.add_parser("usage", help="play a GPU usage trace (GenTD26 format) on the real stack and compare "
                                             "with gpupack simulate usage",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, type=Path, metavar="DIR", help="the usage trace folder")
    p.add_argument("--gpu", required=True, metavar="MODEL", help="GPU model of the nodes (e.g. H100-80GB, H200-141GB)")
    p.add_argument("--time-scale", type=positive_float, default=60.0, metavar="F",
                   help=f"trace seconds per wall second (default 60; at most {MAX_TIME_SCALE:g})")
    p.add_argument("--pods", dest="usage_pods", type=int, default=None, metavar="N",
                   help="the first N pods of the trace, by first sample (default: all)")
    p.add_argument("--mode", choices=MODES, default="recreate", help="the right-sizer's mode (default recreate)")
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"the controller's packing policy (default {DEFAULT_POLICY}: the simulator places shares by "
                        "best fit; docs/usage.md, \"Live replay\", says what gpupack's own policy does here)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress on stderr)")
    p.add_argument("--workdir", type=Path, metavar="DIR",
                   help="keep the control plane's data and every component's log here (default: a temporary "
                        "directory, removed afterwards)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from mig.errors import UnknownModelError
    from sharing.simulator.usage import gpu_memory_bytes

    stray = [flag for flag, value in (("--nodes", args.nodes), ("--pods FILE", args.pods)) if value is not None]
    if stray:
        raise UsageError(f"{', '.join(stray)} belong to the openb replay (`gpupack replay`); `gpupack replay usage` "
                         "reads --trace")
    try:
        gpu_memory_bytes(args.gpu)
    except UnknownModelError as exc:
        raise UsageError(f"--gpu: {exc}") from None
    from sharing.packing.registry import canonical_policy_name

    try:
        policy = canonical_policy_name(args.policy)
    except ValueError as exc:
        raise UsageError(f"--policy: {exc}") from None
    if args.time_scale > MAX_TIME_SCALE:
        raise UsageError(f"--time-scale must be at most {MAX_TIME_SCALE:g}, got {args.time_scale:g}")
    from gpupack.replay.usage_live import first_pods, run_usage_live

    try:
        trace = first_pods(load_usage_trace(args.trace), args.usage_pods)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not trace.pods:
        raise UsageError(f"{args.trace}: the trace holds no pod")

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    say(f"{len(trace.pods)} pods, {trace.steps * trace.step_s / 3600:.1f} trace hours: about "
        f"{trace.steps * trace.step_s / args.time_scale / 60:.1f} minutes at {args.time_scale:g}x, after setup")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpupack-usage-replay-"))
    try:
        result = run_usage_live(workdir, args.trace.resolve(), trace, args.gpu, args.mode, args.time_scale, say,
                                keep_logs=args.workdir is not None, policy=policy)
    except RuntimeError as exc:
        say(f"usage replay failed: {exc}")
        return EXIT_NO
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {**result, "trace": str(args.trace), "pods": len(trace.pods)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return EXIT_OK if result["agrees"] else EXIT_NO


def _print(result: dict[str, Any]) -> None:
    print(f"{result['pods']} pods on {result['gpu']}, mode {result['mode']}, {result['time_scale']:g}x, "
          f"{result['nodes']} nodes, policy {result['policy']}")
    print(f"{'':36s} {'live':>10s} {'simulator':>10s} {'difference':>10s}")
    for key, diff in result["difference"].items():
        print(f"{key:36s} {result['live'][key]:10g} {result['simulator'][key]:10g} {diff:10g}")
    verdict = "agree" if result["agrees"] else "do NOT agree"
    drawn = result["simulator_draws"]
    print(f"simulator with a live run's observation noise, {drawn['count']} draws (samples missed "
          f"{drawn['missed_samples']:g}): gpu_hours_saved_pct mean {drawn['mean']['gpu_hours_saved_pct']:g}, "
          f"least {drawn['min']['gpu_hours_saved_pct']:g}, most {drawn['max']['gpu_hours_saved_pct']:g}")
    print(f"gpu_hours_saved_pct: live and simulator {verdict} within {result['agreement_points']:g} points "
          f"(live - {result['agreement_against']}: {result['agreement_gap']:+g})")
    print("right-sizer: " + ", ".join(f"{k} {v}" for k, v in result["right_sizer"].items()))

"""``gpupack replay``: an openb trace through the real stack on KWOK nodes (docs/replay.md).

``gpupack replay --nodes FILE --pods FILE --seed N [--inflate 1.3] [--max-nodes K]
[--json] [--plot FILE]`` starts a local control plane with kwok, one KWOK Node
per node of the plan (every node of the list, or the seed's sample of
``--max-nodes K``), the agent fleet on simulated GPUs, the webhook and the
controller, then submits the plan's pods one at a time in the protocol's order
(``sharing.simulator.arrivals.plan_run``, as ``gpupack simulate`` replays it),
each once the previous one is bound or declared never placed
(``gpupack.replay.runner``). It reports the allocation at each arrived-demand
level beside the simulator's product model and the FGD protocol on the same
plan, the pods never placed, creation-to-bound latency, and what the run cost
(CPU and peak RSS of controller, webhook and agents; API requests by verb).

``--priority qos`` gives each pod the PriorityClass of its openb ``qos`` class (created by the
replay, valued as ``gpupack simulate --priority qos`` values them), counts a pod preempted live as
not placed, and adds ``priority`` to the report: per class and preemption figures, live beside the
product model's ``--priority qos`` run (``gpupack.replay.priority``; docs/priority.md, "Live replay").

``--stop-after MINUTES`` ends the submissions after that long and reports the
pods submitted so far (``complete: false``); so does an interrupt (Ctrl-C or
SIGTERM): hours of a whole-cluster run are never lost to a deadline.

Exit codes: 0 = every pod submitted was bound or declared never placed (all of
them, or those before ``--stop-after`` ran out); 1 = a pod was neither within
``--pod-timeout``, the run was interrupted, or the stack failed; 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError, check_trace_files, finite_float, positive_float
from gpupack.cli_replay_usage import register as register_usage
from gpupack.cli_simulate import PRIORITY_SOURCES

HOW_LONG = (
    "On a 2-core machine a run takes a minute or two to start (control plane, nodes, agents; a first run "
    "also builds the control plane's binaries, minutes), then pods go one at a time: a pod bound takes "
    "0.02-1 s, a pod never placed 1.5-4 s (it is declared only once nothing more will happen for it). "
    "--max-nodes 50 of openb's default workload (450 pods) took 7 minutes in all, --max-nodes 200 "
    "(1,791 pods) 40 minutes; the whole cluster (1,213 nodes, about 11,000 pods) takes hours."
)


def _say(quiet: bool) -> Any:
    def say(text: str) -> None:
        print(text, file=sys.stderr if quiet else sys.stdout, flush=True)
    return say


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from sharing.simulator.traces import TraceError, load_nodes, load_pods

    try:
        check_trace_files(args.nodes, args.pods)
        return load_nodes(Path(args.nodes)), load_pods(Path(args.pods))
    except TraceError as exc:
        raise UsageError(str(exc)) from None


def _plan(args: argparse.Namespace, nodes: Any, trace: Any) -> Any:
    from gpupack.replay.mapping import products, simulated_gpus
    from sharing.simulator.arrivals import plan_run

    try:
        plan = plan_run(nodes, trace.pods, args.seed, args.inflate, args.max_nodes)
    except ValueError as exc:
        raise UsageError(f"{args.nodes}: {exc}") from None
    try:
        for node in plan.nodes:
            simulated_gpus(node)
        for pod in plan.workload.pods:
            products(pod)
    except ValueError as exc:
        raise UsageError(f"{exc} (gpupack replay maps openb's GPU types onto products: "
                         "mig/openb_gpus.py)") from None
    return plan


def run(args: argparse.Namespace) -> int:
    from sharing.packing.dual_prices import remembering_every_solution
    from sharing.packing.registry import canonical_policy_name

    missing = [flag for flag, value in (("--nodes", args.nodes), ("--pods", args.pods)) if value is None]
    if missing:  # argparse's own words, as when the flags were required=True
        args.replay_parser.error(f"the following arguments are required: {', '.join(missing)}")
    began = time.monotonic()
    if args.inflate <= 0:
        raise UsageError(f"--inflate must be greater than 0, got {args.inflate}")
    if args.max_nodes is not None and args.max_nodes < 1:
        raise UsageError(f"--max-nodes must be at least 1, got {args.max_nodes}")
    try:
        policy = canonical_policy_name(args.policy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot needs matplotlib (pip install -e '.[test]')") from None
    nodes, trace = _load(args)
    plan = _plan(args, nodes, trace)
    priorities, classes = _priorities(args, plan)
    say = _say(args.json)
    say(f"plan: {len(plan.workload.pods)} pods onto {len(plan.nodes)} of {plan.cluster_nodes} nodes "
        f"({plan.gpus} GPUs), seed {args.seed}, arrivals to {args.inflate * 100:.0f} % of capacity")
    # The model's draws and the run along the live choices go through the same typical-pods
    # tables until they part ways: solve each table's prices once for all of them.
    with remembering_every_solution():
        return _run(args, plan, nodes, trace, policy, say, began, priorities, classes)


def _priorities(args: argparse.Namespace, plan: Any) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    """Under ``--priority qos`` each pod's priority by trace name and the PriorityClass each plan pod
    names (``gpupack.replay.priority``); (None, None) under ``none``. UsageError for a pod list
    without ``qos`` or with a class openb lacks."""
    if args.priority == "none":
        return None, None
    from gpupack.cli_simulate import qos_priorities
    from gpupack.replay.priority import pod_classes

    priorities = qos_priorities(args.pods)
    try:
        return priorities, pod_classes(plan.workload.pods, priorities)
    except ValueError as exc:
        raise UsageError(f"{args.pods}: {exc}") from None


def _run(args: argparse.Namespace, plan: Any, nodes: Any, trace: Any, policy: str, say: Any, began: float,
         priorities: dict[str, Any] | None = None, classes: dict[str, str] | None = None) -> int:
    from gpupack.replay.figures import follow_live, model_figures
    from gpupack.replay.mapping import kube_node_name
    from gpupack.replay.report import as_json, as_text, plot
    from gpupack.replay.runner import pods_of, run_live
    from sharing.simulator.traces import workload_name

    models = model_figures(nodes, trace.pods, policy, args.seed, args.inflate, args.max_nodes, say=say,
                           priorities=priorities)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="gpupack-replay-"))
    budget = None if args.stop_after is None else args.stop_after * 60.0
    try:
        with _sigterm_interrupts():
            live = run_live(workdir, plan, policy=policy, pod_timeout_s=args.pod_timeout,
                            keep_logs=bool(args.workdir), progress=not args.no_progress, say=say,
                            run_id=f"seed-{args.seed}", submit_budget_s=budget, priority_classes=classes)
    except Exception as exc:  # noqa: BLE001 - the stack failed: say which part, keep its logs
        print(f"gpupack: error: the replay's stack failed: {exc} (logs under {workdir / 'logs'})", file=sys.stderr)
        return EXIT_NO
    trace_name = {kube_node_name(n.name): n.name for n in plan.nodes}
    # A run stopped early is followed as far as it went (the model replays the same prefix).
    following = follow_live(nodes, trace.pods, policy, args.seed, args.inflate, args.max_nodes,
                            [trace_name[r.node] if r.result == "bound" and r.node else None for r in live.results],
                            priorities) \
        if live.results else None
    report = as_json(live, models, workload=workload_name(Path(args.pods)), policy=policy, inflate=args.inflate,
                     seconds=time.monotonic() - began, following=following)
    if priorities is not None:
        report["priority"] = _priority_report(live, models, priorities)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(as_text(report) + ("\n" + _priority_text(report["priority"]) if "priority" in report else ""))
    if args.plot:
        plot(report, Path(args.plot))
        say(f"plot: {args.plot}")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return EXIT_NO if pods_of(live.results, "timeout") or live.stopped == "interrupted" else EXIT_OK


def _priority_report(live: Any, models: Any, priorities: dict[str, Any]) -> dict[str, Any]:
    """Live figures per class and of preemption beside the product model's (the same keys as
    ``gpupack simulate --priority qos``; the model's are means over its draws)."""
    from gpupack.cli_simulate import priority_extra
    from gpupack.replay.priority import live_priority_figures

    figures = live_priority_figures([r.pod for r in live.results], [r.name for r in live.results], live.bound,
                                    live.preempted, priorities, live.plan.gpus)
    simulated = priority_extra(models.product_priority)
    keys = ("alloc_at_by_class", "placed_by_class", "preemptions", "preempted_pods", "preempted_milli")
    return {"source": "qos", "preemption": "engine",
            "live": {**{k: figures[k] for k in keys}, "preempted_by": figures["preempted_by"],
                     "preempted": [{"pod": p.name, "attempt": p.attempt, "by": p.by} for p in live.preempted]},
            "simulated": {**{k: simulated[k] for k in keys}, "preemption_reasons": simulated["preemption_reasons"],
                          "preempted_equal_or_higher": simulated["preempted_equal_or_higher"],
                          "preemption_loops": simulated["preemption_loops"]},
            "placed_by_class_live_minus_simulated": {
                c: round(v - simulated["placed_by_class"][c], 2) for c, v in figures["placed_by_class"].items()
                if c in simulated["placed_by_class"]}}


def _priority_text(priority: dict[str, Any]) -> str:
    """The text summary's lines for ``--priority qos``: per class placed, and preemption, live and model."""
    live, model = priority["live"], priority["simulated"]
    classes = ", ".join(f"{c} {v:.2f} / {model['placed_by_class'].get(c, float('nan')):.2f}"
                        for c, v in live["placed_by_class"].items())
    return (f"placed at the end, % of each class's arrived milli (live / product model, --priority qos): {classes}\n"
            f"preemptions {live['preemptions']} / {model['preemptions']:g}, pods preempted {live['preempted_pods']} / "
            f"{model['preempted_pods']:g}, milli preempted {live['preempted_milli']} / {model['preempted_milli']:g}")


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a batch system's deadline, ``kill``) stops the submissions as Ctrl-C does, so the
    run still measures its costs, stops its stack and reports what it did."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "replay", help="replay an openb trace through the real stack (webhook, controller, kube-scheduler, KWOK "
                       "nodes, the agent fleet) and compare with the simulator",
        description="Replay an openb trace through gpupack's real stack on a local control plane with KWOK nodes, "
                    "one pod at a time in the order 'gpupack simulate' replays it, and report the allocation at "
                    "each arrived-demand level beside the simulator's product model and the FGD protocol, the pods "
                    "never placed, creation-to-bound latency and what the run cost. " + HOW_LONG,
    )
    # --nodes and --pods are required for an openb replay, checked in run(): `gpupack replay usage` needs neither.
    p.add_argument("--nodes", metavar="FILE", help="openb node list (openb_node_list_gpu_node.csv); required")
    p.add_argument("--pods", metavar="FILE", help="openb pod list (openb_pod_list_*.csv); required")
    p.add_argument("--seed", type=int, default=42, help="the protocol's seed: arrival order and node sample (default 42)")
    p.add_argument("--inflate", type=finite_float, default=1.3,
                   help="arrived demand as a multiple of the nodes' GPU capacity (default 1.3)")
    p.add_argument("--max-nodes", type=int, default=None, metavar="K",
                   help="replay onto the seed's sample of K nodes, the arrivals scaled to its GPU capacity as the "
                        "protocol does for the whole cluster; the same nodes and sequence as 'gpupack simulate "
                        "--max-nodes K' (default: every node of the list)")
    p.add_argument("--policy", default="gpupack", help="the controller's packing policy, and the simulator's (default gpupack)")
    p.add_argument("--pod-timeout", type=positive_float, default=120.0, metavar="S",
                   help="give up on a pod neither bound nor declared never placed after S seconds (default 120)")
    p.add_argument("--stop-after", type=positive_float, default=None, metavar="MINUTES",
                   help="submit no pod after MINUTES of submissions and report those submitted (complete: false; "
                        "the comparison is made at the highest arrived-demand level they complete). Ctrl-C or "
                        "SIGTERM stop a run the same way, with exit code 1 (default: no limit)")
    p.add_argument("--priority", choices=PRIORITY_SOURCES, default="none",
                   help="qos: openb's qos classes as PriorityClasses (LS, Guaranteed, Burstable high, BE low and "
                        "preemptible), each pod naming its own, and a pod preempted live counted as not placed; "
                        "the product model runs with --priority qos beside it and the JSON adds 'priority' (per "
                        "class and preemption figures, live and simulated). none: no PriorityClass (default)")
    p.add_argument("--json", action="store_true", help="print one JSON object (progress on stderr)")
    p.add_argument("--plot", metavar="FILE", help="also draw allocation against arrived demand into FILE (PNG; matplotlib)")
    p.add_argument("--workdir", metavar="DIR", help="keep the control plane's data and every component's log here "
                                                    "(default: a temporary directory, removed afterwards)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=run, replay_parser=p)
    usage = p.add_subparsers(dest="replay_kind", title="another kind of trace (gpupack replay usage --help)",
                             parser_class=type(p))
    register_usage(usage)

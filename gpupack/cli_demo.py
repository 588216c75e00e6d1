"""``gpupack demo [--keep] [--json]``: watch gpupack work end to end on a local control plane.

Starts a real kube-apiserver, etcd and kube-scheduler (built once, cached),
three simulated GPU nodes (2 x 8 H100 80GB, 1 x 4 A100 80GB sharing by MPS)
with their node agents, the admission webhook and the controller; submits a
mixed stream of fractional pods, lets some finish, shows live progress and
ends with a summary. ``--keep`` leaves everything running (stop it with
``gpupack dev cluster down``); ``--json`` prints the summary as JSON.
``--fault`` makes GPUs fail during the run (an XID on a busy MIG instance, a
GPU that falls off the bus, an ECC burst on the MPS node, later acknowledged)
and reports how fast each was routed around (``gpupack.demo.faults``); the
summary then adds ``faults_injected``, ``pods_placed_on_unhealthy``,
``in_use_instances_destroyed`` and ``fault_to_excluded_seconds_p95``.
``--backend dra`` runs the same nodes as a DRA node pool (``gpupack.demo.stack``):
pods ask the same way, each gets a ResourceClaim that kube-scheduler allocates
on the device gpupack's engine chose, and the summary adds ``claims_allocated``
(distinct claims of gpupack's driver seen allocated over the run).
``--usage-trace DIR`` makes the nodes' simulated GPU processes play a GenTD26 usage
trace (``--usage-time-scale`` times faster); each progress line then shows the pods'
use as the agents export it, and the summary adds ``pods_with_use``,
``pods_use_measured``, ``pod_gpu_util_mean_pct`` and ``pod_gpu_memory_gib``.
``--right-sizing off|initial|recreate`` adds the right-sizer (``gpupack.demo.rightsizing``): Deployments
of one replica ask a whole GPU each while the trace (the built-in one without ``--usage-trace``) uses a
fraction of it; the namespace is labelled with the mode, and the progress lines and the summary add the
``GPURecommendation`` objects, the pods right-sized at admission and, with ``recreate``, the controller's moves
and the GPUs those workloads hold before and after.

Exit codes: 0 = every admitted pod was scheduled, 1 = some were not (or the
stack did not start), 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError, load_usage_trace, non_negative_float, positive_float
from gpupack.demo.rightsizing import LIST_KEYS, MODES, text_lines
from sharing.api.backend import BACKENDS, DEFAULT_BACKEND


def _say(quiet: bool) -> Any:
    def say(text: str) -> None:
        print(text, file=sys.stderr if quiet else sys.stdout, flush=True)
    return say


def _lists(admin: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    from kubernetes import client

    from gpupack.demo.stack import DEMO_NAMESPACE, GROUP, VERSION

    custom, core = client.CustomObjectsApi(admin), client.CoreV1Api(admin)
    listed: Any = custom.list_cluster_custom_object(GROUP, VERSION, "gpunodes")
    gpunodes = listed.get("items", [])
    nodes = [admin.sanitize_for_serialization(n) for n in core.list_node().items]
    pods = [admin.sanitize_for_serialization(p) for p in core.list_namespaced_pod(DEMO_NAMESPACE).items]
    return gpunodes, nodes, pods


def run_demo(args: argparse.Namespace) -> int:
    from kubernetes import client

    from gpupack.demo import progress
    from gpupack.demo.stack import DEMO_NAMESPACE, Stack
    from gpupack.demo.workload import stream

    if args.fault and args.backend == "dra":
        raise UsageError("--fault runs on the device-plugin backend only (its scenario checks what the device "
                         "plugin withdraws); drop --fault or --backend dra")
    if args.right_sizing is not None and (args.fault or args.backend == "dra"):
        raise UsageError("--right-sizing runs on its own on the device-plugin backend; drop --fault and --backend dra")
    say = _say(args.json)
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="gpupack-demo-"))
    stack = Stack(workdir, keep=args.keep)
    stack.controller_metrics = args.fault
    stack.backend = args.backend
    if args.usage_trace is not None:
        load_usage_trace(args.usage_trace)  # a bad trace is refused before anything starts
        stack.usage_trace, stack.usage_time_scale = args.usage_trace.resolve(), args.usage_time_scale
    waits = 0.0
    if args.right_sizing is not None:
        from gpupack.demo.rightsizing import timings, write_builtin_trace

        if stack.usage_trace is None:
            stack.usage_trace = write_builtin_trace(workdir / "builtin-usage-trace")
            stack.usage_time_scale = args.usage_time_scale
        periods = timings(stack.usage_time_scale)
        stack.controller_manager = True  # the Deployments' ReplicaSets and their pods
        stack.agent_args, stack.controller_args = periods.agent_args(), periods.controller_args()
        waits = periods.min_observed_s  # the recommendations need that much history before anything is sized
        from gpupack.demo.rightsizing_live import add_nodes

        add_nodes(stack)
    if args.keep:
        from gpupack.devcluster import state as cluster_state

        existing = cluster_state.DevClusterRecord.load(cluster_state.state_dir())
        if existing is not None and all(cluster_state.alive(c) for c in existing.components):
            raise UsageError("--keep needs the dev-cluster slot, but `gpupack dev cluster up` is running; "
                             "stop it with `gpupack dev cluster down` or run the demo without --keep")
    try:
        stack.start(say)
    except Exception as exc:  # noqa: BLE001 - report any start failure with its cause, then clean up
        print(f"gpupack demo: the stack did not start: {exc}", file=sys.stderr)
        print(f"gpupack demo: logs in {workdir / 'logs'}", file=sys.stderr)
        stack.stop()
        return EXIT_NO
    core = client.CoreV1Api(stack.admin)
    sizing = None
    if args.right_sizing is not None:
        from gpupack.demo.rightsizing_live import LiveScenario
        from gpupack.demo.stack import REPO

        sizing = LiveScenario(stack.admin, DEMO_NAMESPACE, args.right_sizing, say)
        sizing.setup(REPO)
    pods = stream(args.pods, args.submit_seconds, seed=args.seed)
    tracker = progress.Tracker()
    claims = progress.ClaimCounter() if args.backend == "dra" else None
    submitted = rejected = finished = 0
    rejections: list[str] = []
    finish_at: dict[str, float] = {}
    t0 = time.monotonic()
    deadline = t0 + args.submit_seconds + args.timeout + waits
    next_print = 0.0
    queue = list(pods)
    faults = None
    if args.fault:
        from gpupack.demo.faults import FaultScenario

        faults = FaultScenario({n.name: stack.state_file(n.name) for n in stack.nodes}, args.submit_seconds,
                               f"http://127.0.0.1:{stack.controller_metrics_port}/metrics", stack.admin, say)
    say(f"submitting {len(pods)} pods over {args.submit_seconds:.0f}s (seed {args.seed})")
    while True:
        now_m = time.monotonic() - t0
        while queue and queue[0].start_after <= now_m:
            pod = queue.pop(0)
            submitted += 1
            try:
                manifest: Any = pod.manifest(DEMO_NAMESPACE)
                core.create_namespaced_pod(DEMO_NAMESPACE, manifest)
            except client.ApiException as exc:
                rejected += 1
                message = json.loads(exc.body or "{}").get("message", exc.reason) if exc.body else exc.reason
                rejections.append(f"{pod.name}: {str(message)[:160]}")
                continue
            if pod.lifetime is not None:
                finish_at[pod.name] = pod.lifetime
        gpunodes, nodes, live = _lists(stack.admin)
        tracker.observe(gpunodes, live, datetime.now(timezone.utc))
        claim_objs = _claims(stack.admin) if claims is not None else None
        if claims is not None and claim_objs is not None:
            claims.observe(claim_objs)
        if faults is not None:
            faults.bindings(live)
            faults.step(now_m, gpunodes, nodes, tracker.scheduled_at)
        if sizing is not None:
            sizing.step()
        for name, life in list(finish_at.items()):
            at = tracker.scheduled_at.get(name)
            if at is not None and (datetime.now(timezone.utc) - at).total_seconds() >= life:
                core.delete_namespaced_pod(name, DEMO_NAMESPACE, grace_period_seconds=0)
                del finish_at[name]
                finished += 1
        c = progress.counts(live)
        now_figures = progress.figures(gpunodes, nodes, live, claim_objs)
        if now_m >= next_print:
            say(f"[{now_m:5.1f}s] submitted {submitted}  rejected {rejected}  admitted {c['admitted'] + finished}  "
                f"gated {c['gated']}  pending {c['pending']}  scheduled {len(tracker.scheduled_at)}  "
                f"finished {finished}  allocation {100 * now_figures.allocation_ratio:.0f}%  "
                f"occupied {100 * now_figures.occupied_ratio:.0f}%")
            if args.layouts:
                for line in progress.gpu_lines(gpunodes):
                    say(line)
            if stack.agent_metrics_ports:
                say("        " + _pod_use(stack.agent_metrics_ports.values()).line())
            if sizing is not None:
                say("        " + sizing.scenario.line())
            next_print = now_m + args.interval
        waiting = c["gated"] + c["pending"]
        if faults is not None and faults.busy():
            pass  # the fault scenario is not over: keep going
        elif sizing is not None and not sizing.scenario.done():
            pass  # the right-sizing scenario is not over: keep going
        elif not queue and waiting == 0 and not finish_at:
            break
        settled = sizing is None or sizing.scenario.done()
        if not queue and waiting == 0 and now_m > args.submit_seconds + 12 and settled:
            break  # remaining lifetimes run on; the stream itself is done
        if time.monotonic() > deadline:
            break
        time.sleep(0.25)
    gpunodes, nodes, live = _lists(stack.admin)
    tracker.observe(gpunodes, live, datetime.now(timezone.utc))
    c = progress.counts(live)
    claim_objs = _claims(stack.admin) if claims is not None else None
    end = progress.figures(gpunodes, nodes, live, claim_objs)
    reshape = tracker.latencies(gated=True)
    direct = tracker.latencies(gated=False)
    summary: dict[str, Any] = {
        "pods_submitted": submitted,
        "pods_admitted": submitted - rejected,
        "pods_scheduled": len(tracker.scheduled_at),
        "pods_rejected": rejected,
        "pods_finished": finished,
        "pods_unscheduled": c["gated"] + c["pending"],
        "gpus_reshaped": tracker.gpus_reshaped,
        "allocation_ratio": round(end.allocation_ratio, 4),
        "occupied_ratio": round(end.occupied_ratio, 4),
        "fragmentation": round(end.fragmentation, 4),
        "schedule_seconds_median_with_reshape": _round(progress.percentile(reshape, 50)),
        "schedule_seconds_p95_with_reshape": _round(progress.percentile(reshape, 95)),
        "schedule_seconds_median_capacity_existed": _round(progress.percentile(direct, 50)),
        "seconds": round(time.monotonic() - began, 1),
    }
    if claims is not None and claim_objs is not None:
        claims.observe(claim_objs)
        summary["claims_allocated"] = claims.allocated
    if stack.agent_metrics_ports:
        use = _pod_use(stack.agent_metrics_ports.values())
        summary.update({"pods_with_use": use.pods, "pods_use_measured": use.measured,
                        "pod_gpu_util_mean_pct": _round(use.mean_util_percent),
                        "pod_gpu_memory_gib": round(use.memory_gib, 1)})
    if sizing is not None:
        sizing.step()
        summary.update(sizing.scenario.summary())
    ok = summary["pods_unscheduled"] == 0
    if faults is not None:
        summary.update(faults.summary())
        ok = ok and not faults.busy() and summary["pods_placed_on_unhealthy"] == 0 \
            and summary["in_use_instances_destroyed"] == 0
    if sizing is not None:
        ok = ok and sizing.scenario.done()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        say("")
        say("GPU layouts at the end:")
        for line in progress.gpu_lines(gpunodes):
            say(line)
        say("")
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            if sizing is not None and key in LIST_KEYS:
                continue  # shown below, a line each
            shown = f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))
            say(f"  {key:<{width}}  {shown}")
        for line in rejections[:5]:
            say(f"  rejected: {line}")
        for line in faults.lines() if faults is not None else []:
            say(line)
        for line in text_lines(summary) if sizing is not None else []:
            say(line)
    if args.keep:
        from gpupack.devcluster import state as cluster_state

        record = stack.detach()
        record.save(cluster_state.state_dir())
        say(f"kept running; explore with: export KUBECONFIG={record.kubeconfig}; kubectl get gpunodes; "
            f"kubectl -n gpupack-demo get pods -o wide")
        say("stop everything with: gpupack dev cluster down")
    else:
        stack.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return EXIT_OK if ok else EXIT_NO


def _claims(admin: Any) -> list[dict[str, Any]]:
    from kubernetes import client

    listed: Any = client.CustomObjectsApi(admin).list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")
    return list(listed.get("items") or [])


def _pod_use(ports: Iterable[int]) -> Any:
    from gpupack.demo.usage import scrape

    return scrape(f"http://127.0.0.1:{port}/metrics" for port in ports)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _handler(args: argparse.Namespace) -> int:
    if args.pods < 1 or args.pods > 500:
        raise UsageError(f"--pods must be 1..500, got {args.pods}")
    if args.submit_seconds < 0 or args.timeout <= 0 or args.interval <= 0:
        raise UsageError("--submit-seconds must be >= 0; --timeout and --interval must be > 0")
    return run_demo(args)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("demo", help="run gpupack end to end on a local control plane with simulated GPUs")
    p.add_argument("--keep", action="store_true", help="leave the cluster and components running afterwards")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON (progress goes to stderr)")
    p.add_argument("--pods", type=int, default=40, help="pods to submit (default 40)")
    p.add_argument("--submit-seconds", type=non_negative_float, default=20.0, help="spread submissions over this long (default 20)")
    p.add_argument("--timeout", type=positive_float, default=90.0, help="give up this long after the last submission (default 90)")
    p.add_argument("--seed", type=int, default=7, help="workload seed (default 7)")
    p.add_argument("--interval", type=positive_float, default=2.0, help="seconds between progress lines (default 2)")
    p.add_argument("--layouts", action="store_true", help="print every GPU's layout with each progress line")
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                   help="the nodes' backend: NVIDIA's device plugin (device-plugin, the default) or a DRA node pool "
                        "(dra: kube-controller-manager joins, the agents publish ResourceSlices, each pod gets a "
                        "ResourceClaim pinned to the device gpupack's engine chose; --json adds claims_allocated)")
    p.add_argument("--fault", action="store_true",
                   help="make GPUs fail during the run (an XID on a busy MIG instance, a lost GPU, an ECC burst, "
                        "an acknowledgement) and measure how the cluster routes around them")
    p.add_argument("--usage-trace", type=Path, default=None, metavar="DIR",
                   help="the simulated GPU processes play this GenTD26 usage trace (e.g. "
                        "../shared/traces/genai-usage): the progress lines and the summary add the pods' use, read "
                        "from the agents' per-pod metrics")
    p.add_argument("--usage-time-scale", type=positive_float, default=60.0, metavar="F",
                   help="with --usage-trace: trace seconds played per second (default 60)")
    p.add_argument("--right-sizing", choices=MODES, default=None, metavar="MODE",
                   help="show the GPU right-sizer (docs/right-sizing.md): three Deployments of one replica ask a "
                        "whole GPU each (gpupack.io/gpu-milli: 1000) and use a fraction of it; the namespace is "
                        "labelled gpupack.io/right-sizing=MODE: off (recommend only), initial (size new pods: the "
                        "demo restarts each pod once its recommendation is provided) or recreate (the controller "
                        "moves the pods itself; the optional grant is installed). The recommender needs an hour of "
                        "trace time (3600 / --usage-time-scale seconds). Without --usage-trace a small built-in "
                        "trace plays. The progress lines and the summary add the GPURecommendations, the "
                        "right-sized pods, the moves and the GPUs the Deployments hold before and after")
    p.set_defaults(handler=_handler)

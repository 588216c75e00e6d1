"""``gpupack controller ...``: the cluster controller (Deployment entry point) and a dry run.

``gpupack controller run`` watches the cluster in ``--kubeconfig`` (or the
in-cluster config) into caches and plans while it holds the leader Lease: a
cycle when the caches change (at most one per ``--min-cycle-seconds``) and one
every ``--resync-seconds`` anyway.
``gpupack controller plan`` runs one planning cycle against the cluster and
prints the plan as JSON without writing anything.
Every option of ``run`` is also an environment variable ``GPUPACK_CONTROLLER_<OPTION>``.
Exit codes: 0 = ok, 1 = the cluster could not be read, 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError, non_negative_float, positive_float


def _settings(args: argparse.Namespace) -> Any:
    from controller.settings import ControllerSettings

    overrides = {
        "batch_seconds": args.batch_seconds, "resync_seconds": args.resync_seconds, "policy": args.policy,
        "min_cycle_seconds": args.min_cycle_seconds, "cache_sync_seconds": args.cache_sync_seconds,
        "metrics_port": args.metrics_port, "identity": args.identity, "lease_seconds": args.lease_seconds,
        "lease_namespace": args.lease_namespace, "lease_name": args.lease_name, "log_level": args.log_level,
        "evict_on_gpu_fault": True if args.evict_on_gpu_fault else None,
        "namespaces": args.namespaces, "agent_stale_seconds": args.agent_stale_seconds,
        "mig_parted_namespace": args.mig_parted_namespace, "mig_parted_configmap": args.mig_parted_configmap,
        "recommend": False if args.no_recommend else None, "recommend_seconds": args.recommend_seconds,
        "recommend_min_observed_seconds": args.recommend_min_observed_seconds,
        "usage_time_scale": args.usage_time_scale, "usage_clock_start": args.usage_clock_start,
        "usage_source": args.usage_source, "prometheus_url": args.prometheus_url,
        "prometheus_selector": args.prometheus_selector,
        "prometheus_lookback_seconds": args.prometheus_lookback_seconds,
    }
    try:
        return ControllerSettings.from_env(**overrides)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run(args: argparse.Namespace) -> int:
    from controller.operator import run
    from kube.client import KubeConfigError

    settings = _settings(args)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)
    # kopf hosts the process and watches SharingPolicies; its watch retries log every attempt while the
    # API server is down, and the loop already reports the outage once (kube.backoff).
    logging.getLogger("kopf._cogs.clients").setLevel(logging.CRITICAL)
    try:
        return run(settings, args.kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None


def _plan(args: argparse.Namespace) -> int:
    from controller.kube import Kube
    from controller.planning.planner import plan
    from controller.state.build import build_snapshot
    from kube.client import KubeConfigError
    from kube.errors import KubeError

    settings = _settings(args)
    try:
        kube = Kube.connect(args.kubeconfig)
        snapshot = build_snapshot(kube.list_gpunodes(), kube.list_nodes(), kube.list_pods(), kube.list_policies(),
                                  namespaces=kube.list_namespaces())
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None
    except KubeError as exc:
        print(f"gpupack: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_NO
    result = plan(snapshot, datetime.now(timezone.utc), policy_name=settings.policy)
    print(json.dumps({
        "layouts": [{"node": c.node, "gpu": c.index, "kind": c.kind, "layout": [str(i) for i in c.layout],
                     "destroy": [str(i) for i in c.destroy], "create": [str(i) for i in c.create], "reason": c.reason}
                    for c in result.layouts],
        "sharing": [{"node": c.node, "mode": c.mode, "replicas": c.replicas, "reason": c.reason} for c in result.sharing],
        "releases": [{"pod": r.pod, "node": r.node, "reason": r.reason} for r in result.releases],
        "waiting": [{"pod": w.pod, "reason": w.reason} for w in result.waiting],
    }, indent=2))
    return EXIT_OK


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
    p.add_argument("--policy", help="packing policy for shared pods (default gpupack)")
    p.add_argument("--batch-seconds", type=non_negative_float, help="wait this long after a change for more (default 0.5)")
    p.add_argument("--resync-seconds", type=positive_float,
                   help="plan at least this often, even when the watch caches saw no change (default 10)")
    p.add_argument("--min-cycle-seconds", type=non_negative_float,
                   help="plan at most once per this long, however often the cluster changes: each cycle plans "
                        "every change since the previous one (default 0.5)")
    p.add_argument("--cache-sync-seconds", type=non_negative_float,
                   help="how long the first cycle waits for the watch caches' first lists; until a cache has "
                        "listed, its kind is read by direct lists (default 60)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (default 8080)")
    p.add_argument("--identity", help="leader-election identity (default host-pid)")
    p.add_argument("--lease-seconds", type=positive_float, help="leader lease duration (default 15)")
    p.add_argument("--lease-namespace", help="namespace of the leader Lease (default gpupack-system)")
    p.add_argument("--lease-name", help="name of the leader Lease (default gpupack-controller)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="default info")
    p.add_argument("--namespaces", help="comma-separated namespaces whose pods to place (default: all)")
    p.add_argument("--no-recommend", action="store_true", help="do not run the right-sizer's recommender")
    p.add_argument("--recommend-seconds", type=positive_float, help="seconds between recommender cycles (default 60)")
    p.add_argument("--recommend-min-observed-seconds", type=non_negative_float,
                   help="history a workload container needs before its first recommendation (default 3600)")
    p.add_argument("--usage-time-scale", type=positive_float, metavar="F",
                   help="REPLAY: the recommender reads time on a usage trace's clock, F times faster than the wall's "
                        "from --usage-clock-start, as agents playing the trace with --usage-trace-clock time the use "
                        "(default 1: the wall's)")
    p.add_argument("--usage-clock-start", type=non_negative_float, metavar="UNIX_SECONDS",
                   help="REPLAY: when the trace clock and the wall's read the same (the agents' --usage-trace-start)")
    p.add_argument("--evict-on-gpu-fault", action="store_true",
                   help="evict pods of a failed GPU or MIG instance (Eviction API, PodDisruptionBudgets honoured) "
                        "when a controller other than a DaemonSet recreates them; default: leave them running")
    p.add_argument("--agent-stale-seconds", type=positive_float,
                   help="treat a GPUNode whose agent has been silent this long as stale (default 180)")
    p.add_argument("--mig-parted-namespace", help="GPU Operator mode: namespace of mig-manager's ConfigMap "
                   "(default gpu-operator)")
    p.add_argument("--mig-parted-configmap", help="GPU Operator mode: the ConfigMap mig-manager reads, where the "
                   "controller publishes the MIG configs node agents ask for (default default-mig-parted-config)")
    p.add_argument("--usage-source", choices=["agents", "prometheus"],
                   help="where the right-sizer's recommender reads per-pod GPU use: agents (the histories "
                        "gpupack's node agents publish in their GPUNodes) or prometheus (a Prometheus server that "
                        "already scrapes per-pod DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED, from the agents or "
                        "dcgm-exporter; needs --prometheus-url; no memory-limit hits); each GPURecommendation's "
                        "status.source says which (default agents)")
    p.add_argument("--prometheus-url", metavar="URL",
                   help="with --usage-source prometheus: the server's base URL, e.g. http://prometheus:9090")
    p.add_argument("--prometheus-selector", metavar="MATCHERS",
                   help="extra label matchers for the series read, e.g. 'job=\"gpupack-node-agent\"' where "
                        "dcgm-exporter's whole-GPU series have the same names (default: none)")
    p.add_argument("--prometheus-lookback-seconds", type=non_negative_float,
                   help="how far back the first read (and one after an outage) goes (default 86400)")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("controller", help="cluster controller: layouts, gates, placement")
    sub = parser.add_subparsers(dest="controller_command", metavar="SUBCOMMAND")
    run = sub.add_parser("run", help="run the controller (leader-elected)")
    _common(run)
    run.set_defaults(handler=_run)
    dry = sub.add_parser("plan", help="print one planning cycle's plan as JSON; writes nothing")
    _common(dry)
    dry.set_defaults(handler=_plan)

"""``gpupack agent ...``: the node agent (DaemonSet entry point) and a dump of what NVML reports.

``gpupack agent run --node NAME`` runs the agent against the cluster in
``--kubeconfig`` (or in-cluster config). ``--simulate MODEL:COUNT`` uses the
SIMULATED NVML backend instead of the GPU driver (MODEL: a MIG catalog model
such as H200, or an openb GPU type without MIG such as T4 or V100M32), with
``--state-file`` so a restarted agent sees the same GPUs; add ``--emulate-device-plugin`` to advertise
resources on the Node as the NVIDIA device plugin would (simulation only).
``--usage-trace DIR`` (simulation) makes the GPU processes play a GenTD26 usage
trace, ``--usage-time-scale`` times faster than it was recorded.
``--backend dra`` runs the node on Dynamic Resource Allocation: no device plugin,
the agent publishes the node's ResourceSlices (driver ``gpu.gpupack.io``,
docs/dra.md); the default, ``device-plugin``, keeps the NVIDIA device plugin.
Every option also has an environment variable ``GPUPACK_AGENT_<OPTION>``.

``gpupack agent snapshot`` prints what the NVML backend (real or simulated)
reports, as JSON, without talking to Kubernetes: the same node snapshot the
agent publishes. (``gpupack agent inventory`` is its old name; it still works,
with a warning, and will be removed in a later release.)

``gpupack agent fault`` (simulation) and ``gpupack agent health`` handle GPU
faults by hand: see ``gpupack agent health --help``.

Exit codes: 0 = ok, 1 = NVML unavailable (snapshot), 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpupack.cli import (
    EXIT_BAD_INPUT, EXIT_NO, EXIT_OK, UsageError, describe_input_error, load_usage_trace, non_negative_float,
    positive_float)
from kube.inputfile import read_text
from node.nvml.errors import NvmlError
from node.nvml.protocol import NvmlBackend
from node.base.settings import BACKENDS, LAYOUT_APPLY_MODES, AgentSettings
from mig.openb_gpus import OPENB_GPUS
from sharing.usage.trace import DUTY_FILE, MEMORY_FILE


def _simulated(spec: str, state_file: str, seed: str, delay_s: float = 0.0) -> NvmlBackend:
    """``--simulate MODEL:COUNT``: parse it, then ``node.nvml.simulated.simulated_backend`` builds it."""
    from node.nvml.simulated import simulated_backend

    model_name, sep, count_text = spec.rpartition(":")
    if not sep or not model_name:
        raise UsageError(f"--simulate wants MODEL:COUNT (e.g. H200:2), got {spec!r}")
    try:
        count = int(count_text)
    except ValueError:
        raise UsageError(f"--simulate {spec!r}: GPU count {count_text!r} is not an integer") from None
    if not 1 <= count <= 16:
        raise UsageError(f"--simulate {spec!r}: GPU count must be 1..16")
    try:
        delays = {"create": delay_s, "destroy": delay_s} if delay_s > 0 else None
        return simulated_backend(model_name, count, state_file or None, seed, delays=delays)
    except ValueError as exc:  # an unknown model (listing the valid ones) or a mismatched state file
        raise UsageError(str(exc)) from None


def _play_usage_trace(backend: NvmlBackend, settings: AgentSettings) -> None:
    """``--usage-trace DIR``: the simulated processes play the trace (``SimulatedNvml.play_trace``)."""
    from node.nvml.simulated import SimulatedNvml
    from sharing.usage.playback import PlaybackError, parse_pod_mapping

    assert isinstance(backend, SimulatedNvml)  # settings refuse a trace without --simulate
    trace = load_usage_trace(Path(settings.usage_trace))
    pods = None
    if settings.usage_trace_pods:
        try:
            pods = parse_pod_mapping(read_text(settings.usage_trace_pods).splitlines(), settings.usage_trace_pods)
        except OSError as exc:
            raise UsageError(f"--usage-trace-pods: {describe_input_error(exc)}") from None
        except PlaybackError as exc:  # names the file and line
            raise UsageError(f"--usage-trace-pods: {exc}") from None
    try:
        backend.play_trace(trace, settings.usage_time_scale, settings.usage_trace_start or None, pods)
    except PlaybackError as exc:  # a mapping naming a pod the trace does not hold
        raise UsageError(f"--usage-trace {settings.usage_trace}: {exc}") from None


def open_backend(settings: AgentSettings) -> tuple[NvmlBackend | None, str]:
    """The backend, or (None, why) when NVML cannot be opened (reported, not fatal)."""
    if settings.simulate:
        backend = _simulated(settings.simulate, settings.state_file, settings.node_name or "gpupack-sim",
                             settings.simulate_delay_seconds)
        if settings.usage_trace:
            _play_usage_trace(backend, settings)
        return backend, ""
    from node.nvml.real import RealNvml

    try:
        return RealNvml.open(), ""
    except NvmlError as exc:
        return None, f"NVML could not be opened: {exc}"


def _settings(args: argparse.Namespace) -> AgentSettings:
    overrides: dict[str, Any] = {
        "node_name": args.node, "mode": args.mode, "simulate": args.simulate, "state_file": args.state_file,
        "poll_seconds": args.poll_seconds, "idle_seconds": args.idle_seconds, "metrics_port": args.metrics_port,
        "emulate_device_plugin": True if args.emulate_device_plugin else None,
        "heartbeat_seconds": args.heartbeat_seconds, "backend": args.backend,
        "usage_publish_seconds": args.usage_publish_seconds, "usage_sample_seconds": args.usage_sample_seconds,
        "usage_trace": None if args.usage_trace is None else str(args.usage_trace),
        "usage_time_scale": args.usage_time_scale, "usage_trace_start": args.usage_trace_start,
        "usage_trace_pods": None if args.usage_trace_pods is None else str(args.usage_trace_pods),
        "usage_trace_clock": True if args.usage_trace_clock else None,
    }
    try:
        settings = AgentSettings.from_env(**overrides)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    if settings.emulate_device_plugin and not settings.simulate:
        raise UsageError("--emulate-device-plugin is for simulated nodes only (use it with --simulate)")
    return settings


def _run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if not settings.node_name:
        raise UsageError("--node (or GPUPACK_AGENT_NODE_NAME) is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from node.agent import Agent
    from kube.errors import KubeError
    from node.base.kube import Kube, KubeConfigError
    from node.metrics import AgentMetrics

    # The local inputs first (a simulated node's state file), then the cluster: a bad file is
    # reported as itself, not hidden behind a credentials error.
    backend, error = open_backend(settings)
    try:
        kube = Kube.connect(args.kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None
    metrics = AgentMetrics()
    metrics.serve(settings.metrics_port)
    agent = Agent(settings, backend, kube, backend_error=error, metrics=metrics)
    stopping = {"flag": False}

    def stop(_signum: int, _frame: object) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.once:
        try:
            agent.tick()
        except KubeError as exc:
            if exc.not_found:
                raise UsageError(f"Node {settings.node_name!r} does not exist in the cluster ({exc})") from None
            print(f"gpupack: Kubernetes API error: {exc}", file=sys.stderr)
            return EXIT_NO
        return EXIT_OK
    agent.run_forever(lambda: stopping["flag"])
    if backend is not None:
        backend.close()
    return EXIT_OK


def _deprecated_inventory(args: argparse.Namespace) -> int:
    print("gpupack: 'agent inventory' is deprecated; use 'agent snapshot' (same output)", file=sys.stderr)
    return _snapshot(args)


def _snapshot(args: argparse.Namespace) -> int:
    from node.base.snapshot import read_snapshot

    settings = _settings(args)
    backend, error = open_backend(settings)
    if backend is None:
        print(f"gpupack: {error}", file=sys.stderr)
        return EXIT_NO
    snapshot = read_snapshot(backend, backend.kind)
    out: dict[str, Any] = {"backend": snapshot.backend, "error": snapshot.error, "warnings": list(snapshot.warnings),
                           "gpus": []}
    for gpu in snapshot.gpus:
        out["gpus"].append({
            "device": asdict(gpu.info), "model": gpu.model.product if gpu.model else None,
            "instances": [{"gi_id": i.gi_id, "profile": i.profile, "placement": str(i.placement), "uuid": i.uuid}
                          for i in gpu.instances],
            "processes": [asdict(p) for p in gpu.processes],
            "utilization": asdict(gpu.utilization) if gpu.utilization else None, "error": gpu.error,
        })
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    backend.close()
    return EXIT_OK if snapshot.error is None else EXIT_NO


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", default=None, help="Node (and GPUNode) name this agent serves")
    p.add_argument("--simulate", default=None, metavar="MODEL:COUNT",
                   help="use the SIMULATED NVML backend with COUNT (1..16) GPUs of MODEL: a MIG-capable catalog "
                        "model (e.g. H200:2) or an openb GPU type without MIG, by type or product, any case "
                        f"({', '.join(OPENB_GPUS)}; e.g. T4:8 or Tesla-V100-SXM2-32GB:4)")
    p.add_argument("--state-file", default=None, help="simulated backend: JSON state file (survives restarts)")
    p.add_argument("--mode", default=None, choices=LAYOUT_APPLY_MODES, help="direct (NVML) or operator (mig-manager); default direct")
    p.add_argument("--poll-seconds", type=positive_float, default=None, help="seconds between NVML reads (default 5)")
    p.add_argument("--usage-publish-seconds", type=positive_float, default=None,
                   help="write the per-pod use histories to the GPUNode at most this often (default 300)")
    p.add_argument("--usage-sample-seconds", type=non_negative_float, default=None,
                   help="also sample the pods' GPU use this often between ticks (NVML only), so a memory peak "
                        "shorter than --poll-seconds is not missed; the agent then sleeps between ticks instead of "
                        "watching its GPUNode (default 0: once per tick)")
    p.add_argument("--idle-seconds", type=non_negative_float, default=None,
                   help="idle time before an instance may be destroyed (default 300)")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port, 0 = off (default 9402)")
    p.add_argument("--heartbeat-seconds", type=positive_float, default=None,
                   help="write status at least this often, so the controller sees the agent alive (default 60; "
                        "keep it well under the controller's --agent-stale-seconds)")
    p.add_argument("--emulate-device-plugin", action="store_true",
                   help="SIMULATION: advertise Node resources/labels as the NVIDIA device plugin and GFD would")
    p.add_argument("--usage-trace", default=None, type=Path, metavar="DIR",
                   help="SIMULATION: the GPU processes play the pods of this GenTD26 usage trace (a folder holding "
                        f"{DUTY_FILE} and {MEMORY_FILE}): duty cycle as SM load, and memory; one trace pod per "
                        "process, in order of appearance (docs/node-agent.md, \"Playing a usage trace\")")
    p.add_argument("--usage-time-scale", default=None, type=positive_float, metavar="F",
                   help="trace seconds played per second (default 60: one trace minute a second)")
    p.add_argument("--usage-trace-start", default=None, type=non_negative_float, metavar="UNIX_SECONDS",
                   help="when the trace's first step plays, so several nodes share one timeline (default: when this "
                        "node first played it, kept in its state file)")
    p.add_argument("--usage-trace-pods", default=None, type=Path, metavar="FILE",
                   help="CSV pod,container_ip: the trace pod each pod (namespace/name) plays; others in order of "
                        "appearance")
    p.add_argument("--usage-trace-clock", action="store_true",
                   help="with --usage-trace: time the pods' use histories on the trace's clock (--usage-time-scale "
                        "times faster from --usage-trace-start), as a live replay's controller does "
                        "(docs/usage.md, \"Live replay\")")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="who hands GPUs to containers: the NVIDIA device plugin (device-plugin, the default) or "
                        "DRA, with the agent publishing the node's ResourceSlices (dra); one backend per node pool")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("agent", help="node agent: NVML snapshot, MIG reconciler, device-plugin handshake",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="agent_command", metavar="SUBCOMMAND", parser_class=type(parser))
    run = sub.add_parser("run", help="run the agent loop")
    _common(run)
    run.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    run.add_argument("--once", action="store_true", help="one pass, then exit (for debugging)")
    run.set_defaults(handler=_run)
    snapshot = sub.add_parser("snapshot", help="print what the NVML backend reports, as JSON (no Kubernetes)")
    _common(snapshot)
    snapshot.set_defaults(handler=_snapshot)
    old_name = sub.add_parser("inventory")  # no help: left out of the listing, kept for old scripts
    _common(old_name)
    old_name.set_defaults(handler=_deprecated_inventory)
    from gpupack import cli_agent_fleet, cli_agent_health

    cli_agent_fleet.register(sub, open_backend)
    cli_agent_health.register(sub)
    parser.set_defaults(handler=lambda _args: (parser.print_help(), EXIT_BAD_INPUT)[1])

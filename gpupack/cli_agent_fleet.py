"""``gpupack agent fleet``: the node agent for many SIMULATED nodes in one process (``gpupack.fleet.agents``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

from gpupack.cli import EXIT_OK, UsageError, non_negative_float, positive_float
from node.base.settings import AgentSettings

if TYPE_CHECKING:
    from gpupack.fleet.agents import BackendOpener

DESCRIPTION = """\
SIMULATION ONLY. Runs the node agent for many simulated nodes in one process, so
that a fleet of KWOK nodes (docs/kwok.md) needs one process, not one per node.

It serves every Node annotated gpupack.io/simulated-gpus=MODEL:COUNT (MODEL as
'agent run --simulate' takes it: a MIG catalog model such as A100-40GB or H100, or an
openb type such as T4), or only those --selector picks, and follows Nodes that
gain or lose the annotation while it runs. Each node gets exactly what
'gpupack agent run --node NAME --simulate MODEL:COUNT --emulate-device-plugin'
would run, built by the same code: its own agent, simulated GPUs (state in
--state-dir, else in memory), emulated device plugin, idle clocks and health
monitor (a node labelled gpupack.io/backend=dra publishes ResourceSlices instead).

What is shared is what costs the API server: reads come from one watch per kind
(Nodes, GPUNodes, bound pods, SharingPolicies, the XID table) instead of five
requests per node per tick, and a few worker threads step the agents when a node's
objects change, else every --poll-seconds. At rest each node writes only its
heartbeat (every --heartbeat-seconds). docs/agent-fleet.md has the design and the
numbers.

Every agent option also has its environment variable GPUPACK_AGENT_<OPTION>.
"""


def _run(args: argparse.Namespace, open_backend: BackendOpener) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kube.client import KubeConfigError
    from gpupack.fleet.agents import Fleet, FleetSettings, fleet_configmaps
    from gpupack.fleet.kube import ApiCounts, FleetCaches, SharedKube, counting_api_client

    overrides: dict[str, Any] = {"poll_seconds": args.poll_seconds, "heartbeat_seconds": args.heartbeat_seconds,
                                 "idle_seconds": args.idle_seconds}
    try:
        agent = AgentSettings.from_env(**overrides)
        if args.poll_seconds is None and "GPUPACK_AGENT_POLL_SECONDS" not in os.environ:
            agent = agent.with_(poll_seconds=30.0)
        settings = FleetSettings(agent=agent, selector=args.selector or "", workers=args.workers,
                                 state_dir=args.state_dir or "", metrics_port=args.metrics_port,
                                 report_every_seconds=args.report_every, stagger_seconds=args.stagger_seconds)
        settings.validate()
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    counts = ApiCounts()
    try:
        # One connection per worker and per watch (five kinds and the XID table), and a few spare.
        api = counting_api_client(args.kubeconfig, counts, settings.workers + 6 + 4)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None
    kube = SharedKube(api, FleetCaches.connect(api, node_selector=settings.selector,
                                               configmaps=fleet_configmaps(settings.agent)))
    fleet = Fleet(settings, kube, counts, open_backend)
    if args.once:
        logging.getLogger("gpupack.fleet").info("stepped every node once: %s", fleet.run_once().line())
        return EXIT_OK
    fleet.serve_metrics()
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fleet.run(stop)
    return EXIT_OK


def register(sub: argparse._SubParsersAction, open_backend: BackendOpener) -> None:  # type: ignore[type-arg]
    """Add ``fleet`` to ``gpupack agent``; ``open_backend`` opens each node's backend (what ``agent run`` uses)."""
    fleet = sub.add_parser("fleet", help="SIMULATION: the node agent for many simulated (KWOK) nodes in one process",
                           description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    fleet.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    fleet.add_argument("--selector", default=None,
                       help="label selector: serve only the annotated Nodes it selects (default: all annotated Nodes)")
    fleet.add_argument("--workers", type=int, default=4, help="threads stepping agents (default 4)")
    fleet.add_argument("--poll-seconds", type=positive_float, default=None,
                       help="each node's agent steps at least this often; a change of its objects wakes it sooner "
                            "(default 30)")
    fleet.add_argument("--heartbeat-seconds", type=positive_float, default=None,
                       help="each node writes its GPUNode status at least this often (default 60): the fleet's "
                            "writes at rest; keep it well under the controller's --agent-stale-seconds")
    fleet.add_argument("--idle-seconds", type=non_negative_float, default=None,
                       help="idle time before an instance may be destroyed (default 300)")
    fleet.add_argument("--state-dir", default=None,
                       help="directory for each node's simulated GPU state, NODE.json (default: in memory)")
    fleet.add_argument("--metrics-port", type=int, default=0,
                       help="one Prometheus endpoint for the fleet, each agent's metrics labelled by node "
                            "(default 0 = off; 9402 is the agent's usual port)")
    fleet.add_argument("--report-every", type=non_negative_float, default=60.0, metavar="SECONDS",
                       help="log nodes served, steps/s and API writes per node per minute this often "
                            "(default 60; 0 = never)")
    fleet.add_argument("--stagger-seconds", type=non_negative_float, default=10.0,
                       help="spread the first steps of the nodes found at start over this long (default 10)")
    fleet.add_argument("--once", action="store_true",
                       help="step every served node once, then exit (for debugging and tests)")
    fleet.set_defaults(handler=lambda args: _run(args, open_backend))

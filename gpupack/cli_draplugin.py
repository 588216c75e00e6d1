"""``gpupack dra-plugin``: gpupack's DRA kubelet plugin (driver gpu.gpupack.io), and a kubelet stand-in to call it.

``gpupack dra-plugin serve --node NAME`` serves the kubelet's plugin APIs on two
unix sockets: registration in the kubelet's plugin watcher directory
(``--registration-dir``, default /var/lib/kubelet/plugins_registry, socket
``gpu.gpupack.io-reg.sock``) and the DRA v1 service in the driver's plugin
directory (``--plugin-dir``, default /var/lib/kubelet/plugins/gpu.gpupack.io,
socket ``dra.sock``). Preparing a claim creates the MIG instance it was
allocated, sets a GPU share's MPS limits, and writes a CDI spec into
``--cdi-dir`` (default /var/run/cdi); every step is journaled under
``--state-dir`` (default <plugin dir>/state), so a plugin killed mid-prepare
rolls back or finishes at its next start. Claims are read from the API server
(``--kubeconfig``, or in-cluster credentials); it needs ``get`` on
resourceclaims.resource.k8s.io. SIGTERM (or SIGINT) stops it cleanly: the
registration socket goes first, calls in flight finish, both sockets are removed.

It also streams the health of the devices it prepared to the kubelet
(``v1.DRAResourceHealth``, every ``--health-interval-seconds``): a fault the node
agent wrote into the node's GPUNode makes the device Unhealthy in the pod's status
(``get`` on gpunodes.gpupack.io).

Without GPUs: ``--simulate MODEL:COUNT --state-file F`` uses the SIMULATED NVML
backend, ``--claims-file F`` reads ResourceClaims from a JSON/YAML file
instead of the API server, and ``--gpunode-file F`` the GPUNode.

``gpupack dra-plugin call {info,prepare,unprepare,health}`` calls a running plugin the
way the kubelet does (there is no kubelet on a development machine) and prints
the answer as JSON; claims are given as NAMESPACE/NAME/UID.

Each ``serve`` setting also has an environment variable ``GPUPACK_DRA_<SETTING>``
(``GPUPACK_DRA_NODE_NAME``, ``GPUPACK_DRA_CDI_DIR``, ...; each option's help names
its own); flags win.
Exit codes: 0 = ok (a call answered; per-claim errors are in its JSON),
1 = the plugin could not start or a call failed, 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_BAD_INPUT, EXIT_NO, EXIT_OK, UsageError, non_negative_float, positive_float
from node.draplugin.claims import ClaimRef, ClaimSource
from node.draplugin.settings import PLUGIN_SOCKET, REGISTRATION_SOCKET, SHARE_MODES, PluginSettings
from node.nvml.errors import NvmlError
from node.nvml.protocol import NvmlBackend

DEFAULTS = PluginSettings()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dra-plugin", help="DRA kubelet plugin (gpu.gpupack.io): serve, or call one as the kubelet would",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="dra_plugin_command", metavar="SUBCOMMAND", parser_class=type(parser))

    serve = sub.add_parser(
        "serve", help="serve the registration and DRA sockets until SIGTERM",
        description="Serve gpupack's DRA kubelet plugin. Each option but --kubeconfig, --log-level and "
                    "--simulate-pause-after-create also reads the environment variable named in its help; "
                    "flags win.")

    def option(flag: str, field: str, text: str, **kwargs: Any) -> None:
        serve.add_argument(flag, help=f"{text}; env GPUPACK_DRA_{field.upper()}", **kwargs)

    option("--node", "node_name", "the Node this plugin serves (required; from the downward API): gpupack's pool "
                                  "is named after it")
    option("--plugin-dir", "plugin_dir", f"directory of the DRA socket ({PLUGIN_SOCKET}), the endpoint the "
                                         f"registration names (default {DEFAULTS.plugin_dir})")
    option("--registration-dir", "registration_dir", "the kubelet's plugin watcher directory, where the "
           f"registration socket ({REGISTRATION_SOCKET}) goes (default {DEFAULTS.registration_dir})")
    option("--cdi-dir", "cdi_dir", f"where CDI specs are written (default {DEFAULTS.cdi_dir}, the container "
                                   "runtimes' transient CDI directory)")
    option("--state-dir", "state_dir", "the claim journal; must survive restarts (default <plugin dir>/state)")
    option("--share-mode", "share_mode", "how shared GPUs are shared: mps sets each claim's MPS limits, "
                                         "time-slicing none (default mps)", choices=SHARE_MODES)
    option("--mps-pipe-dir", "mps_pipe_directory", "the MPS control daemon's pipe directory, passed to clients "
                                                   "and bind-mounted (default: not set)")
    option("--run-mps-daemon", "run_mps_daemon", "run the MPS control daemon for the node's MIG-off GPUs (with "
           "--share-mode mps and --mps-pipe-dir), restart it if it goes, quit it on stop (default: off, something "
           "else runs it)", action="store_const", const=True, default=None)
    option("--mps-control-binary", "mps_control_binary",
           f"the MPS control daemon's program (default {DEFAULTS.mps_control_binary})")
    serve.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster credentials, then $KUBECONFIG)")
    option("--claims-file", "claims_file", "SIMULATION/tests: read ResourceClaims from this JSON/YAML file "
                                           "instead of the API server")
    option("--simulate", "simulate", "use the SIMULATED NVML backend with COUNT GPUs of MODEL (e.g. H100-80GB:2)",
           metavar="MODEL:COUNT")
    option("--state-file", "state_file", "simulated backend: its JSON state file (survives restarts)")
    option("--simulate-delay-seconds", "simulate_delay_seconds",
           "simulated backend: seconds each GPU-instance create/destroy takes (default 0)", type=non_negative_float)
    serve.add_argument("--simulate-pause-after-create", type=non_negative_float, default=0.0, metavar="SECONDS",
                       help="simulated backend, kill tests: after an instance is created, wait this long before "
                            "the plugin hears of it (default 0)")
    option("--health-interval-seconds", "health_interval_seconds",
           "how often the device health stream the kubelet watches is sent again (faults read from the node's "
           "GPUNode, which the agent writes; default 30; 0 = offer no health service)", type=non_negative_float)
    option("--health-stale-seconds", "health_stale_seconds",
           "report devices Unknown when the GPUNode's heartbeat is older than this (default 180)",
           type=positive_float)
    option("--gpunode-file", "gpunode_file", "SIMULATION/tests: read the node's GPUNode (its faults) from this "
                                             "JSON/YAML file instead of the API server")
    option("--shutdown-grace-seconds", "shutdown_grace_seconds",
           "on SIGTERM, how long calls in flight may take (default 10)", type=non_negative_float)
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=_serve)

    call = sub.add_parser("call", help="call a running plugin as the kubelet would; prints JSON")
    actions = call.add_subparsers(dest="call_action", metavar="ACTION", parser_class=type(parser))
    info = actions.add_parser("info", help="GetInfo on the registration socket")
    info.add_argument("--socket", default=str(DEFAULTS.registration_socket),
                      help=f"registration socket (default {DEFAULTS.registration_socket})")
    info.set_defaults(handler=_call)
    for action in ("prepare", "unprepare"):
        one = actions.add_parser(action, help=f"Node{action.capitalize()}Resources for the claims given")
        one.add_argument("claims", nargs="+", metavar="NAMESPACE/NAME/UID", help="claims, as the kubelet names them")
        one.add_argument("--socket", default=str(DEFAULTS.plugin_socket),
                         help=f"DRA socket (default {DEFAULTS.plugin_socket})")
        one.add_argument("--timeout", type=positive_float, default=45.0, help="seconds (default 45, the kubelet's)")
        one.set_defaults(handler=_call)
    health = actions.add_parser("health", help="NodeWatchResources on the DRA socket: print the first messages of "
                                               "the device health stream, one JSON list per line")
    health.add_argument("--socket", default=str(DEFAULTS.plugin_socket),
                        help=f"DRA socket (default {DEFAULTS.plugin_socket})")
    health.add_argument("--messages", type=int, default=1, help="how many messages to wait for (default 1)")
    health.add_argument("--timeout", type=positive_float, default=120.0,
                        help="seconds for the whole watch (default 120)")
    health.set_defaults(handler=_call)
    call.set_defaults(handler=lambda _args: (call.print_help(), EXIT_BAD_INPUT)[1])
    parser.set_defaults(handler=lambda _args: (parser.print_help(), EXIT_BAD_INPUT)[1])


# ---------------------------------------------------------------------- serve
def _settings(args: argparse.Namespace) -> PluginSettings:
    overrides: dict[str, Any] = {
        "node_name": args.node, "plugin_dir": args.plugin_dir, "registration_dir": args.registration_dir,
        "cdi_dir": args.cdi_dir, "state_dir": args.state_dir, "share_mode": args.share_mode,
        "mps_pipe_directory": args.mps_pipe_dir, "claims_file": args.claims_file, "simulate": args.simulate,
        "state_file": args.state_file, "simulate_delay_seconds": args.simulate_delay_seconds,
        "shutdown_grace_seconds": args.shutdown_grace_seconds, "run_mps_daemon": args.run_mps_daemon,
        "mps_control_binary": args.mps_control_binary, "health_interval_seconds": args.health_interval_seconds,
        "health_stale_seconds": args.health_stale_seconds, "gpunode_file": args.gpunode_file,
    }
    try:
        settings = PluginSettings.from_env(**overrides)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    if not settings.node_name:
        raise UsageError("--node (or GPUPACK_DRA_NODE_NAME) is required: the plugin serves one node's pool")
    if (settings.simulate_delay_seconds or args.simulate_pause_after_create) and not settings.simulate:
        raise UsageError("--simulate-delay-seconds and --simulate-pause-after-create are for the simulated backend "
                         "(use them with --simulate)")
    return settings


def _simulated_backend(settings: PluginSettings, pause_after_create_s: float) -> NvmlBackend:
    from mig.catalog import get_model
    from mig.errors import MigError
    from node.nvml.simulated import SimulatedNvml

    model_name, sep, count_text = settings.simulate.rpartition(":")
    if not sep or not model_name or not count_text.isdigit() or not 1 <= int(count_text) <= 16:
        raise UsageError(f"--simulate wants MODEL:COUNT with COUNT 1..16 (e.g. H100-80GB:2), got {settings.simulate!r}")
    try:
        model = get_model(model_name)
    except MigError as exc:
        raise UsageError(str(exc)) from None
    delay = settings.simulate_delay_seconds
    try:
        backend = SimulatedNvml(model, int(count_text), settings.state_file or None, seed=settings.node_name,
                                delays={"create": delay, "destroy": delay} if delay > 0 else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if pause_after_create_s > 0:
        pause = threading.Event()

        def hook(operation: str, _gpu: int, when: str) -> None:
            if operation == "create" and when == "after":
                pause.wait(pause_after_create_s)

        backend.hook = hook
    return backend


def _claim_source(settings: PluginSettings, kubeconfig: str | None) -> ClaimSource:
    if settings.claims_file:
        from node.draplugin.file_claims import FileClaimSource

        return FileClaimSource(Path(settings.claims_file))
    from kube.client import KubeConfigError
    from node.draplugin.kube_claims import KubeClaimSource

    try:
        return KubeClaimSource.connect(kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(f"{exc} (or give --claims-file for a node without an API server)") from None


def _health_service(settings: PluginSettings, kubeconfig: str | None, preparer: Any) -> Any:
    """The device health stream (``node.draplugin.service.HealthService``), or None when it is off."""
    from datetime import datetime, timezone

    from node.draplugin.gpunode_source import FileGpuNodeSource, GpuNodeSource, look
    from node.draplugin.service import HealthService

    if settings.health_interval_seconds == 0:
        return None
    source: GpuNodeSource
    if settings.gpunode_file:
        source = FileGpuNodeSource(Path(settings.gpunode_file))
    elif settings.claims_file:
        logging.getLogger("gpupack.dra-plugin").warning(
            "no device health service: claims come from a file, so there is no API server to read the "
            "GPUNode from (give --gpunode-file)")
        return None
    else:
        from kube.client import KubeConfigError
        from node.draplugin.gpunode_source import KubeGpuNodeSource

        try:
            source = KubeGpuNodeSource.connect(kubeconfig)
        except KubeConfigError as exc:
            raise UsageError(str(exc)) from None

    def view() -> Any:
        return look(source, settings.node_name, datetime.now(timezone.utc), settings.health_stale_seconds)

    return HealthService(preparer, view, settings.health_interval_seconds)


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from node.draplugin.server import StateDirBusy, lock_state_dir

    try:
        lock = lock_state_dir(settings.state_path)
    except StateDirBusy as exc:
        print(f"gpupack: {exc}", file=sys.stderr)
        return EXIT_NO
    try:
        return _serve_locked(settings, args)
    finally:
        os.close(lock)


def _serve_locked(settings: PluginSettings, args: argparse.Namespace) -> int:
    from node.draplugin.journal import ClaimJournal
    from node.draplugin.mps_daemon import MpsDaemonError
    from node.draplugin.nvml_lock import NvmlChangeLock, lock_path
    from node.draplugin.prepare import ClaimPreparer
    from node.draplugin.server import PluginServer, serve_until

    claims = _claim_source(settings, args.kubeconfig)
    backend: NvmlBackend
    if settings.simulate:
        backend = _simulated_backend(settings, args.simulate_pause_after_create)
    else:
        from node.nvml.real import RealNvml

        try:
            backend = RealNvml.open()
        except NvmlError as exc:
            print(f"gpupack: NVML could not be opened: {exc}", file=sys.stderr)
            return EXIT_NO
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        preparer = ClaimPreparer(backend, claims, ClaimJournal(settings.claims_dir), node=settings.node_name,
                                 cdi_dir=Path(settings.cdi_dir).absolute(), share_mode=settings.share_mode,
                                 mps_pipe_directory=settings.mps_pipe_directory,
                                 change_lock=NvmlChangeLock(lock_path(settings.claims_dir)))
        preparer.recover()  # what it cannot finish is logged, and retried when the kubelet calls for that claim
        try:
            daemon = _start_mps_daemon(settings, backend, stop)
        except MpsDaemonError as exc:
            print(f"gpupack: the MPS control daemon did not start, so shares would not be limited: {exc}",
                  file=sys.stderr)
            return EXIT_NO
        try:
            health = _health_service(settings, args.kubeconfig, preparer)
            unfinished = serve_until(PluginServer(preparer, settings.plugin_socket, settings.registration_socket,
                                                  health), stop, settings.shutdown_grace_seconds)
        finally:
            if daemon is not None:
                daemon.stop()
        if unfinished:
            # Their threads sit in NVML and cannot be interrupted; waiting for them would keep a stopped
            # plugin alive. The journal rolls back what they began when the plugin starts again.
            logging.getLogger("gpupack.dra-plugin").warning(
                "%d call(s) still running after %.0f s of grace; exiting without them", unfinished,
                settings.shutdown_grace_seconds)
            logging.shutdown()
            os._exit(EXIT_OK)
    finally:
        backend.close()
    return EXIT_OK


def _start_mps_daemon(settings: PluginSettings, backend: NvmlBackend, stop: threading.Event) -> Any:
    """The node's MPS control daemon, started and watched, with ``--run-mps-daemon``; None otherwise.
    Raises ``MpsDaemonError`` when it does not start (shares would not be limited)."""
    if not settings.run_mps_daemon:
        return None
    from node.draplugin.mps_daemon import MpsDaemon, watch

    uuids = [info.uuid for info in (backend.device_info(i) for i in range(backend.device_count()))
             if not info.mig_enabled]
    daemon = MpsDaemon(Path(settings.mps_pipe_directory), settings.mps_log_path, uuids,
                       binary=settings.mps_control_binary)
    daemon.start()  # MpsDaemonError: the caller says so and stops
    watch(daemon, stop)
    return daemon


# ---------------------------------------------------------------------- call
def _claim_ref(text: str) -> ClaimRef:
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"claim {text!r}: expected NAMESPACE/NAME/UID")
    return ClaimRef(uid=parts[2], namespace=parts[0], name=parts[1])


def _call(args: argparse.Namespace) -> int:
    import grpc  # type: ignore[import-untyped]

    from node.draplugin.client import KubeletClient, health_answer_json, prepare_answer_json, unprepare_answer_json

    out: dict[str, Any]
    try:
        if args.call_action == "health":
            if args.messages < 1:
                raise UsageError(f"--messages must be at least 1, got {args.messages}")
            with KubeletClient(Path(args.socket), timeout_s=args.timeout) as client:
                for message in client.watch_health(args.messages):
                    print(json.dumps(health_answer_json(message), sort_keys=True), flush=True)
            return EXIT_OK
        if args.call_action == "info":
            with KubeletClient(Path(args.socket), timeout_s=10.0) as client:
                info = client.info()
            out = {"type": info.type, "name": info.name, "endpoint": info.endpoint,
                   "supportedVersions": list(info.supported_versions)}
        else:
            refs = [_claim_ref(text) for text in args.claims]
            with KubeletClient(Path(args.socket), timeout_s=args.timeout) as client:
                if args.call_action == "prepare":
                    out = prepare_answer_json(client.prepare(refs))
                else:
                    out = unprepare_answer_json(client.unprepare(refs))
    except grpc.RpcError as exc:
        print(f"gpupack: the plugin at {args.socket} did not answer: {exc.code().name}: {exc.details()}",
              file=sys.stderr)
        return EXIT_NO
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpupack.cli_draplugin ...``: this command group on its own (as ``gpupack dra-plugin ...``)."""
    parser = argparse.ArgumentParser(prog="gpupack")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(["dra-plugin", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.handler(args)
    except UsageError as exc:
        print(f"gpupack: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"gpupack: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return code


if __name__ == "__main__":
    sys.exit(main())

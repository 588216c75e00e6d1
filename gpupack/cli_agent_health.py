"""``gpupack agent fault ...`` and ``gpupack agent health ...``: GPU faults by hand.

``gpupack agent fault --state-file FILE KIND ...`` injects a fault into a
SIMULATED node while its agent runs (the agent picks it up at its next tick,
within ``--poll-seconds``): ``xid`` (on a GPU, or on one MIG instance with
``--instance GI``), ``ecc`` (an uncorrected ECC burst), ``remap`` (a row
remapping pending, or ``--failed``), ``lose`` (the GPU falls off the bus),
``reset`` (a GPU reset: refused while processes run or the GPU is lost),
``reboot`` (the node reboots) and ``repair`` (the GPU was replaced). The
semantics are the real driver's (``node.nvml.simulated``).

``gpupack agent health ack --node NODE --gpu N`` acknowledges every fault of
GPU N of NODE that began until now (``--all`` for every GPU): the agent ends
them at its next tick. Use it after replacing a GPU, after a reset the agent
cannot see, or for a fault you judge harmless. ``gpupack agent health show
--node NODE`` prints the node's faults.

``gpupack agent health check-xid-table FILE`` checks an XID override table
(the ``xids.yaml`` key of the ``gpupack-xid-table`` ConfigMap) and prints the
table in force with it.

Exit codes: 0 = done, 1 = the cluster refused, 2 = bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError
from kube.inputfile import InputFileError, read_text

FAULT_KINDS = ("xid", "ecc", "remap", "lose", "reset", "reboot", "repair")


def _state(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(read_text(path, syntax="json"))
    except InputFileError as exc:
        raise UsageError(f"--state-file {exc}") from None
    except FileNotFoundError:
        raise UsageError(f"--state-file {path}: no such file (it exists once the simulated node's agent has run)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--state-file {path}: not a simulated NVML state file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("simulation") is not True or not isinstance(doc.get("gpus"), list):
        raise UsageError(f"--state-file {path}: not a simulated NVML state file (no 'simulation': true and 'gpus')")
    return doc


def _fault(args: argparse.Namespace) -> int:
    from node.nvml.simulated import post_to_inbox

    doc = _state(args.state_file)
    gpus = doc["gpus"]
    entry: dict[str, Any] = {"op": args.kind}
    if args.kind != "reboot":
        if args.gpu is None:
            raise UsageError(f"fault {args.kind} needs --gpu INDEX")
        if not 0 <= args.gpu < len(gpus):
            raise UsageError(f"--gpu {args.gpu}: the simulated node has GPUs 0..{len(gpus) - 1}")
        entry["gpu"] = args.gpu
    if args.kind == "xid":
        if args.xid is None:
            raise UsageError("fault xid needs --xid CODE (e.g. 79: fallen off the bus, 48: double-bit ECC)")
        if not 0 < args.xid <= 65535:
            raise UsageError(f"--xid {args.xid}: an XID is 1..65535")
        entry["xid"] = args.xid
        if args.instance is not None:
            ids = [i.get("gi_id") for i in gpus[args.gpu].get("instances", [])]
            if args.instance not in ids:
                raise UsageError(f"--instance {args.instance}: GPU {args.gpu} has GPU instances "
                                 f"{', '.join(map(str, ids)) or '(none)'}")
            entry["gi"] = args.instance
    elif args.kind == "ecc":
        if args.count < 1:
            raise UsageError(f"--count {args.count}: at least 1")
        entry.update(count=args.count, retire=not args.no_retire)
    elif args.kind == "remap":
        entry["failed"] = args.failed
    post_to_inbox(args.state_file, entry)
    print(f"posted {json.dumps(entry, sort_keys=True)} for the simulated node of {args.state_file}; "
          "its agent applies it at its next tick")
    return EXIT_OK


def _kube(kubeconfig: str | None) -> Any:
    from node.base.kube import Kube, KubeConfigError

    try:
        return Kube.connect(kubeconfig)
    except KubeConfigError as exc:
        raise UsageError(str(exc)) from None


def _ack(args: argparse.Namespace) -> int:
    from kube.errors import KubeError
    from node.health.ack import acknowledge
    from sharing.api.keys import HEALTH_ACK_ANNOTATION

    if not args.all and not args.gpu:
        raise UsageError("say which GPUs: --gpu INDEX (repeatable) or --all")
    kube = _kube(args.kubeconfig)
    try:
        obj = kube.get_gpunode(args.node)
        if obj is None:
            raise UsageError(f"GPUNode {args.node!r} does not exist")
        gpus = [g.get("index") for g in ((obj.get("status") or {}).get("gpus") or []) if isinstance(g, dict)]
        indexes = [i for i in gpus if isinstance(i, int)] if args.all else list(args.gpu)
        unknown = sorted(set(indexes) - {i for i in gpus if isinstance(i, int)})
        if unknown:
            raise UsageError(f"GPUNode {args.node} has no GPU {', '.join(map(str, unknown))} "
                             f"(it reports {', '.join(map(str, gpus)) or 'none'})")
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        value = acknowledge(annotations, indexes, datetime.now(timezone.utc))
        kube.annotate_gpunode(args.node, {HEALTH_ACK_ANNOTATION: value})
    except KubeError as exc:
        print(f"gpupack: Kubernetes API error: {exc}", file=sys.stderr)
        return EXIT_NO
    print(f"acknowledged the faults of GPU(s) {', '.join(map(str, indexes))} on {args.node}; "
          "its agent ends them at its next tick")
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    from kube.errors import KubeError
    from sharing.api.gpunode import read_gpunode

    kube = _kube(args.kubeconfig)
    try:
        obj = kube.get_gpunode(args.node)
    except KubeError as exc:
        print(f"gpupack: Kubernetes API error: {exc}", file=sys.stderr)
        return EXIT_NO
    reading = read_gpunode(obj) if obj is not None else None
    if reading is None:
        raise UsageError(f"GPUNode {args.node!r} does not exist")
    rows: list[dict[str, Any]] = []
    for gpu in reading.gpus:
        for where, health in [(f"GPU {gpu.index}", gpu.health)] + [
                (f"GPU {gpu.index} instance {i.profile}@{i.start}", i.health) for i in gpu.instances]:
            if health is not None:
                rows.append({"device": where, **health.model_dump(mode="json", by_alias=True, exclude_none=True)})
    if args.json:
        json.dump({"node": reading.name, "degraded": reading.degraded, "faults": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    if not rows:
        print(f"{reading.name}: every GPU healthy")
        return EXIT_OK
    print(f"{reading.name}: {len(rows)} fault(s)" + (" (degraded: gpupack sends no new pods)" if reading.degraded else ""))
    for row in rows:
        print(f"  {row['device']}: {row['reason']} since {row['since']}, needs {row['recovery']}: {row['message']}")
    return EXIT_OK


def _check_table(args: argparse.Namespace) -> int:
    from node.health.xids import XidTableError, merged, parse_overrides

    text = read_text(args.file, syntax="yaml")  # unreadable or unbounded: gpupack.cli.main says so in one line
    try:
        overrides = parse_overrides(text)
    except XidTableError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    for xid, rule in sorted(merged(overrides).items()):
        mark = "*" if xid in overrides else " "
        print(f"{mark} {xid:>5}  {rule.action:<11}  {rule.recovery:<11}  {rule.description}")
    print(f"{len(overrides)} override(s) (*); any other XID: unhealthy until reset, reported as UnknownXid")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fault = sub.add_parser("fault", help="SIMULATION: inject a GPU fault into a simulated node while its agent runs",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fault.add_argument("--state-file", required=True, help="the simulated node's state file (its agent's --state-file)")
    fault.add_argument("kind", choices=FAULT_KINDS, help="what happens")
    fault.add_argument("--gpu", type=int, default=None, help="GPU index (every kind but reboot)")
    fault.add_argument("--xid", type=int, default=None, help="xid: the XID code")
    fault.add_argument("--instance", type=int, default=None, help="xid: the MIG GPU-instance id it happens on")
    fault.add_argument("--count", type=int, default=1, help="ecc: uncorrected errors (default 1)")
    fault.add_argument("--no-retire", action="store_true", help="ecc: no page waits for retirement")
    fault.add_argument("--failed", action="store_true", help="remap: the remapping failed (the GPU needs replacing)")
    fault.set_defaults(handler=_fault)

    health = sub.add_parser("health", help="GPU faults: show them, acknowledge them, check an XID table",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    hsub = health.add_subparsers(dest="health_command", metavar="SUBCOMMAND", parser_class=type(health))
    ack = hsub.add_parser("ack", help="acknowledge a node's GPU faults (they end at the agent's next tick)")
    ack.add_argument("--node", required=True, help="the node (and GPUNode) name")
    ack.add_argument("--gpu", type=int, action="append", default=[], help="GPU index (repeatable)")
    ack.add_argument("--all", action="store_true", help="every GPU of the node")
    ack.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    ack.set_defaults(handler=_ack)
    show = hsub.add_parser("show", help="print a node's GPU faults")
    show.add_argument("--node", required=True, help="the node (and GPUNode) name")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    show.set_defaults(handler=_show)
    check = hsub.add_parser("check-xid-table", help="check an XID override table and print the table in force")
    check.add_argument("file", help="YAML file: the xids.yaml key of the gpupack-xid-table ConfigMap (a regular file of at most 16 MiB; GPUPACK_MAX_INPUT_BYTES raises that)")
    check.set_defaults(handler=_check_table)
    health.set_defaults(handler=lambda _args: (health.print_help(), 2)[1])

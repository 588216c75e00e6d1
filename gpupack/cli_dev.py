"""``gpupack dev``: developer tooling; ``gpupack dev cluster up|down|status`` runs a local control plane.

``up`` builds the binaries the first time (progress on stderr), starts etcd,
kube-apiserver and kube-scheduler (and kube-controller-manager with
``--controller-manager``; and kwok with ``--kwok``, which implies
``--controller-manager``; and Kueue with ``--kueue``) in the background, applies
gpupack's namespace, CRDs and RBAC (unless ``--bare``), and prints ``KUBECONFIG=<path>`` as its last
line, so ``eval "$(gpupack dev cluster up | tail -1)"`` works. Without the two
options nothing more is built or started than before they existed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError
from gpupack.devcluster import state as cluster_state
from gpupack.devcluster.errors import DevClusterError


def register(subparsers: Any) -> None:
    dev = subparsers.add_parser("dev", help="developer tooling: a local Kubernetes control plane")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="SUBCOMMAND")
    cluster = dev_sub.add_parser(
        "cluster", help="run etcd + kube-apiserver + kube-scheduler (+ kube-controller-manager, kwok) on loopback"
    )
    cluster_sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")

    up = cluster_sub.add_parser("up", help="start in the background; print KUBECONFIG=<path> last")
    up.add_argument("--port", type=int, default=None,
                    help="kube-apiserver port on 127.0.0.1 (default: a free one)")
    up.add_argument("--bare", action="store_true",
                    help="do not apply gpupack's namespace, CRDs and RBAC")
    up.add_argument("--controller-manager", action="store_true",
                    help="also run kube-controller-manager with the controllers for ReplicaSets, "
                         "Deployments, PodDisruptionBudgets, garbage collection, namespace deletion, "
                         "ServiceAccounts and ResourceClaims (never node-lifecycle: the nodes have no "
                         "kubelet); built the first time it is asked for (a few minutes); off by default")
    up.add_argument("--kwok", action="store_true",
                    help="also run kwok, the kubelet of fake Nodes annotated kwok.x-k8s.io/node=fake "
                         "(gpupack.devcluster.kwok.create_nodes makes them): they turn Ready and keep a "
                         "Lease, pods bound to them run, and end Succeeded after the seconds in their "
                         "gpupack.io/duration-seconds annotation (docs/kwok.md); implies "
                         "--controller-manager; built the first time (3 to 5 minutes on 2 cores); off by default")
    up.add_argument("--kueue", action="store_true",
                    help="also run Kueue (sigs.k8s.io/kueue, tools/kueue/build.sh) out of cluster: its CRDs, "
                         "its manager with the pod integration (pods labelled kueue.x-k8s.io/queue-name wait "
                         "at its admission gate until their ClusterQueue admits them; docs/priority.md), and "
                         "its webhooks; built the first time (about 8 minutes on 2 cores); off by default")
    up.add_argument("--kueue-replicas", type=int, default=4, metavar="R",
                    help="with --kueue: count one nvidia.com/gpu.shared replica as 1000/R gpupack.io/gpu-milli "
                         "in Kueue's quotas (the replica count the cluster's SharingPolicies split GPUs into; "
                         "default 4)")
    up.set_defaults(handler=cmd_up)

    down = cluster_sub.add_parser("down", help="stop it and delete its data")
    down.set_defaults(handler=cmd_down)

    status = cluster_sub.add_parser("status", help="say what runs (exit 0 running, 1 not)")
    status.set_defaults(handler=cmd_status)


def cmd_up(args: argparse.Namespace) -> int:
    from gpupack.devcluster.apply import apply_objects, gpupack_manifests
    from gpupack.devcluster.binaries import CONTROLLER_MANAGER, KWOK, ensure_binaries, ensure_kueue
    from gpupack.devcluster.kueue import NAME as KUEUE
    from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig

    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a TCP port is 1..65535")
    if not 1 <= args.kueue_replicas <= 8:
        raise UsageError(f"--kueue-replicas {args.kueue_replicas}: a GPU is shared into 1..8 replicas")
    controller_manager = args.controller_manager or args.kwok  # kwok's fleets want ReplicaSets, GC, ...
    directory, existing = _recorded_cluster()
    if existing is not None:
        if all(cluster_state.alive(c) for c in existing.components):
            print(f"already running: {existing.server} (stop it with `gpupack dev cluster down`)")
            running = {c.name for c in existing.components}
            for wanted, name in ((controller_manager, CONTROLLER_MANAGER), (args.kwok, KWOK), (args.kueue, KUEUE)):
                if wanted and name not in running:
                    print(f"note: it runs without {name}; `gpupack dev cluster down` first "
                          "to start one with it", file=sys.stderr)
            print(f"KUBECONFIG={existing.kubeconfig}")
            return EXIT_OK
        print("found a partly stopped cluster; cleaning it up", file=sys.stderr)
        cluster_state.stop_components(existing)
        cluster_state.remove(existing, directory)

    began = time.monotonic()
    # A failed earlier `up` may have left data behind; never start on stale etcd data.
    shutil.rmtree(directory / "cluster", ignore_errors=True)
    try:
        if args.kwok:
            binaries = ensure_binaries(progress=sys.stderr, controller_manager=True, kwok=True)
        else:  # exactly as before --kwok existed
            binaries = ensure_binaries(progress=sys.stderr, controller_manager=controller_manager)
        names = ["etcd", "kube-apiserver", "kube-scheduler"]
        names += [CONTROLLER_MANAGER] if controller_manager else []
        names += [KWOK] if args.kwok else []
        kueue = ensure_kueue(progress=sys.stderr) if args.kueue else None
        names += [KUEUE] if kueue is not None else []
        print(f"starting {', '.join(names[:-1])} and {names[-1]} ...", file=sys.stderr)
        plane = ControlPlane(binaries, ControlPlaneConfig(
            workdir=directory / "cluster", keep_workdir=True, apiserver_port=args.port,
            controller_manager=controller_manager, kwok=args.kwok, tie_to_parent=False,
            kueue=kueue, kueue_replicas=args.kueue_replicas,
        ))
        plane.start()
    except DevClusterError as exc:
        print(f"gpupack: error: {exc}", file=sys.stderr)
        return EXIT_NO
    record = plane.detach()
    record.save(directory)
    if not args.bare:
        try:
            with plane.admin_client() as admin:
                applied = apply_objects(admin, gpupack_manifests())
        except Exception as exc:  # the cluster runs; say what failed and keep it
            print(f"gpupack: error: applying gpupack's manifests failed: {exc}", file=sys.stderr)
            print(f"KUBECONFIG={record.kubeconfig}")
            return EXIT_NO
        print(f"applied {len(applied)} objects (namespace, CRDs, RBAC)", file=sys.stderr)
    print(f"control plane ready in {time.monotonic() - began:.1f}s at {record.server}; "
          f"logs in {plane.log_dir}", file=sys.stderr)
    print(f"KUBECONFIG={record.kubeconfig}")
    return EXIT_OK


def _recorded_cluster() -> tuple[Path, cluster_state.DevClusterRecord | None]:
    """The state directory and the cluster recorded there; a corrupt record is bad input."""
    directory = cluster_state.state_dir()
    try:
        return directory, cluster_state.DevClusterRecord.load(directory)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def cmd_down(args: argparse.Namespace) -> int:
    directory, existing = _recorded_cluster()
    if existing is None:
        print("no local control plane is running")
        return EXIT_OK
    stopped = cluster_state.stop_components(existing)
    cluster_state.remove(existing, directory)
    print(f"stopped {', '.join(stopped) or 'nothing (already dead)'}; removed {existing.workdir}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from gpupack.devcluster.controlplane import apiserver_ready

    _, existing = _recorded_cluster()
    if existing is None:
        print("not running (start it with `gpupack dev cluster up`)")
        return EXIT_NO
    running = 0
    width = max([len("api server"), *(len(c.name) for c in existing.components)])
    for comp in existing.components:
        up = cluster_state.alive(comp)
        running += up
        print(f"{comp.name:{width}} {'running' if up else 'STOPPED':8} pid {comp.pid:<7} log {comp.log}")
    ready = apiserver_ready(existing.server, existing.workdir)
    print(f"{'api server':{width}} {'ready' if ready else 'NOT READY':8} {existing.server}")
    print(f"KUBECONFIG={existing.kubeconfig}")
    return EXIT_OK if running == len(existing.components) and ready else EXIT_NO

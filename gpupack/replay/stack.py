"""The live stack a replay runs on: control plane with kwok, KWOK nodes, the agent fleet, webhook, controller.

Built from the public steps of ``gpupack demo``'s stack (``gpupack.demo.stack.Stack``:
``create_namespace``, ``start_webhook``, ``start_process``, ``start_controller``;
the control plane of ``gpupack.devcluster``, gpupack's manifests, the webhook
served over TLS and registered with the shipped configurations, the controller
as its own ServiceAccount), its webhook probe asking for an MPS share
(``probe_sharing="mps"``: the webhook refuses ``auto`` on a cluster with neither
MIG GPUs nor a shared node yet, every openb cluster at the start of a replay),
with three differences:

* the control plane runs **kwok** (``ControlPlaneConfig(kwok=True)``), and the
  nodes are KWOK Nodes made from the node list (``gpupack.replay.mapping``);
* the GPUs of every node are served by **one** ``gpupack agent fleet`` process
  (simulated NVML + emulated NVIDIA device plugin per node, as ``agent run
  --simulate --emulate-device-plugin`` gives one node), run with the admin
  kubeconfig as docs/agent-fleet.md says (it watches cluster-wide);
* the controller runs with a 0.5 s resync and 0.1 s batching.

One SharingPolicy selects the replay's nodes: any replica count 1..8 (the
device plugin's), every node may change at once (``maxConcurrent`` = nodes),
no idle time before a change (``idleSeconds: 0``: in the protocol a node is
switched the moment a pod needs it, and nothing ever leaves a node idle
again), no window.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupack.demo.stack import DEMO_NAMESPACE, GROUP, VERSION, Stack
from gpupack.devcluster.apply import apply_objects, gpupack_manifests
from gpupack.devcluster.binaries import ensure_binaries
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.kwok import wait_ready
from gpupack.replay.mapping import REPLAY_LABEL, kube_node_name, replay_node
from gpupack.replay.priority import priority_classes as openb_priority_classes
from sharing.api.keys import PRODUCT_LABEL, WHOLE_RESOURCE
from sharing.packing.specs import NodeSpec

NAMESPACE = DEMO_NAMESPACE
"""Where the replay's pods go: the demo's namespace, which ``Stack`` creates with its default
ServiceAccount and probes the webhook in."""
POLICY_NAME = "openb-replay"
SETUP_SECONDS_PER_NODE = 0.5
"""Setup time allowed per node, on top of a minute, for the agents to report and advertise."""


def fleet_argv(kubeconfig: str, state_dir: Path) -> list[str]:
    """``gpupack agent fleet`` for the replay's nodes: its nodes only, state files in the work dir, no
    start-up stagger."""
    return ["agent", "fleet", "--kubeconfig", kubeconfig, "--selector", f"{REPLAY_LABEL}=on",
            "--state-dir", str(state_dir), "--stagger-seconds", "0"]


def policy_object(nodes: int, name: str = POLICY_NAME, right_sizing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The SharingPolicy selecting the replay's nodes (module docstring); with ``right_sizing``, its
    ``rightSizing`` section (a usage replay's)."""
    spec: dict[str, Any] = {
        "nodeSelector": {"matchLabels": {REPLAY_LABEL: "on"}},
        "reshaping": {"maxConcurrent": max(1, nodes), "idleSeconds": 0},
        "replicas": {"min": 1, "max": 8},
    }
    if right_sizing is not None:
        spec["rightSizing"] = right_sizing
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": name}, "spec": spec}


def node_advertised(node: dict[str, Any], gpus: int) -> bool:
    """The Node offers ``gpus`` whole GPUs and carries the product label: its agent serves it."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return PRODUCT_LABEL in labels and str(allocatable.get(WHOLE_RESOURCE, "0")) == str(gpus)


@dataclass
class ReplayStack:
    """Start with :meth:`start`, stop with :meth:`stop`."""

    workdir: Path
    nodes: Sequence[NodeSpec]
    policy: str = "gpupack"
    keep: bool = False
    keep_logs: bool = False
    """Keep the control plane's work dir (its components' logs) after :meth:`stop`."""
    stack: Stack = field(init=False)
    agents: str = "fleet"
    """What serves the nodes' GPUs: always ``fleet`` (one ``gpupack agent fleet`` process)."""
    setup_seconds: float = 0.0
    priority_classes: bool = False
    """Create openb's PriorityClasses (``gpupack replay --priority qos``; ``gpupack.replay.priority``)."""

    def __post_init__(self) -> None:
        self.stack = Stack(self.workdir, keep=self.keep, nodes=(), probe_sharing="mps")
        self.stack.controller_policy = self.policy

    @property
    def admin(self) -> Any:
        return self.stack.admin

    def processes(self) -> dict[str, list[int]]:
        """The pids of gpupack's components: ``controller``, ``webhook`` and ``agents``."""
        out: dict[str, list[int]] = {"controller": [], "webhook": [], "agents": []}
        for proc in self.stack.processes:
            if proc.pid is None:
                continue
            group = "controller" if proc.name == "controller" else "webhook" if proc.name == "webhook" else "agents"
            out[group].append(proc.pid)
        return out

    def start(self, say: Callable[[str], None]) -> None:
        began = time.monotonic()
        say("control plane: finding or building kube-apiserver, kube-scheduler, etcd, kwok (first run: minutes)")
        binaries = ensure_binaries(progress=sys.stderr, kwok=True)
        plane = ControlPlane(binaries, ControlPlaneConfig(workdir=self.workdir / "cluster", keep_workdir=self.keep or self.keep_logs,
                                                          tie_to_parent=not self.keep, kwok=True))
        self.stack.plane = plane
        plane.start()
        say(f"control plane: up in {plane.startup_seconds or 0:.1f}s at {plane.server}")
        self.stack.admin = plane.admin_client()
        apply_objects(self.stack.admin, gpupack_manifests(), field_manager="gpupack-replay")
        self.stack.create_namespace()
        if self.priority_classes:
            scheduling = client.SchedulingV1Api(self.admin)
            for manifest in openb_priority_classes():
                scheduling.create_priority_class(body=manifest)  # type: ignore[arg-type]  # a dict body is sent as is
            say(f"priority classes: {', '.join(m['metadata']['name'] for m in openb_priority_classes())}")
        client.CustomObjectsApi(self.admin).create_cluster_custom_object(
            GROUP, VERSION, "sharingpolicies", policy_object(len(self.nodes)))
        core = client.CoreV1Api(self.admin)
        for number, node in enumerate(self.nodes):
            core.create_node(body=replay_node(node, number))  # type: ignore[arg-type]  # a dict body is sent as is
        names = [kube_node_name(n.name) for n in self.nodes]
        wait_ready(self.admin, names, timeout_s=60 + SETUP_SECONDS_PER_NODE * len(names))
        say(f"nodes: {len(names)} KWOK nodes Ready ({sum(n.gpu_count for n in self.nodes)} GPUs)")
        self._agents(say)
        self.stack.start_webhook()
        say("webhook: serving over TLS, registered with the API server")
        self.stack.start_controller("controller", "--resync-seconds", "0.5", "--batch-seconds", "0.1")
        say("controller: running (leader-elected)")
        self._wait_advertised(say)
        self.setup_seconds = time.monotonic() - began

    def _agents(self, say: Callable[[str], None]) -> None:
        plane = self.stack.plane
        assert plane is not None
        state = self.workdir / "nvml"
        state.mkdir(parents=True, exist_ok=True)
        # The fleet watches Nodes, GPUNodes, bound pods, SharingPolicies and the XID table
        # cluster-wide, beyond one agent's RBAC: it runs as the admin (docs/agent-fleet.md).
        self.stack.start_process("fleet", fleet_argv(str(plane.kubeconfig), state))
        say("agents: one 'gpupack agent fleet' process serving every node")

    def _wait_advertised(self, say: Callable[[str], None]) -> None:
        """Until every GPU node's agent has reported its GPUs (GPUNode status) and advertised them on
        the Node as the device plugin would."""
        core = client.CoreV1Api(self.admin)
        custom = client.CustomObjectsApi(self.admin)
        want = {kube_node_name(n.name): n.gpu_count for n in self.nodes if n.gpu_count}
        deadline = time.monotonic() + 60 + SETUP_SECONDS_PER_NODE * len(want)
        while True:
            nodes = {n["metadata"]["name"]: n for n in
                     (self.admin.sanitize_for_serialization(o) for o in core.list_node(label_selector=f"{REPLAY_LABEL}=on").items)}
            listed: Any = custom.list_cluster_custom_object(GROUP, VERSION, "gpunodes")
            reported = {g["metadata"]["name"] for g in listed.get("items", [])
                        if len((g.get("status") or {}).get("gpus") or []) == want.get(g["metadata"]["name"], -1)}
            missing = [name for name, gpus in want.items()
                       if name not in reported or not node_advertised(nodes.get(name, {}), gpus)]
            if not missing:
                say(f"agents: all {len(want)} GPU nodes reported and advertised")
                return
            self._check_processes()
            if time.monotonic() > deadline:
                shown = ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
                raise RuntimeError(f"{len(missing)} GPU node(s) not served by an agent in time: {shown}; "
                                   f"logs in {self.workdir / 'logs'}")
            time.sleep(1.0)

    def _check_processes(self) -> None:
        for proc in self.stack.processes:
            if not proc.running():
                raise RuntimeError(f"{proc.name} exited; log: {proc.log_path}")

    def stop(self) -> None:
        self.stack.stop()

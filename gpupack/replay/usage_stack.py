"""The live stack a usage replay runs on: Deployments on KWOK nodes of one GPU, agents playing the trace.

Built from the public steps of ``gpupack demo``'s stack (``gpupack.demo.stack.Stack``:
``create_namespace``, ``start_webhook``, ``start_process``, ``start_controller``;
gpupack's manifests, the webhook served over TLS and registered with the shipped
configurations, the controller as its own ServiceAccount) as the openb replay's
(``gpupack.replay.stack``) is, with what a usage replay needs beside it:

* the control plane runs **kube-controller-manager** (Deployments and ReplicaSets make
  the pods, and a rollout replaces one) and **kwok** (the pods on the KWOK nodes run and
  become Ready, as a Deployment's rollout waits for);
* **one GPU per node** (``MODEL:1``, MIG off, its agent's ``gpupack.io/gpu-memory`` in full):
  a node's sharing mode is node-wide, so a node of one GPU is the finest the device-plugin
  backend can pack, the per-GPU decision the simulator models. The replay's figures read a
  pod's GPU as its node;
* **an agent per node** (``gpupack agent run --simulate MODEL:1 --emulate-device-plugin``, as
  ``gpupack demo`` runs them, with the admin kubeconfig as the openb replay's fleet), each
  playing the trace on **one timeline** (``--usage-trace-start``), binding each Deployment's
  pods to its trace pod (``--usage-trace-pods``, by workload: ``sharing.usage.playback``)
  and timing the use on the trace's clock (``--usage-trace-clock``); ``gpupack agent fleet``
  does not play traces;
* the controller's recommender on the same clock (``--usage-time-scale``,
  ``--usage-clock-start``) and its loop periods scaled (:func:`scaled_periods`);
* the namespace opted in (``gpupack.io/right-sizing``) and, for ``Recreate``, the grant
  ``manifests/right-sizing-recreate`` where the checkout has it.

One SharingPolicy selects the nodes, the openb replay's (``gpupack.replay.stack.policy_object``:
replica counts 1..8, every node may change at once, no idle time before a change), with the
eviction budget per wall hour that stands for the simulator's per trace hour (:func:`scaled_periods`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupack.demo.stack import DEMO_NAMESPACE, GROUP, REPO, VERSION, Stack
from gpupack.devcluster.apply import apply_objects, gpupack_manifests, load_manifests
from gpupack.devcluster.binaries import ensure_binaries
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.kwok import node_address, node_manifest, wait_ready
from gpupack.replay.stack import node_advertised, policy_object
from sharing.api.keys import BACKEND_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL, REPLAY_LABEL, RIGHT_SIZING_LABEL

NAMESPACE = DEMO_NAMESPACE
POLICY_NAME = "usage-replay"
RECREATE_GRANT = REPO / "manifests" / "right-sizing-recreate"
MODES = {"off": "Off", "initial": "Initial", "recreate": "Recreate"}
"""``--mode`` -> the namespace label's value."""
PUBLISH_S, RECOMMEND_S, EVICTIONS_PER_TRACE_HOUR = 300.0, 60.0, 1
"""The agents' publication and the controller's recommender intervals (trace seconds, their
defaults), and the updater's moves per workload per trace hour (the simulator's default)."""


@dataclass(frozen=True)
class Periods:
    """The wall-time settings a replay at ``time_scale`` passes so that they mean in trace time what
    their defaults mean on a real cluster."""

    publish_s: float
    recommend_s: float
    evictions_per_hour: int
    sample_s: float = 0.0
    """The agents' usage sample between ticks (``--usage-sample-seconds``): :data:`SAMPLE_S` trace
    seconds, so every trace step is seen as an agent at 1x sees it, though a tick (its API calls
    and the 0.5 s poll) outlasts a scaled step."""


SAMPLE_S = 15.0
"""Trace seconds between the agents' usage samples: a quarter of GenTD26's 57 s step. Before it, a
16-pod run at 90x under load saw 0.649 samples per trace step (benchmarks/usage_live.md)."""
MAX_EVICTIONS_PER_HOUR = 60
"""What ``rightSizing.maxEvictionsPerHour`` allows at most (``sharing.api.crd.RightSizingPolicy``)."""


def scaled_periods(time_scale: float) -> Periods:
    """Publication every 300 trace seconds, a recommender cycle every 60, and one move per workload per
    trace hour as ``maxEvictionsPerHour`` (a rolling wall hour: ``time_scale`` trace hours), at most
    the 60 the policy allows: above a scale of 60 the live budget is the smaller."""
    return Periods(PUBLISH_S / time_scale, RECOMMEND_S / time_scale,
                   min(MAX_EVICTIONS_PER_HOUR, max(1, round(EVICTIONS_PER_TRACE_HOUR * time_scale))),
                   SAMPLE_S / time_scale)


def node_name(number: int) -> str:
    return f"gpu-{number:03d}"


@dataclass
class UsageStack:
    """Start with :meth:`start`, stop with :meth:`stop`."""

    workdir: Path
    model: str
    nodes: int
    trace: Path
    mapping: Path
    """CSV ``pod,container_ip`` binding each Deployment (``namespace/NAME``) to its trace pod."""
    time_scale: float
    mode: str
    start_s: float = 0.0
    """Wall time of the trace's first step (set by :meth:`start`)."""
    lead_s: float = 0.0
    keep_logs: bool = False
    stack: Stack = field(init=False)
    setup_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.stack = Stack(self.workdir, nodes=(), probe_sharing="mps", controller_manager=True)

    @property
    def admin(self) -> Any:
        return self.stack.admin

    @property
    def node_names(self) -> list[str]:
        return [node_name(i) for i in range(self.nodes)]

    def start(self, say: Callable[[str], None]) -> None:
        """Everything up; the trace's first step plays at :attr:`start_s`, ``lead_s`` after the agents
        start (enough for the rest to come up: :meth:`wait_start` says so when it was not)."""
        began = time.monotonic()
        say("control plane: finding or building kube-apiserver, kube-scheduler, kube-controller-manager, etcd, kwok")
        binaries = ensure_binaries(progress=sys.stderr, kwok=True, controller_manager=True)
        plane = ControlPlane(binaries, ControlPlaneConfig(
            workdir=self.workdir / "cluster", keep_workdir=self.keep_logs, kwok=True, controller_manager=True))
        self.stack.plane = plane
        plane.start()
        say(f"control plane: up in {plane.startup_seconds or 0:.1f}s at {plane.server}")
        self.stack.admin = plane.admin_client()
        objects = gpupack_manifests()
        if self.mode == "recreate" and RECREATE_GRANT.is_dir():
            objects += load_manifests(RECREATE_GRANT)
        apply_objects(self.admin, objects, field_manager="gpupack-usage-replay")
        self.stack.create_namespace()
        client.CoreV1Api(self.admin).patch_namespace(
            NAMESPACE, {"metadata": {"labels": {RIGHT_SIZING_LABEL: MODES[self.mode]}}})
        periods = scaled_periods(self.time_scale)
        client.CustomObjectsApi(self.admin).create_cluster_custom_object(
            GROUP, VERSION, "sharingpolicies",
            policy_object(self.nodes, POLICY_NAME, {"maxEvictionsPerHour": periods.evictions_per_hour}))
        self._nodes(say)
        self.lead_s = 30.0 + 1.0 * self.nodes
        self.start_s = time.time() + self.lead_s
        self._agents(periods)
        say(f"agents: one 'gpupack agent run' per node, playing the trace from {self.lead_s:.0f}s from now")
        self.stack.start_webhook()
        say("webhook: serving over TLS, registered with the API server")
        self.stack.start_controller(
            "controller", "--resync-seconds", "0.5", "--batch-seconds", "0.1",
            "--recommend-seconds", f"{periods.recommend_s:g}", "--usage-time-scale", f"{self.time_scale:g}",
            "--usage-clock-start", f"{self.start_s:.3f}")
        say("controller: running (leader-elected), recommender on the trace's clock")
        self._wait_advertised(say)
        self.setup_seconds = time.monotonic() - began

    def _nodes(self, say: Callable[[str], None]) -> None:
        core = client.CoreV1Api(self.admin)
        for number, name in enumerate(self.node_names):
            body: Any = node_manifest(name, cpu="64", memory="512Gi", pods=110, address=node_address(number), labels={
                REPLAY_LABEL: "on", BACKEND_LABEL: "device-plugin", DEPLOY_DEVICE_PLUGIN_LABEL: "true"})
            core.create_node(body=body)
        wait_ready(self.admin, self.node_names, timeout_s=60 + 0.5 * self.nodes)
        say(f"nodes: {self.nodes} KWOK nodes of one {self.model} each, Ready")

    def _agents(self, periods: Periods) -> None:
        from mig.catalog import get_model
        from node.nvml.simulated import SimulatedNvml

        plane = self.stack.plane
        assert plane is not None
        for name in self.node_names:
            state = self.stack.state_file(name)
            # MIG off, as a node set up for sharing is: the pods share by MPS (the simulator's shares).
            SimulatedNvml(get_model(self.model), 1, state, seed=name, mig_enabled=False)
            self.stack.start_process(f"agent-{name}", [
                "agent", "run", "--node", name, "--simulate", f"{self.model}:1", "--state-file", str(state),
                "--emulate-device-plugin", "--usage-trace", str(self.trace), "--usage-trace-pods", str(self.mapping),
                "--usage-time-scale", f"{self.time_scale:g}", "--usage-trace-start", f"{self.start_s:.3f}",
                "--usage-trace-clock", "--usage-publish-seconds", f"{periods.publish_s:g}",
                "--usage-sample-seconds", f"{periods.sample_s:g}",
                "--poll-seconds", "0.5", "--idle-seconds", "1", "--metrics-port", "0",
                "--kubeconfig", str(plane.kubeconfig),
            ])

    def _wait_advertised(self, say: Callable[[str], None]) -> None:
        core = client.CoreV1Api(self.admin)
        deadline = time.monotonic() + 60 + 1.0 * self.nodes
        while True:
            nodes = {n["metadata"]["name"]: n for n in (self.admin.sanitize_for_serialization(o) for o in
                                                         core.list_node(label_selector=f"{REPLAY_LABEL}=on").items)}
            missing = [n for n in self.node_names if not node_advertised(nodes.get(n, {}), 1)]
            if not missing:
                say(f"agents: all {self.nodes} nodes advertised")
                return
            for proc in self.stack.processes:
                if not proc.running():
                    raise RuntimeError(f"{proc.name} exited; log: {proc.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(missing)} node(s) not advertised by their agent in time: "
                                   f"{', '.join(missing[:5])}; logs in {self.workdir / 'logs'}")
            time.sleep(1.0)

    def wait_start(self) -> None:
        """Until the trace's first step; RuntimeError when setup took longer than the lead."""
        late = time.time() - self.start_s
        if late > 0:
            raise RuntimeError(f"setup took {late:.0f}s longer than the {self.lead_s:.0f}s lead the agents were "
                               "given: the trace's first steps have played already")
        time.sleep(-late)

    def stop(self) -> None:
        self.stack.stop()


def required_nodes(lives: Sequence[tuple[int, int]], spare: int = 2) -> int:
    """GPUs for one per pod at the busiest step (``lives``: each pod's first and end step), plus
    ``spare`` for the replacements a move brings up before the pod it replaces goes."""
    events = sorted([(first, 1) for first, _ in lives] + [(end, -1) for _, end in lives])
    busiest = live = 0
    for _, change in events:
        live += change
        busiest = max(busiest, live)
    return busiest + spare

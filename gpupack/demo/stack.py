"""Starting (and stopping) everything the demo runs: control plane, agents, webhook, controller.

The control plane is the real one of :mod:`gpupack.devcluster` (built once,
cached). gpupack's own components run as the commands an operator would run
(``gpupack agent run``, ``gpupack webhook serve``, ``gpupack controller run``),
each as a subprocess acting as its own ServiceAccount, so the demo exercises the
RBAC the manifests grant. Node isolation is on: the node agent's admission
policies (manifests/agent/node-restriction-policy.yaml) are installed and each
agent's token is bound to a stand-in pod on its node, as a DaemonSet pod's is,
so no agent can write another node's objects. GPU nodes are Node objects without a kubelet; their
agents use the SIMULATED NVML backend and emulate the NVIDIA device plugin.

With ``backend="dra"`` the nodes form a DRA node pool (``gpupack.io/backend=dra``):
kube-controller-manager joins the control plane (it garbage-collects a finished
pod's ResourceClaim), gpupack's DeviceClasses are applied, and each agent runs
with ``--backend dra``, publishing its node's ResourceSlices instead of
advertising device-plugin resources. The H100 nodes' GPUs start with MIG on and
no instance (dynamic MIG: a claim's placement is the instance); the A100 node
shares its GPUs by MPS with exact per-claim shares.
"""

from __future__ import annotations

import base64
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupack.devcluster.apply import (
    apply_objects, gpupack_manifests, load_manifests, local_webhook_config, node_isolation_manifests,
)
from gpupack.devcluster.binaries import ensure_binaries
from gpupack.devcluster.components import SchedulerExtender
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.process import ManagedProcess, free_port
from gpupack.devcluster.state import Component, DevClusterRecord
from sharing.api.backend import DEFAULT_BACKEND, Backend
from sharing.api.keys import (
    BACKEND_LABEL, DEPLOY_DEVICE_PLUGIN_LABEL, HOSTNAME_LABEL, MILLI_RESOURCE, OWN_PREFIX, SCHEDULER_EXTENDER_PREFIX,
    SHARING_ANNOTATION,
)

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "gpupack.io", "v1alpha1"
DEMO_NAMESPACE = "gpupack-demo"
DEMO_LABEL = "gpupack.io/demo"


COMPONENT_TOKEN_SECONDS = 7 * 24 * 3600
"""Lifetime of the ServiceAccount tokens the stack's controller and webhook run with, and of each agent's
pod-bound one. They read their kubeconfig once and never renew the token, so it must outlive the run: a whole-cluster
``gpupack replay`` takes hours, and with the control plane's one-hour default its controller was
refused (401) an hour in and every pod after that timed out."""


@dataclass(frozen=True)
class DemoNode:
    name: str
    model: str
    gpus: int
    sharing: str = "none"
    replicas: int = 1

    @property
    def simulate(self) -> str:
        return f"{self.model}:{self.gpus}"


DEFAULT_NODES = (
    DemoNode("h100-a", "H100-80GB", 8),
    DemoNode("h100-b", "H100-80GB", 8),
    DemoNode("a100-a", "A100-80GB", 4, sharing="mps", replicas=4),
)


def probe_pod(sharing: str | None) -> dict[str, Any]:
    """The pod ``Stack._wait_mutating`` dry-runs: one container asking for a tenth of a GPU in
    ``gpupack.io/gpu-milli``, with ``sharing`` as its ``gpupack.io/sharing`` annotation (None: none)."""
    metadata: dict[str, Any] = {"name": "probe"}
    if sharing is not None:
        metadata["annotations"] = {SHARING_ANNOTATION: sharing}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [
        {"name": "c", "image": "example.com/app:1", "resources": {"limits": {MILLI_RESOURCE: "100"}}}]}}


def webhook_mutated(limits: Mapping[str, Any] | None) -> bool:
    """Whether the probe's limits, as the API server returned them, show the webhook's mutation: every
    mutation drops the ``gpupack.io/...`` resources (no node advertises them), whatever the sharing
    mode, so none is left (``MILLI_RESOURCE`` among them)."""
    return not any(k.startswith(OWN_PREFIX) for k in (limits or {}))


def _wait(what: str, check: Any, timeout_s: float, proc: ManagedProcess | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and not proc.running():
            raise RuntimeError(f"{proc.name} exited while waiting for {what}; log: {proc.log_path}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@dataclass
class Stack:
    workdir: Path
    keep: bool = False
    nodes: tuple[DemoNode, ...] = DEFAULT_NODES
    plane: ControlPlane | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    admin: Any = None
    webhook_configs: list[str] = field(default_factory=list)
    controller_metrics: bool = False
    """Serve the controller's /metrics on a loopback port (``controller_metrics_port`` once started)."""
    controller_metrics_port: int = 0
    backend: Backend = DEFAULT_BACKEND
    """Which backend the demo's nodes run: the device plugin's, or a DRA node pool."""
    controller_manager: bool = False
    """Also run kube-controller-manager (always on a DRA pool): owners' controllers re-create the pods
    gpupack deletes for them (``controller.planning.readmit``)."""
    kueue: Path | None = None
    """Also run Kueue's manager from this binary (``ControlPlaneConfig.kueue``): pods labelled
    ``kueue.x-k8s.io/queue-name`` then wait for their ClusterQueue's quota; None: no Kueue."""
    kueue_qps: int = 50
    """Kueue's API request rate (``ControlPlaneConfig.kueue_qps``; 50 as Kueue ships)."""
    controller_policy: str | None = None
    """The controller's ``--policy`` (None: its default)."""
    usage_trace: Path | None = None
    """A GenTD26 usage trace the agents' simulated GPU processes play (``--usage-trace``), one timeline for
    every node from the moment the agents start; None: the processes use nothing."""
    usage_time_scale: float = 60.0
    """Trace seconds played per second (the agents' ``--usage-time-scale``)."""
    agent_metrics_ports: dict[str, int] = field(default_factory=dict)
    """Node -> its agent's loopback metrics port, served while a usage trace plays (the per-pod use)."""
    agent_args: tuple[str, ...] = ()
    """More ``gpupack agent run`` options for every agent (the right-sizing demo's publication period)."""
    controller_args: tuple[str, ...] = ()
    """More ``gpupack controller run`` options (the right-sizing demo's recommender periods)."""
    probe_sharing: str | None = None
    """The ``gpupack.io/sharing`` annotation of the dry-run pod that ``_wait_mutating`` creates to see
    that the API server calls the mutating webhook; None asks nothing, i.e. ``auto``. An openb replay
    sets ``"mps"``: the webhook refuses ``auto`` on a cluster with neither MIG GPUs nor shared nodes
    (auto never gates on a kind of node that does not exist)."""

    # ------------------------------------------------------------ lifecycle
    def start(self, say: Any) -> None:
        say("control plane: finding or building kube-apiserver, kube-scheduler, etcd (first run: minutes)")
        dra = self.backend == "dra"
        binaries = ensure_binaries(progress=sys.stderr, controller_manager=dra or self.controller_manager)
        self.plane = ControlPlane(binaries, ControlPlaneConfig(
            workdir=self.workdir / "cluster", keep_workdir=self.keep, tie_to_parent=not self.keep,
            controller_manager=dra or self.controller_manager, kueue=self.kueue,
            kueue_qps=self.kueue_qps))
        self.plane.start()
        say(f"control plane: up in {self.plane.startup_seconds or 0:.1f}s at {self.plane.server}")
        self.admin = self.plane.admin_client()
        apply_objects(self.admin, gpupack_manifests(), field_manager="gpupack-demo")
        # Node isolation on, as installed: each agent is confined to its own node (item 8 of issue 33).
        apply_objects(self.admin, node_isolation_manifests(), field_manager="gpupack-demo")
        if dra:
            apply_objects(self.admin, load_manifests(REPO / "manifests" / "dra"), field_manager="gpupack-demo")
        self.create_namespace()
        self._policy()
        self._nodes()
        described = [f"{n.name} ({n.gpus} x {n.model}" + (f", {n.sharing} x{n.replicas})" if n.sharing != "none" else ")")
                     for n in self.nodes]
        say("nodes: " + ", ".join(described))
        trace_start = time.time()  # one timeline for every node
        for node in self.nodes:
            self._agent(node, trace_start)
        self.start_webhook()
        say("webhook: serving over TLS, registered with the API server")
        if self.controller_metrics:
            # Chosen now, after the control plane and the webhook hold their ports: a port chosen
            # earlier and released could be handed to one of them (etcd once failed to bind that way).
            self.controller_metrics_port = free_port()
        self.start_controller("controller", *(("--metrics-port", str(self.controller_metrics_port))
                                              if self.controller_metrics else ()), *self.controller_args)
        say("controller: running (leader-elected)")
        _wait("every GPUNode reported by its agent", self._all_reported, 60)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop(grace_s=5)
        self.processes.clear()
        if self.admin is not None:
            self.admin.close()
        if self.plane is not None:
            self.plane.stop()

    def detach(self) -> DevClusterRecord:
        """--keep: leave everything running; ``gpupack dev cluster down`` stops it all."""
        assert self.plane is not None
        record = self.plane.detach()
        extra = tuple(Component(p.name, p.pid or 0, str(p.argv[0]), str(p.log_path)) for p in self.processes)
        self.processes.clear()
        return DevClusterRecord(record.workdir, record.kubeconfig, record.server, record.ports,
                            record.components + extra, record.started_at, record.startup_seconds)

    # ------------------------------------------------------------ pieces
    def _sa_kubeconfig(self, name: str) -> str:
        assert self.plane is not None
        return str(self.plane.serviceaccount_kubeconfig(name, seconds=COMPONENT_TOKEN_SECONDS))

    def agent_kubeconfig(self, node: str) -> str:
        """The kubeconfig of ``node``'s agent: ServiceAccount ``gpupack-node-agent`` with a token bound to a
        stand-in pod on ``node`` (as the DaemonSet's pod token is), so the node-restriction policies the
        stack installs hold it to its own node; one per node, never shared."""
        assert self.plane is not None
        return str(self.plane.node_agent_kubeconfig(node, seconds=COMPONENT_TOKEN_SECONDS))

    def start_process(self, name: str, argv: list[str]) -> ManagedProcess:
        """``python -m gpupack ARGV`` as ``name``, logging to ``logs/NAME.log``; stopped by :meth:`stop`."""
        proc = ManagedProcess(name, [sys.executable, "-m", "gpupack", *argv], self.workdir / "logs" / f"{name}.log",
                              tie_to_parent=not self.keep)
        proc.start()
        self.processes.append(proc)
        return proc

    def create_namespace(self) -> None:
        """The demo's namespace (labelled ``gpupack.io/demo=on``) and its default ServiceAccount."""
        core = client.CoreV1Api(self.admin)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
            name=DEMO_NAMESPACE, labels={DEMO_LABEL: "on"})))
        try:
            core.create_namespaced_service_account(DEMO_NAMESPACE, client.V1ServiceAccount(
                metadata=client.V1ObjectMeta(name="default")))
        except client.ApiException as exc:
            if exc.status != 409:  # kube-controller-manager (DRA demo) makes every namespace's default one
                raise

    def _policy(self) -> None:
        client.CustomObjectsApi(self.admin).create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": "demo"},
            "spec": {
                "nodeSelector": {"matchLabels": {DEMO_LABEL: "on"}},
                # A demo runs minutes, not hours: reshape GPUs idle for 2 s, four at a time.
                "reshaping": {"maxConcurrent": 4, "idleSeconds": 2},
                # A node split for MPS gets 2..4 replicas (sharing.rules.replicas).
                "replicas": {"min": 2, "max": 4},
            },
        })

    def _nodes(self) -> None:
        core = client.CoreV1Api(self.admin)
        custom = client.CustomObjectsApi(self.admin)
        for node in self.nodes:
            # A DRA pool runs no NVIDIA device plugin: a GPU is owned by one backend, never both.
            labels = {HOSTNAME_LABEL: node.name, DEMO_LABEL: "on", BACKEND_LABEL: self.backend,
                      DEPLOY_DEVICE_PLUGIN_LABEL: "false" if self.backend == "dra" else "true"}
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node.name, labels=labels)))
            res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
            core.patch_node_status(node.name, {"status": {"capacity": res, "allocatable": res, "conditions": [
                {"type": "Ready", "status": "True", "reason": "GpupackDemo", "message": "simulated node, no kubelet"}]}})
            spec: dict[str, Any] = {"sharing": {"mode": node.sharing, "replicas": node.replicas}}
            if node.sharing != "none":
                spec["gpus"] = [{"index": i, "migEnabled": False} for i in range(node.gpus)]
            custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": {"name": node.name}, "spec": spec})

    def _agent(self, node: DemoNode, trace_start: float) -> ManagedProcess:
        state = self.state_file(node.name)
        if not state.exists() and (node.sharing != "none" or self.backend == "dra"):
            # A shared node's GPUs run with MIG off; changing MIG mode needs a GPU reset,
            # so the simulated GPUs start that way, as a real node would be set up. On DRA
            # the other GPUs start with MIG on: the plugin creates each claim's instance.
            from mig.catalog import get_model
            from node.nvml.simulated import SimulatedNvml

            SimulatedNvml(get_model(node.model), node.gpus, state, seed=node.name, mig_enabled=node.sharing == "none")
        advertising = ["--backend", "dra"] if self.backend == "dra" else ["--emulate-device-plugin"]
        usage: list[str] = []
        if self.usage_trace is not None:
            self.agent_metrics_ports[node.name] = free_port()
            usage = ["--usage-trace", str(self.usage_trace), "--usage-time-scale", str(self.usage_time_scale),
                     "--usage-trace-start", str(trace_start)]
        return self.start_process(f"agent-{node.name}", [
            "agent", "run", "--node", node.name, "--simulate", node.simulate,
            "--state-file", str(state), *advertising, *usage, *self.agent_args,
            "--poll-seconds", "0.5", "--idle-seconds", "1",
            "--metrics-port", str(self.agent_metrics_ports.get(node.name, 0)),
            "--kubeconfig", self.agent_kubeconfig(node.name),
        ])

    def start_controller(self, name: str, *extra: str) -> ManagedProcess:
        return self.start_process(name, [
            "controller", "run", "--kubeconfig", self._sa_kubeconfig("gpupack-controller"), "--metrics-port", "0",
            "--resync-seconds", "2", "--batch-seconds", "0.2", "--identity", name, "--lease-seconds", "6",
            *(("--policy", self.controller_policy) if self.controller_policy else ()), *extra,
        ])

    def state_file(self, node: str) -> Path:
        """The simulated NVML state file of ``node``'s agent (faults are posted next to it)."""
        return self.workdir / f"{node}.nvml.json"

    def stop_process(self, name: str) -> None:
        for proc in list(self.processes):
            if proc.name == name:
                proc.stop(grace_s=5.0)
                self.processes.remove(proc)

    def start_webhook(self) -> None:
        """Serve the webhook over TLS, register it with the API server, and wait until the API server
        calls it (:attr:`probe_sharing`)."""
        from webhook.certs import make_self_signed

        tls = self.workdir / "webhook-tls"
        tls.mkdir(parents=True, exist_ok=True)
        ca, cert, key = make_self_signed(["localhost", "127.0.0.1"])
        for fname, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
            (tls / fname).write_bytes(data)
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        proc = self.start_process("webhook", [
            "webhook", "serve", "--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key"),
            "--host", "127.0.0.1", "--port", str(port), "--kubeconfig", self._sa_kubeconfig("gpupack-webhook"),
            "--log-level", "warning",
        ])
        context = ssl.create_default_context(cafile=str(tls / "ca.crt"))

        def ready() -> bool:
            try:
                with urllib.request.urlopen(url + "/readyz", context=context, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        _wait("the webhook to be ready", ready, 60, proc)
        bundle = base64.b64encode(ca).decode()
        registration = client.AdmissionregistrationV1Api(self.admin)
        # Typed as Any: the client's stubs want its model classes; it sends plain dicts as they are.
        mutating: Any = local_webhook_config("mutating", url, bundle)
        registration.create_mutating_webhook_configuration(mutating)
        validating: Any = local_webhook_config("validating", url, bundle)
        registration.create_validating_webhook_configuration(validating)
        self.webhook_configs += [mutating["metadata"]["name"], validating["metadata"]["name"]]
        self._wait_mutating()
        # kube-scheduler calls the webhook's prioritize extender, as the shipped configuration has it.
        assert self.plane is not None
        self.plane.use_scheduler_extender(SchedulerExtender(url + SCHEDULER_EXTENDER_PREFIX, tls / "ca.crt"))

    def _wait_mutating(self) -> None:
        """The API server picks up webhook registrations asynchronously: dry-run until one is mutated."""
        core = client.CoreV1Api(self.admin)
        probe: Any = probe_pod(self.probe_sharing)  # a dict body is sent as is

        def mutated() -> bool:
            try:
                pod: Any = core.create_namespaced_pod(DEMO_NAMESPACE, probe, dry_run="All")
            except client.ApiException:
                return False
            return webhook_mutated(pod.spec.containers[0].resources.limits)

        _wait("the mutating webhook to be called by the API server", mutated, 60)

    def _all_reported(self) -> bool:
        custom = client.CustomObjectsApi(self.admin)
        listed: Any = custom.list_cluster_custom_object(GROUP, VERSION, "gpunodes")
        items = listed.get("items", [])
        done = {i["metadata"]["name"] for i in items if len((i.get("status") or {}).get("gpus") or []) > 0}
        return all(n.name in done for n in self.nodes)



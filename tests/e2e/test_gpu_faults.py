"""GPU faults end to end: simulated nodes fail, gpupack notices, keeps pods off, and recovers.

One control plane of this module's own runs kube-apiserver, kube-scheduler and
kube-controller-manager (ReplicaSet and disruption controllers, for the eviction
story). Node agents run as ``gpupack agent run --simulate`` subprocesses with the
emulated device plugin, as their ServiceAccount; faults reach them from outside,
through ``gpupack agent fault --state-file`` (the simulated node's inbox), and are
acknowledged through ``gpupack agent health ack``, as an admin would. The
controller (and, for one story, the webhook) run as their ServiceAccounts too.

The stories:

1. an XID on one MIG instance of a busy GPU withdraws that instance only: the
   Node's allocatable drops by one (capacity stays), the pod on it is told
   (``GpuFailed``), its neighbour keeps its instance and process; an admin's
   acknowledgement ends it;
2. a lost GPU: new gated pods go to the other node, none to the faulted one;
3. ECC errors on one GPU of an MPS node (a fault the device plugin keeps
   advertising): the ``gpupack.io/gpu-degraded`` label, the webhook's affinity keeps
   new pods off, a GPU reset ends it and the node takes pods again;
4. ``--evict-on-gpu-fault``: a ReplicaSet's pod on a failed instance stays while the
   policy is off, waits for its PodDisruptionBudget, then is evicted and replaced
   by a new pod on a healthy instance;
5. every GPU of a node lost: the ``gpupack.io/gpu-unhealthy`` taint (and only while
   every GPU is gone, other writers' taints kept), until a reboot ends it all.

Only waits with generous deadlines; no timing assertions.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.devcluster.apply import (
    apply_objects, gpupack_manifests, load_manifests, local_webhook_config, node_isolation_manifests,
)
from gpupack.devcluster.controlplane import ControlPlane
from gpupack.devcluster.process import ManagedProcess, free_port
from mig.catalog import get_model
from node.nvml.simulated import SimulatedNvml
from node.base.pods import sim_pid
from sharing.api.keys import DEGRADED_LABEL, UNHEALTHY_TAINT
from tests.e2e.test_controller_e2e import GROUP, VERSION, Harness
from tests.e2e.waiting import wait_for
from webhook.certs import make_self_signed
from gpupack.testing.admission_reviews import gpu_container, make_pod

ROOT = Path(__file__).resolve().parents[2]
AGENT_POLICY_RBAC = ROOT / "manifests" / "agent" / "rbac-policies.yaml"
EVICTION_RBAC = ROOT / "manifests" / "gpu-fault-evictions" / "rbac.yaml"
WAIT_S = 90.0
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_7G = "nvidia.com/mig-7g.80gb"
SHARED = "nvidia.com/gpu.shared"
EVENT_NAMESPACE = "default"  # where the agent records Events about its (cluster-scoped) GPUNode


# --------------------------------------------------------------------------- plane


@pytest.fixture(scope="module")
def plane(controller_manager_scheduler_plane: ControlPlane) -> ControlPlane:
    with controller_manager_scheduler_plane.admin_client() as admin:
        # gpupack's RBAC, and the agent's grant to read the SharingPolicies that select its node.
        apply_objects(admin, gpupack_manifests() + load_manifests(AGENT_POLICY_RBAC) + node_isolation_manifests(),
                      field_manager="gpu-faults-e2e")
    return controller_manager_scheduler_plane


@pytest.fixture(scope="module")
def admin(plane: ControlPlane) -> Iterator[Any]:
    with plane.admin_client() as api:
        yield api


@pytest.fixture(scope="module")
def plane_sa_kubeconfig(plane: ControlPlane) -> Callable[[str], Path]:
    """``get("gpupack-controller")`` -> a kubeconfig of that ServiceAccount on this module's plane."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = plane.serviceaccount_kubeconfig(name)
        return cache[name]

    return get


class FaultHarness(Harness):
    """The controller e2e harness, plus faults from outside, shared nodes and reads of what faults change."""

    def __init__(self, admin: Any, sa_kubeconfig: Callable[[str], Path], tmp: Path, namespace: str,
                 admin_kubeconfig: Path, agent_kubeconfig: Callable[[str], Path]) -> None:
        super().__init__(admin, sa_kubeconfig, tmp, namespace, agent_kubeconfig)
        self.admin_kubeconfig = admin_kubeconfig
        self.replicasets: list[str] = []

    # ------------------------------------------------------------ processes
    def agent(self, node: str, simulate: str) -> ManagedProcess:
        return self._start(f"agent-{node}", [
            "agent", "run", "--node", node, "--simulate", simulate, "--state-file", str(self.state_file(node)),
            "--emulate-device-plugin", "--poll-seconds", "1", "--idle-seconds", "0.5", "--metrics-port", "0",
            "--heartbeat-seconds", "2", "--kubeconfig", str(self.agent_kubeconfig(node)),
        ])

    def start_process(self, name: str, argv: list[str]) -> ManagedProcess:
        """``gpupack ARGV`` as a process stopped (and its log printed) with the others."""
        return self._start(name, argv)

    def state_file(self, node: str) -> Path:
        return self.tmp / f"{node}.json"

    def gpupack(self, *argv: str) -> str:
        """Run ``gpupack ARGV`` as an admin would; its stdout (fails the test on a non-zero exit)."""
        run = subprocess.run([sys.executable, "-m", "gpupack", *argv], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, f"gpupack {' '.join(argv)} exited {run.returncode}: {run.stderr[-2000:]}"
        return run.stdout

    def fault(self, node: str, kind: str, *options: str) -> None:
        """``gpupack agent fault KIND`` on the simulated node (its agent applies it at its next tick)."""
        self.gpupack("agent", "fault", "--state-file", str(self.state_file(node)), kind, *options)

    # ------------------------------------------------------------ objects
    def shared_node(self, suffix: str, gpus: int, model: str = "A100-80GB", replicas: int = 4) -> str:
        """A node whose GPUs run with MIG off, shared by MPS into ``replicas`` each; returns once advertised."""
        name = f"ctl-{self.run}-{suffix}"
        # MIG mode changes need a GPU reset: the simulated GPU starts with MIG off, as such a node is set up.
        SimulatedNvml(get_model(model), gpus, self.state_file(name), seed=name, mig_enabled=False)
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={
            "kubernetes.io/hostname": name, "e2e-ctl": self.run, "nvidia.com/gpu.deploy.device-plugin": "true"})))
        res = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        self.core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
        self.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": {"name": name},
            "spec": {"sharing": {"mode": "mps", "replicas": replicas},
                     "gpus": [{"index": i, "migEnabled": False} for i in range(gpus)]}})
        self.nodes.append(name)
        self.agent(name, f"{model}:{gpus}")
        wait_for(f"{name} advertising {gpus * replicas} MPS replicas",
                 lambda: self.allocatable(name).get(SHARED) == str(gpus * replicas), WAIT_S)
        return name

    def status(self, node: str) -> dict[str, Any]:
        return dict(self.gpunode(node).get("status") or {})

    def gpu(self, node: str, index: int) -> dict[str, Any]:
        return next(g for g in self.status(node).get("gpus") or [] if g["index"] == index)

    def condition(self, node: str, type_: str) -> dict[str, Any]:
        return next((c for c in self.status(node).get("conditions") or [] if c["type"] == type_), {})

    def node_obj(self, node: str) -> Any:
        return self.core.read_node(node)

    def allocatable(self, node: str) -> dict[str, str]:
        return dict(self.node_obj(node).status.allocatable or {})

    def capacity(self, node: str) -> dict[str, str]:
        return dict(self.node_obj(node).status.capacity or {})

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.node_obj(node).metadata.labels or {})

    def taints(self, node: str) -> list[tuple[str, str | None, str]]:
        """(key, value, effect) of the Node's taints."""
        return [(t.key, t.value, t.effect) for t in self.node_obj(node).spec.taints or []]

    def events(self, namespace: str, name: str) -> list[tuple[str, str, str]]:
        selector = f"involvedObject.name={name}"
        items: list[Any] = self.core.list_namespaced_event(namespace, field_selector=selector).items
        return [(str(e.type), str(e.reason), str(e.message or "")) for e in items]

    # The API objects are read as Any: the client's models make every field Optional.
    def pod(self, name: str) -> Any:
        return self.core.read_namespaced_pod(name, self.namespace)

    def gpupack_pod(self, name: str, milli: int) -> Any:
        """A pod asking for ``milli`` of a GPU by MPS, as users write them (the webhook rewrites it); as stored."""
        body: Any = make_pod(gpu_container("main", str(milli)), name=name, namespace=self.namespace, mode="mps")
        return self.core.create_namespaced_pod(self.namespace, body)

    def instance_of(self, node: str, pod: str) -> dict[str, Any] | None:
        """The MIG instance (GPUNode status) the pod ``namespace/pod`` uses, once the agent reports it."""
        key = f"{self.namespace}/{pod}"
        for gpu in self.status(node).get("gpus") or []:
            for inst in gpu.get("instances") or []:
                if key in inst.get("pods") or []:
                    return dict(inst, gpu=gpu["index"])
        return None

    def sim_processes(self, node: str) -> list[dict[str, Any]]:
        """The simulated GPU processes (the workloads the emulated device plugin started), from the state file."""
        doc = json.loads(self.state_file(node).read_text())
        return [dict(p, gpu=g["index"]) for g in doc["gpus"] for p in g["processes"]]

    def cleanup(self) -> None:
        apps = client.AppsV1Api(self.admin)
        for name in self.replicasets:  # first, or it recreates the pods cleanup deletes
            try:
                apps.delete_namespaced_replica_set(name, self.namespace, propagation_policy="Orphan")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        super().cleanup()


@pytest.fixture
def h(admin: Any, plane: ControlPlane, plane_sa_kubeconfig: Callable[[str], Path],
      tmp_path: Path) -> Iterator[FaultHarness]:
    namespace = f"faults-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    harness = FaultHarness(admin, plane_sa_kubeconfig, tmp_path, namespace, plane.kubeconfig,
                           plane.node_agent_kubeconfig)
    yield harness
    logs = {name: harness.log(name)[-2500:] for name in harness.processes}
    harness.cleanup()
    for name, text in logs.items():
        print(f"--- {name} ---\n{text}")


def _reasons(events: list[tuple[str, str, str]], type_: str = "Warning") -> set[str]:
    return {reason for t, reason, _ in events if t == type_}


# --------------------------------------------------------------------------- 1. MIG instance


def test_xid_on_one_mig_instance_withdraws_that_instance_only(h: FaultHarness) -> None:
    node = h.node("mig", 1, {0: ["1g.10gb"] * 7})
    h.bound_pod("neighbour", node, "1g.10gb")
    h.bound_pod("victim", node, "1g.10gb")
    neighbour = wait_for("the neighbour's instance reported in use", lambda: h.instance_of(node, "neighbour"), WAIT_S)
    victim = wait_for("the victim's instance reported in use", lambda: h.instance_of(node, "victim"), WAIT_S)
    assert neighbour["uuid"] != victim["uuid"]
    assert h.allocatable(node)[MIG_1G] == "7" and h.capacity(node)[MIG_1G] == "7"
    neighbour_pid = sim_pid(h.pod("neighbour").metadata.uid)
    assert any(p["pid"] == neighbour_pid and p["gi_id"] == neighbour["giId"] for p in h.sim_processes(node))

    h.fault(node, "xid", "--gpu", "0", "--xid", "94", "--instance", str(victim["giId"]))

    failed = wait_for("the victim's instance unhealthy",
                      lambda: (i := h.instance_of(node, "victim")) and i.get("health"), WAIT_S)
    assert failed["reason"] == "Xid94" and failed["xid"] == 94
    assert failed["withdrawn"] is True and failed["recovery"] == "ResetGpu"
    assert failed["pods"] == [f"{h.namespace}/victim"]
    gpu = h.gpu(node, 0)
    assert "health" not in gpu, "the GPU itself stays healthy: only one instance failed"
    unhealthy = [i["uuid"] for i in gpu["instances"] if i.get("health")]
    assert unhealthy == [victim["uuid"]]
    summary = h.status(node)["summary"]
    assert (summary.get("unhealthyGpus", 0), summary.get("unhealthyInstances"), summary.get("degraded", False)) == (
        0, 1, False)
    assert h.condition(node, "GpusHealthy")["status"] == "False"
    assert h.condition(node, "GpusHealthy")["reason"] == "DevicesWithdrawn"

    # The device plugin withdraws exactly that instance: allocatable one less, capacity as it was.
    wait_for("allocatable 1g.10gb down by one", lambda: h.allocatable(node).get(MIG_1G) == "6", WAIT_S)
    assert h.capacity(node)[MIG_1G] == "7"
    # Withdrawn by the plugin, so the node is not marked degraded nor tainted.
    assert DEGRADED_LABEL not in h.labels(node)
    assert all(key != UNHEALTHY_TAINT for key, _, _ in h.taints(node))

    # The neighbour keeps running: same instance, still in use by it, its process still there.
    now = h.instance_of(node, "neighbour")
    assert now is not None and now["uuid"] == neighbour["uuid"] and now.get("inUse") is True
    assert "health" not in now
    assert any(p["pid"] == neighbour_pid and p["gi_id"] == neighbour["giId"] for p in h.sim_processes(node))
    pod = h.pod("neighbour")
    assert pod.metadata.deletion_timestamp is None and pod.spec.node_name == node

    # Events: the failed instance's pod is told, its neighbour is not, the GPUNode says which instance.
    wait_for("GpuFailed on the victim pod", lambda: "GpuFailed" in _reasons(h.events(h.namespace, "victim")), WAIT_S)
    assert "GpuFailed" not in _reasons(h.events(h.namespace, "neighbour"))
    node_events = wait_for("MigInstanceUnhealthy on the GPUNode", lambda: [
        e for e in h.events(EVENT_NAMESPACE, node) if e[:2] == ("Warning", "MigInstanceUnhealthy")], WAIT_S)
    assert f"MIG instance {victim['giId']} of GPU 0" in node_events[0][2]
    assert "GpuUnhealthy" not in _reasons(h.events(EVENT_NAMESPACE, node))

    shown = json.loads(h.gpupack("agent", "health", "show", "--node", node, "--json",
                                 "--kubeconfig", str(h.admin_kubeconfig)))
    assert [(row["reason"], row["withdrawn"]) for row in shown["faults"]] == [("Xid94", True)]

    # An admin acknowledges it (a reset is refused while pods run): the instance is healthy and advertised again.
    h.gpupack("agent", "health", "ack", "--node", node, "--gpu", "0", "--kubeconfig", str(h.admin_kubeconfig))
    wait_for("the fault ended by the acknowledgement",
             lambda: not any(i.get("health") for i in h.gpu(node, 0)["instances"]), WAIT_S)
    wait_for("allocatable 1g.10gb back to 7", lambda: h.allocatable(node).get(MIG_1G) == "7", WAIT_S)
    assert wait_for("GpusHealthy=True", lambda: h.condition(node, "GpusHealthy").get("status") == "True", WAIT_S)
    assert "GpuRecovered" in _reasons(h.events(EVENT_NAMESPACE, node), "Normal")
    assert h.instance_of(node, "neighbour")["uuid"] == neighbour["uuid"]  # type: ignore[index]


# --------------------------------------------------------------------------- 2. lost GPU


def test_pods_go_to_the_other_node_once_a_gpu_is_lost(h: FaultHarness) -> None:
    a = h.node("a", 1, {0: ["1g.10gb"] * 7})
    b = h.node("b", 1, {0: ["7g.80gb"]})  # 1g pods fit here only after a reshape: a is preferred while healthy
    h.policy()
    h.controller("ctl-1")
    h.gated_pod("first", "1g.10gb")
    assert wait_for("the first pod bound", lambda: h.node_of("first"), WAIT_S) == a
    spec_before = h.gpunode(a)["spec"]["gpus"]

    h.fault(a, "lose", "--gpu", "0")
    health = wait_for("a's GPU reported lost", lambda: h.gpu(a, 0).get("health"), WAIT_S)
    assert health["recovery"] == "RebootNode" and health["withdrawn"] is True
    assert health["reason"] in ("Xid79", "GpuLost")
    wait_for("a's 1g instances withdrawn", lambda: h.allocatable(a).get(MIG_1G) == "0", WAIT_S)

    pods = [h.gated_pod(f"p{i}", "1g.10gb") for i in range(3)]
    nodes = wait_for("every new pod bound", lambda: (n := [h.node_of(p) for p in pods]) and all(n) and n,
                     timeout_s=120)
    assert nodes == [b] * len(pods)
    assert "1g.10gb" in h.layouts(b)[0]
    assert h.gpunode(a)["spec"]["gpus"] == spec_before, "the controller planned a change on a lost GPU"
    assert h.node_of("first") == a


# --------------------------------------------------------------------------- 3. degraded (MPS)


class Webhook:
    """``gpupack webhook serve`` as its ServiceAccount, registered for one namespace only."""

    def __init__(self, h: FaultHarness) -> None:
        tls = h.tmp / "webhook-tls"
        tls.mkdir()
        ca, cert, key = make_self_signed(["localhost", "127.0.0.1"])
        for name, data in (("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)):
            (tls / name).write_bytes(data)
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        self.proc = h.start_process("webhook", [
            "webhook", "serve", "--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key"),
            "--host", "127.0.0.1", "--port", str(port), "--kubeconfig", str(h.sa_kubeconfig("gpupack-webhook")),
            "--log-level", "warning"])
        context = ssl.create_default_context(cafile=str(tls / "ca.crt"))

        def ready() -> bool:
            try:
                with urllib.request.urlopen(self.url + "/readyz", context=context, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("the webhook ready", ready, WAIT_S, interval_s=0.5)
        config = local_webhook_config("mutating", self.url, base64.b64encode(ca).decode(), f"gpupack-faults-{h.run}")
        hook = config["webhooks"][0]
        hook["namespaceSelector"]["matchExpressions"].append(
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [h.namespace]})
        self.registration = client.AdmissionregistrationV1Api(h.admin)
        self.name = config["metadata"]["name"]
        self.registration.create_mutating_webhook_configuration(config)
        probe: Any = make_pod(gpu_container("main", "100"), name="probe", namespace=h.namespace, mode="mps")

        def mutated() -> bool:  # the API server picks registrations up asynchronously
            try:
                pod: Any = h.core.create_namespaced_pod(h.namespace, probe, dry_run="All")
            except ApiException:
                return False
            return not any(k.startswith("gpupack.io/") for k in pod.spec.containers[0].resources.limits or {})

        wait_for("the API server to call the webhook", mutated, WAIT_S, interval_s=0.5)

    def unregister(self) -> None:
        self.registration.delete_mutating_webhook_configuration(self.name)


def _affinity_terms(pod: Any) -> list[list[tuple[str, str]]]:
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    return [[(e.key, e.operator) for e in term.match_expressions or []] for term in required.node_selector_terms]


def test_ecc_on_a_shared_node_keeps_new_pods_off_until_a_reset(h: FaultHarness) -> None:
    sick = h.shared_node("sick", 2)  # ECC on one GPU of two: degraded, not tainted (test 3 has the taint)
    well = h.shared_node("well", 1)
    webhook = Webhook(h)
    try:
        h.controller("ctl-1")
        h.fault(sick, "ecc", "--gpu", "0", "--count", "2")
        health = wait_for("the ECC fault reported", lambda: h.gpu(sick, 0).get("health"), WAIT_S)
        wait_for("the degraded label", lambda: h.labels(sick).get(DEGRADED_LABEL) == "true", WAIT_S)
        assert health["withdrawn"] is False and health["recovery"] == "ResetGpu"
        assert health["reason"] in ("EccUncorrectable", "RetiredPagesPending")
        assert h.status(sick)["summary"]["degraded"] is True
        assert h.condition(sick, "GpusHealthy")["reason"] == "Degraded"
        # The device plugin keeps advertising the GPU (why gpupack must keep pods off), no taint.
        assert h.allocatable(sick)[SHARED] == "8" and h.capacity(sick)[SHARED] == "8"
        assert all(key != UNHEALTHY_TAINT for key, _, _ in h.taints(sick))
        assert DEGRADED_LABEL not in h.labels(well)

        names = [f"p{i}" for i in range(3)]
        for name in names:
            pod = h.gpupack_pod(name, 200)
            assert pod.spec.containers[0].resources.limits.get(SHARED) == "1"
            terms = _affinity_terms(pod)
            assert terms and all((DEGRADED_LABEL, "DoesNotExist") in term for term in terms), terms
        placed = wait_for("every pod bound", lambda: (n := [h.node_of(p) for p in names]) and all(n) and n,
                          timeout_s=120)
        assert placed == [well] * len(names)

        # A reset (nothing runs on the sick GPU) clears the ECC signals: the label goes, the node takes pods.
        h.fault(sick, "reset", "--gpu", "0")
        wait_for("the degraded label removed", lambda: DEGRADED_LABEL not in h.labels(sick), WAIT_S)
        wait_for("GpusHealthy=True", lambda: h.condition(sick, "GpusHealthy").get("status") == "True", WAIT_S)
        assert "health" not in h.gpu(sick, 0)
        assert h.status(sick)["summary"].get("degraded", False) is False
        more = [f"q{i}" for i in range(2)]  # the well node has one replica left: one at least goes to sick
        for name in more:
            h.gpupack_pod(name, 200)
        placed = wait_for("the new pods bound", lambda: (n := [h.node_of(p) for p in more]) and all(n) and n,
                          timeout_s=120)
        assert sick in placed
    finally:
        webhook.unregister()


# --------------------------------------------------------------------------- 4. evictions


def _replicaset(h: FaultHarness, name: str) -> None:
    labels = {"app": name}
    client.AppsV1Api(h.admin).create_namespaced_replica_set(h.namespace, client.V1ReplicaSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ReplicaSetSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector={"e2e-ctl": h.run}, termination_grace_period_seconds=30,
                    containers=[client.V1Container(name="main", image="example.com/train:1", resources=(
                        client.V1ResourceRequirements(limits={MIG_1G: "1"})))])))))
    h.replicasets.append(name)


def _live_pods(h: FaultHarness, app: str) -> list[Any]:
    pods: list[Any] = h.core.list_namespaced_pod(h.namespace, label_selector=f"app={app}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _running(h: FaultHarness, pod: str) -> None:
    """Play the kubelet: the pod runs and is Ready (a PodDisruptionBudget counts only healthy pods)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    h.core.patch_namespaced_pod_status(pod, h.namespace, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}})


def test_evict_on_gpu_fault_replaces_a_replicaset_pod_unless_a_budget_forbids(h: FaultHarness) -> None:
    node = h.node("ev", 1, {0: ["1g.10gb"] * 7})
    _replicaset(h, "train")
    (pod,) = wait_for("the ReplicaSet's pod bound", lambda: (
        p := _live_pods(h, "train")) and all(x.spec.node_name for x in p) and p, WAIT_S)
    old = pod.metadata.name
    assert pod.spec.node_name == node
    _running(h, old)
    inst = wait_for("the pod's instance reported in use", lambda: h.instance_of(node, old), WAIT_S)

    # Policy off (the default): the pod of the failed instance stays.
    h.controller("ctl-off")
    h.fault(node, "xid", "--gpu", "0", "--xid", "94", "--instance", str(inst["giId"]))
    failed = wait_for("the instance unhealthy", lambda: (i := h.instance_of(node, old)) and i.get("health"), WAIT_S)
    assert failed["pods"] == [f"{h.namespace}/{old}"]
    wait_for("GpuFailed on the pod", lambda: "GpuFailed" in _reasons(h.events(h.namespace, old)), WAIT_S)
    time.sleep(5)  # several controller cycles (--resync-seconds 1) with the fault reported
    assert [p.metadata.name for p in _live_pods(h, "train")] == [old]
    assert "EvictedFromFailedGpu" not in _reasons(h.events(h.namespace, old))
    h.stop("ctl-off")

    # Policy on, but a PodDisruptionBudget allows no disruption: the eviction waits.
    policy = client.PolicyV1Api(h.admin)
    policy.create_namespaced_pod_disruption_budget(h.namespace, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="train"),
        spec=client.V1PodDisruptionBudgetSpec(min_available=1,
                                              selector=client.V1LabelSelector(match_labels={"app": "train"}))))
    wait_for("the budget to count the pod healthy and allow no disruption", lambda: (
        s := policy.read_namespaced_pod_disruption_budget("train", h.namespace).status)
        and s.current_healthy == 1 and s.disruptions_allowed == 0, WAIT_S)
    assert EVICTION_RBAC.exists(), f"the opt-in eviction grant {EVICTION_RBAC} is missing"
    apply_objects(h.admin, load_manifests(EVICTION_RBAC), field_manager="gpu-faults-e2e")  # the opt-in grant
    h.controller("ctl-evict", "--evict-on-gpu-fault")
    wait_for("the controller to try and wait for the budget",
             lambda: f"eviction of {h.namespace}/{old} waits for its PodDisruptionBudget" in h.log("ctl-evict"),
             WAIT_S)
    assert [p.metadata.name for p in _live_pods(h, "train")] == [old]

    # The budget goes: the pod is evicted, the ReplicaSet replaces it, the new pod gets a healthy instance.
    policy.delete_namespaced_pod_disruption_budget("train", h.namespace)
    (new,) = wait_for("a replacement pod bound", lambda: (
        p := _live_pods(h, "train")) and p[0].metadata.name != old and all(x.spec.node_name for x in p) and p,
        timeout_s=120)
    evicted = h.pod(old)
    assert evicted.metadata.deletion_timestamp is not None  # graceful: no kubelet here to finish it
    # The Event is written after the eviction returns: on a loaded machine the ReplicaSet's new pod
    # can be bound first, so wait for it rather than expect it already there.
    wait_for("EvictedFromFailedGpu on the evicted pod",
             lambda: "EvictedFromFailedGpu" in _reasons(h.events(h.namespace, old)), WAIT_S)
    assert f"evicted {h.namespace}/{old}" in h.log("ctl-evict")
    placed = wait_for("the replacement's instance reported", lambda: h.instance_of(node, new.metadata.name), WAIT_S)
    assert placed["uuid"] != inst["uuid"] and "health" not in placed


# --------------------------------------------------------------------------- 5. whole node


def test_every_gpu_lost_taints_the_node_until_it_reboots(h: FaultHarness) -> None:
    node = h.node("whole", 2, {0: ["7g.80gb"], 1: ["7g.80gb"]})
    wait_for("both 7g instances advertised", lambda: h.allocatable(node).get(MIG_7G) == "2", WAIT_S)
    foreign = ("example.com/maintenance", "planned", "PreferNoSchedule")
    h.core.patch_node(node, {"spec": {"taints": [dict(zip(("key", "value", "effect"), foreign))]}})

    h.fault(node, "lose", "--gpu", "0")
    wait_for("GPU 0 reported lost", lambda: h.gpu(node, 0).get("health"), WAIT_S)
    wait_for("GPU 0's instance withdrawn", lambda: h.allocatable(node).get(MIG_7G) == "1", WAIT_S)
    # One GPU of two: no taint (the other still takes pods).
    assert all(key != UNHEALTHY_TAINT for key, _, _ in h.taints(node))
    assert h.condition(node, "GpusHealthy")["reason"] == "DevicesWithdrawn"

    h.fault(node, "lose", "--gpu", "1")
    wait_for("the unhealthy taint", lambda: any(key == UNHEALTHY_TAINT for key, _, _ in h.taints(node)), WAIT_S)
    ours = [t for t in h.taints(node) if t[0] == UNHEALTHY_TAINT]
    assert [effect for _, _, effect in ours] == ["NoSchedule"]
    assert foreign in h.taints(node), "another writer's taint was lost"
    assert h.allocatable(node).get(MIG_7G, "0") == "0"
    cond = wait_for("GpusHealthy reason AllGpusUnhealthy", lambda: (
        c := h.condition(node, "GpusHealthy")).get("reason") == "AllGpusUnhealthy" and c, WAIT_S)
    assert cond["status"] == "False"
    assert h.status(node)["summary"].get("unhealthyGpus") == 2
    assert DEGRADED_LABEL not in h.labels(node)  # lost GPUs are withdrawn: no degraded label

    # GpuLost needs a reboot: after one every fault ends, the taint goes, the layout comes back.
    # A reboot posted through the inbox takes effect before the next snapshot is read (the backend
    # applies its inbox when a snapshot begins), so the lost GPUs answer again and their faults end.
    h.fault(node, "reboot")
    wait_for("the taint removed", lambda: all(key != UNHEALTHY_TAINT for key, _, _ in h.taints(node)), WAIT_S)
    assert foreign in h.taints(node)
    wait_for("GpusHealthy=True", lambda: h.condition(node, "GpusHealthy").get("status") == "True", WAIT_S)
    assert not any(g.get("health") for g in h.status(node)["gpus"])
    assert DEGRADED_LABEL not in h.labels(node)
    summary = h.status(node)["summary"]
    assert summary.get("unhealthyGpus", 0) == 0 and summary.get("degraded", False) is False
    recovered = [m for t, r, m in h.events(EVENT_NAMESPACE, node) if (t, r) == ("Normal", "GpuRecovered")]
    assert any("rebooted" in m for m in recovered), recovered
    wait_for("both 7g instances advertised again", lambda: h.allocatable(node).get(MIG_7G) == "2", WAIT_S)

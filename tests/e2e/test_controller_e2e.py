"""The cluster controller on the real control plane, with simulated GPU nodes.

Every test gets its own Nodes (label ``e2e-ctl=<run>``), a SharingPolicy that
selects only them, node agents (``gpupack agent run --simulate``, subprocesses,
as the agent's ServiceAccount) and one or two controllers (``gpupack controller
run``, subprocesses, as the controller's ServiceAccount, scoped to the test's
namespace so other tests' gated pods are never touched). Pods are created gated
with the ``gpupack.io/allocation`` annotation the webhook would write, so these
tests exercise the controller alone; the webhook has its own e2e tests and
``test_demo_e2e`` runs everything together.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupack.devcluster.process import ManagedProcess
from mig.catalog import get_model
from node.nvml.simulated import SimulatedNvml
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION
from tests.e2e.waiting import wait_for

GROUP, VERSION = "gpupack.io", "v1alpha1"
H100 = "NVIDIA-H100-80GB-HBM3"


class Harness:
    def __init__(self, admin: Any, sa_kubeconfig: Callable[[str], Path], tmp: Path, namespace: str,
                 agent_kubeconfig: Callable[[str], Path]) -> None:
        self.admin = admin
        self.agent_kubeconfig = agent_kubeconfig
        """``agent_kubeconfig(node)``: the agent's token bound to a pod on its node (node isolation is on)."""
        self.core = client.CoreV1Api(admin)
        self.custom = client.CustomObjectsApi(admin)
        self.sa_kubeconfig = sa_kubeconfig
        self.tmp = tmp
        self.namespace = namespace
        self.run = uuid.uuid4().hex[:6]
        self.lease = f"ctl-{self.run}"
        self.processes: dict[str, ManagedProcess] = {}
        self.nodes: list[str] = []
        self.policies: list[str] = []

    # ------------------------------------------------------------ processes
    def _start(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, [sys.executable, "-m", "gpupack", *argv], self.tmp / f"{name}.log")
        proc.start()
        self.processes[name] = proc
        return proc

    def stop(self, name: str, kill: bool = False) -> None:
        proc = self.processes.pop(name)
        if kill and proc.popen is not None:
            os.killpg(proc.popen.pid, signal.SIGKILL)  # no shutdown code runs: a crash
            proc.popen.wait(timeout=10)
        proc.stop(grace_s=5.0)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def agent(self, node: str, simulate: str) -> ManagedProcess:
        return self._start(f"agent-{node}", [
            "agent", "run", "--node", node, "--simulate", simulate, "--state-file", str(self.tmp / f"{node}.json"),
            "--emulate-device-plugin", "--poll-seconds", "0.3", "--idle-seconds", "0.5", "--metrics-port", "0",
            "--heartbeat-seconds", "1", "--kubeconfig", str(self.agent_kubeconfig(node)),
        ])

    def controller(self, identity: str, *extra: str) -> ManagedProcess:
        return self._start(identity, [
            "controller", "run", "--kubeconfig", str(self.sa_kubeconfig("gpupack-controller")), "--metrics-port", "0",
            "--namespaces", self.namespace, "--identity", identity, "--lease-name", self.lease,
            "--lease-seconds", "4", "--resync-seconds", "1", "--batch-seconds", "0.2", *extra,
        ])

    # ------------------------------------------------------------ objects
    def node(self, suffix: str, gpus: int, layouts: dict[int, list[str]] | None = None, *, mps: int = 0) -> str:
        """A simulated H100 node; ``mps``: its GPUs run with MIG off, shared by MPS into that many replicas."""
        name = f"ctl-{self.run}-{suffix}"
        if mps:  # a MIG mode change needs a GPU reset: the simulated GPUs start with MIG off
            SimulatedNvml(get_model("H100-80GB"), gpus, self.tmp / f"{name}.json", seed=name, mig_enabled=False)
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={
            "kubernetes.io/hostname": name, "e2e-ctl": self.run, "nvidia.com/gpu.deploy.device-plugin": "true"})))
        res = {"cpu": "32", "memory": "256Gi", "pods": "110"}
        self.core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
        spec: dict[str, Any] = {"sharing": {"mode": "mps", "replicas": mps} if mps else {"mode": "none", "replicas": 1}}
        if mps:
            spec["gpus"] = [{"index": i, "migEnabled": False} for i in range(gpus)]
        if layouts:
            spec["gpus"] = [{"index": i, "migEnabled": True, "layout": [{"profile": p} for p in ps]}
                            for i, ps in sorted(layouts.items())]
        self.custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": {"name": name}, "spec": spec})
        self.nodes.append(name)
        self.agent(name, f"H100-80GB:{gpus}")
        if mps:
            wait_for(f"{name} advertising {gpus * mps} MPS replicas", lambda: (self.core.read_node(name).status
                     .allocatable or {}).get("nvidia.com/gpu.shared") == str(gpus * mps), 90)
            return name
        wanted = {i: sorted(ps) for i, ps in (layouts or {}).items()}
        wait_for(f"{name} reported with its initial layout", lambda: self.layouts(name) and all(
            self.layouts(name).get(i) == ps for i, ps in wanted.items()))
        return name

    def policy(self, **reshaping: Any) -> str:
        name = f"ctl-{self.run}-{len(self.policies)}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"e2e-ctl": self.run}},
                     "reshaping": {"maxConcurrent": 4, "idleSeconds": 0, **reshaping}}})
        self.policies.append(name)
        return name

    def gpunode(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_cluster_custom_object(GROUP, VERSION, "gpunodes", name))

    def layouts(self, name: str) -> dict[int, list[str]]:
        try:
            status = self.gpunode(name).get("status") or {}
        except client.ApiException:
            return {}
        return {g["index"]: sorted(i["profile"] for i in g.get("instances") or []) for g in status.get("gpus") or []}

    def instance_uuids(self, name: str, index: int) -> list[str]:
        status = self.gpunode(name).get("status") or {}
        gpu = next(g for g in status.get("gpus") or [] if g["index"] == index)
        return sorted(str(i.get("uuid")) for i in gpu.get("instances") or [])

    def in_flight(self, name: str) -> int:
        """GPUs whose spec layout differs from what the status shows (a reshape in flight)."""
        obj = self.gpunode(name)
        spec = {g["index"]: sorted(i["profile"] for i in g.get("layout") or []) for g in (obj.get("spec") or {}).get("gpus") or []}
        have = {g["index"]: sorted(i["profile"] for i in g.get("instances") or []) for g in (obj.get("status") or {}).get("gpus") or []}
        return sum(1 for i, ps in spec.items() if have.get(i) != ps)

    def gated_pod(self, name: str, profile: str) -> str:
        allocation = Allocation(
            mode="mig", gated=True, capacity_existed=False, policy="e2e", reason="e2e", gpu_model=H100,
            containers=(ContainerAllocation("main", "containers", 300, None, f"nvidia.com/mig-{profile}", profile),),
        )
        body: Any = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()}},
                     "spec": {"schedulingGates": [{"name": "gpupack.io/capacity"}],
                              "containers": [{"name": "main", "image": "example.com/app:1",
                                              "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}],
                              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                  "nodeSelectorTerms": [{"matchExpressions": [
                                      {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]},
                                      {"key": "e2e-ctl", "operator": "In", "values": [self.run]}]}]}}}}}
        self.core.create_namespaced_pod(self.namespace, body)
        return name

    def bound_pod(self, name: str, node: str, profile: str) -> None:
        """A pod already running on ``node`` (no kubelet: bound directly) that holds one instance."""
        body: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                     "spec": {"nodeName": node, "containers": [{"name": "main", "image": "example.com/app:1",
                              "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}
        self.core.create_namespaced_pod(self.namespace, body)

    def node_of(self, pod: str) -> str | None:
        return self.core.read_namespaced_pod(pod, self.namespace).spec.node_name  # type: ignore[no-any-return]

    def cleanup(self) -> None:
        for name in list(self.processes):
            self.stop(name)
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
        for name in self.policies:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "sharingpolicies", name)
        for name in self.nodes:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodes", name)
            self.core.delete_node(name)


@pytest.fixture
def h(admin_client: Any, gpupack_installed: Any, sa_kubeconfig: Callable[[str], Path], tmp_path: Path,
      namespace: str, agent_kubeconfig: Callable[[str], Path]) -> Iterator[Harness]:
    harness = Harness(admin_client, sa_kubeconfig, tmp_path, namespace, agent_kubeconfig)
    yield harness
    logs = {name: harness.log(name)[-1500:] for name in harness.processes}
    harness.cleanup()
    for name, text in logs.items():
        print(f"--- {name} ---\n{text}")


def test_missing_profile_reshapes_an_idle_gpu_and_the_pod_is_scheduled(h: Harness) -> None:
    node = h.node("a", 1, {0: ["7g.80gb"]})
    policy = h.policy()
    h.controller("ctl-1")
    h.gated_pod("needs-3g", "3g.40gb")
    assert wait_for("the pod to be bound", lambda: h.node_of("needs-3g")) == node
    assert "3g.40gb" in h.layouts(node)[0]
    # The controller reports on the policy through its status subresource (its own RBAC).
    status = wait_for("the policy's status", lambda: h.custom.get_cluster_custom_object(
        GROUP, VERSION, "sharingpolicies", policy).get("status"))
    ready = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert status["matchedNodes"] == 1 and status["observedGeneration"] == 1 and status["appliedTime"]
    assert ready == {"Ready": ("True", "Applied"), "Overlapping": ("False", "Exclusive")}
    pod = h.core.read_namespaced_pod("needs-3g", h.namespace)
    assert not pod.spec.scheduling_gates
    exprs = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0].match_expressions
    assert {"kubernetes.io/hostname"} <= {e.key for e in exprs}  # pinned by the controller, terms only tightened


def test_a_busy_gpu_is_never_touched(h: Harness) -> None:
    node = h.node("busy", 2, {0: ["7g.80gb"], 1: ["7g.80gb"]})
    h.bound_pod("holder", node, "7g.80gb")

    def busy() -> list[int]:
        gpus = (h.gpunode(node).get("status") or {}).get("gpus") or []
        return [g["index"] for g in gpus if any(i.get("inUse") for i in g.get("instances") or [])]

    (busy_index,) = wait_for("the agent to report the holder's instance in use", busy)
    before = h.instance_uuids(node, busy_index)
    h.policy()
    h.controller("ctl-1")
    h.gated_pod("a", "3g.40gb")
    h.gated_pod("b", "3g.40gb")
    h.gated_pod("c", "3g.40gb")  # a third 3g fits nowhere without the busy GPU

    def busy_untouched() -> None:
        assert h.instance_uuids(node, busy_index) == before, "the busy GPU's instances changed"

    wait_for("a and b bound", lambda: h.node_of("a") and h.node_of("b"), tick=busy_untouched)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        busy_untouched()
        time.sleep(0.2)
    assert h.node_of("c") is None
    assert h.layouts(node)[busy_index] == ["7g.80gb"]


@pytest.mark.parametrize("victim", ["controller", "agent"])
def test_killing_a_component_mid_reshape_converges(h: Harness, victim: str) -> None:
    node = h.node("crash", 2, {0: ["7g.80gb"], 1: ["7g.80gb"]})
    h.policy()
    h.controller("ctl-1")
    for i in range(4):
        h.gated_pod(f"p{i}", "2g.20gb")
    wait_for("a reshape to start (spec written)", lambda: h.in_flight(node) > 0, timeout_s=30)
    if victim == "controller":
        h.stop("ctl-1", kill=True)
        h.controller("ctl-2")
    else:
        h.stop(f"agent-{node}", kill=True)
        h.agent(node, "H100-80GB:2")
    wait_for("every pod bound", lambda: all(h.node_of(f"p{i}") for i in range(4)))
    layouts = h.layouts(node)
    assert sum(ps.count("2g.20gb") for ps in layouts.values()) >= 4
    assert h.in_flight(node) == 0


def test_a_dead_agents_node_is_planned_around(h: Harness) -> None:
    """With a node's agent dead while the controller planned a reshape there, pods used to wait
    for that capacity forever ("in flight") while another node sat idle.

    The agent is killed just before the pods arrive, while its last report is still fresh (6 s): the
    controller plans on the node all the same, and the reshape can never be applied. (Killed after
    the plan, as this test once did, the agent sometimes applied the reshape first: the test then
    waited for a state it had missed.)"""
    doomed = h.node("doomed", 1, {0: ["7g.80gb"]})
    h.policy()
    h.controller("ctl-1", "--agent-stale-seconds", "6")
    wait_for("the controller leading, its caches listed", lambda: "watch caches listed" in h.log("ctl-1"))
    h.stop(f"agent-{doomed}", kill=True)
    for i in range(2):
        h.gated_pod(f"p{i}", "1g.10gb")
    wait_for("a reshape planned on the only node", lambda: h.in_flight(doomed) > 0, timeout_s=30)
    spare = h.node("spare", 1, {0: ["7g.80gb"]})
    wait_for("the silent node reported stale", lambda: "agent silent" in h.log("ctl-1"), timeout_s=60)
    wait_for("every pod bound to the live node", lambda: all(h.node_of(f"p{i}") == spare for i in range(2)),
             timeout_s=90)
    assert h.in_flight(doomed) > 0  # nothing was ever applied there: the pods did not wait for it


def test_two_controller_replicas_never_both_act(h: Harness) -> None:
    node = h.node("ha", 2, {0: ["7g.80gb"], 1: ["7g.80gb"]})
    h.policy()
    h.controller("ctl-a")
    h.controller("ctl-b")

    def holder() -> str | None:
        try:
            lease = client.CoordinationV1Api(h.admin).read_namespaced_lease(h.lease, "gpupack-system")
        except client.ApiException:
            return None
        return lease.spec.holder_identity or None  # type: ignore[no-any-return]

    lease = wait_for("a leader", holder)
    for i in range(3):
        h.gated_pod(f"p{i}", "1g.10gb")
    wait_for("pods bound", lambda: all(h.node_of(f"p{i}") for i in range(3)))
    acted = {ident for ident in ("ctl-a", "ctl-b") if "layout:" in h.log(ident) or "released" in h.log(ident)}
    assert acted == {lease}
    # Fail over: the standby takes the lease and serves new demand.
    h.stop(lease, kill=True)
    standby = ({"ctl-a", "ctl-b"} - {lease}).pop()
    h.gated_pod("after", "3g.40gb")
    assert wait_for("the standby to place the new pod", lambda: h.node_of("after"), timeout_s=45) == node
    assert "released" in h.log(standby)


def test_max_concurrent_is_honoured(h: Harness) -> None:
    node = h.node("mc", 3, {0: ["7g.80gb"], 1: ["7g.80gb"], 2: ["7g.80gb"]})
    h.policy(maxConcurrent=1)
    h.controller("ctl-1")
    for i in range(3):
        h.gated_pod(f"p{i}", "4g.40gb")  # each needs its own GPU reshaped
    peak = 0

    def watch() -> None:
        nonlocal peak
        peak = max(peak, h.in_flight(node))

    wait_for("all three bound", lambda: all(h.node_of(f"p{i}") for i in range(3)), tick=watch)
    assert peak == 1


def test_closed_window_holds_reshaping_until_it_opens(h: Harness) -> None:
    node = h.node("win", 1, {0: ["7g.80gb"]})
    now = time.gmtime()
    closed = {"start": f"{(now.tm_hour + 2) % 24:02d}:00", "end": f"{(now.tm_hour + 3) % 24:02d}:00"}
    policy = h.policy(windows=[closed])
    h.controller("ctl-1")
    h.gated_pod("waits", "1g.10gb")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert h.in_flight(node) == 0 and h.layouts(node)[0] == ["7g.80gb"], "reshaped outside the window"
        time.sleep(0.25)
    assert h.node_of("waits") is None
    opened = {"start": f"{(now.tm_hour + 23) % 24:02d}:00", "end": f"{(now.tm_hour + 2) % 24:02d}:00"}
    h.custom.patch_cluster_custom_object(GROUP, VERSION, "sharingpolicies", policy,
                                         {"spec": {"reshaping": {"windows": [opened]}}})
    assert wait_for("the pod bound once the window opens", lambda: h.node_of("waits")) == node


def test_a_whole_day_window_lets_the_controller_and_the_agent_reshape(h: Harness) -> None:
    """A window whose start equals its end is the whole day for both readers: the controller
    plans the reshape and the agent applies it (the controller once read it as never open)."""
    node = h.node("allday", 1, {0: ["7g.80gb"]})
    from sharing.api.crd import WEEKDAYS

    today = WEEKDAYS[time.gmtime().tm_wday]
    h.policy(windows=[{"start": "03:00", "end": "03:00", "days": [today]}])
    h.controller("ctl-1")
    h.gated_pod("reshaped", "1g.10gb")
    assert wait_for("the pod bound after a reshape", lambda: h.node_of("reshaped")) == node
    assert "1g.10gb" in h.layouts(node)[0]

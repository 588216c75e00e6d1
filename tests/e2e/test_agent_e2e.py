"""Node agents for SIMULATED GPU nodes against the real control plane.

Each agent runs in a thread as the ``gpupack-node-agent`` ServiceAccount (so its
RBAC is exercised), with the simulated NVML backend and the device-plugin
emulator. The story: the agent publishes ``GPUNode`` status; a spec change
reshapes an idle GPU, the emulated device plugin re-advertises and kube-scheduler
binds a pending pod that needs the new profile; a GPU whose instance a running pod
holds is left alone until the pod goes away, then reshaped too. And an agent process
playing a usage trace shows the trace's use on its metrics endpoint.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from node.agent import Agent
from node.base.kube import Kube
from node.metrics import AgentMetrics
from node.base.settings import AgentSettings
from gpupack.cli_agent import open_backend
from gpupack.demo.usage import pod_series
from gpupack.devcluster.process import free_port
from gpupack.testing.usage_traces import GIB, write_usage_trace
from tests.e2e.waiting import wait_for
from tests.processes import stop_process

WAIT_S = 60.0
REPO = Path(__file__).resolve().parents[2]


def _wait(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    return wait_for(what, probe, timeout_s, interval_s=0.1)


class RunningAgent:
    def __init__(self, kubeconfig: Path, settings: AgentSettings, metrics: AgentMetrics | None = None) -> None:
        backend, error = open_backend(settings)
        self.agent = Agent(settings, backend, Kube.connect(str(kubeconfig)), backend_error=error,
                           metrics=metrics or AgentMetrics())
        self._stop = False
        self.thread = threading.Thread(target=self.agent.run_forever, args=(lambda: self._stop,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop = True
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "agent did not stop"


@pytest.fixture
def node_name(admin_client: Any) -> Iterator[str]:
    """A Ready Node (no kubelet) whose Node and GPUNode are deleted afterwards.

    The control plane serves the whole test session, and the webhook's e2e tests
    read every GPUNode: a leftover simulated GPU would look like free capacity.
    Tests request this fixture before ``agent_factory``, so the agents are
    stopped before the objects go (a running agent would recreate its GPUNode).
    """
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(admin_client)
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=name, labels={"e2e-run": name, "kubernetes.io/hostname": name,
                           "nvidia.com/gpu.deploy.device-plugin": "true"})))
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    core.patch_node_status(name, {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
    # The API server's TaintNodesByCondition admission taints new Nodes not-ready; without a
    # node-lifecycle controller nobody lifts it, so the test does (its Node is Ready).
    core.patch_node(name, {"spec": {"taints": None}})
    yield name
    custom = client.CustomObjectsApi(admin_client)
    for delete in (lambda: custom.delete_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", name),
                   lambda: core.delete_node(name)):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise


POLICY_RBAC = Path(__file__).resolve().parents[2] / "manifests" / "agent" / "rbac-policies.yaml"


@pytest.fixture
def agent_factory(
    agent_kubeconfig: Callable[[str], Path], tmp_path: Path, apply_manifests: Callable[..., list[dict[str, Any]]],
) -> Iterator[Callable[[str, str], RunningAgent]]:
    apply_manifests(POLICY_RBAC)  # the agent reads the SharingPolicies that select its node
    agents: list[RunningAgent] = []

    def start(node: str, simulate: str) -> RunningAgent:
        settings = AgentSettings(node_name=node, simulate=simulate, state_file=str(tmp_path / f"{node}.json"),
                                 emulate_device_plugin=True, poll_seconds=0.5, min_patch_seconds=0.2,
                                 idle_seconds=1.0, retry_seconds=1.0, metrics_port=0)
        agent = RunningAgent(agent_kubeconfig(node), settings)  # a token bound to a pod on its node
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        if agent.thread.is_alive():
            agent.stop()


def _gpunode(admin: Any, name: str) -> dict[str, Any]:
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(admin).get_cluster_custom_object(  # type: ignore[assignment]
            "gpupack.io", "v1alpha1", "gpunodes", name)
        return obj
    except client.ApiException as exc:
        if exc.status == 404:
            return {}  # the agent has not created it yet
        raise


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def _allocatable(admin: Any, node: str) -> dict[str, str]:
    status: Any = client.CoreV1Api(admin).read_node(node).status
    return dict(status.allocatable or {})


def _set_spec(admin: Any, node: str, layouts: dict[int, list[str]]) -> None:
    gpus = [{"index": i, "migEnabled": True, "layout": [{"profile": p} for p in profiles]}
            for i, profiles in sorted(layouts.items())]
    client.CustomObjectsApi(admin).patch_cluster_custom_object(
        "gpupack.io", "v1alpha1", "gpunodes", node, {"spec": {"gpus": gpus}})


def _pod(admin: Any, namespace: str, node: str, resource: str) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(node_selector={"e2e-run": node}, containers=[client.V1Container(
            name="main", image="registry.k8s.io/pause:3.10",
            resources=client.V1ResourceRequirements(limits={resource: "1"}))])))
    return name


def _bound(admin: Any, namespace: str, pod: str) -> str | None:
    spec: Any = client.CoreV1Api(admin).read_namespaced_pod(pod, namespace).spec
    return spec.node_name  # type: ignore[no-any-return]


def test_agent_publishes_reshapes_idle_gpus_and_spares_busy_ones(
    admin_client: Any, namespace: str, node_name: str, agent_factory: Callable[[str, str], RunningAgent]
) -> None:
    node = node_name
    agent = agent_factory(node, "H200:2")

    # 1. Inventory published: two simulated H200s, NVML ready (and labelled simulated).
    obj = _wait("GPUNode status with 2 GPUs",
                lambda: (o := _gpunode(admin_client, node)) and len((o.get("status") or {}).get("gpus", [])) == 2 and o)
    assert _condition(obj, "NvmlReady")["status"] == "True"
    assert _condition(obj, "NvmlReady")["reason"] == "Simulated"
    uuids = [g["uuid"] for g in obj["status"]["gpus"]]
    meta: Any = client.CoreV1Api(admin_client).read_node(node).metadata
    labels = meta.labels
    assert labels["gpupack.io/simulated"] == "true" and labels["nvidia.com/gpu.product"] == "NVIDIA-H200"

    # 2. A layout: GPU0 one 7g, GPU1 two 3g. The emulated device plugin advertises them.
    began = time.monotonic()
    _set_spec(admin_client, node, {0: ["7g.141gb"], 1: ["3g.71gb", "3g.71gb"]})
    _wait("allocatable for the first layout", lambda: (a := _allocatable(admin_client, node)).get(
        "nvidia.com/mig-7g.141gb") == "1" and a.get("nvidia.com/mig-3g.71gb") == "2")
    first_latency = time.monotonic() - began
    obj = _wait("LayoutApplied=True", lambda: (o := _gpunode(admin_client, node))
                and _condition(o, "LayoutApplied").get("status") == "True" and o)
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert obj["status"]["reconfiguration"]["phase"] == "Succeeded"

    # 3. A pod takes the 7g instance on GPU0 (bound by kube-scheduler; the emulator gives it the device).
    holder = _pod(admin_client, namespace, node, "nvidia.com/mig-7g.141gb")
    _wait("holder pod bound", lambda: _bound(admin_client, namespace, holder) == node)
    _wait("7g instance in use by the holder pod", lambda: any(
        i.get("inUse") and f"{namespace}/{holder}" in i.get("pods", [])
        for i in _gpunode(admin_client, node)["status"]["gpus"][0]["instances"]))

    # 4. A pod needs a 1g.18gb, which nobody advertises yet: it stays Pending.
    waiting = _pod(admin_client, namespace, node, "nvidia.com/mig-1g.18gb")
    time.sleep(1.0)
    assert _bound(admin_client, namespace, waiting) is None

    # 5. New spec: GPU0 (busy) to seven 1g, GPU1 (idle) to 3g + four 1g. Only GPU1 changes now.
    _set_spec(admin_client, node, {0: ["1g.18gb"] * 7, 1: ["3g.71gb"] + ["1g.18gb"] * 4})
    _wait("GPU1 reshaped and advertised", lambda: _allocatable(admin_client, node).get("nvidia.com/mig-1g.18gb") == "4")
    assert _wait("pending pod scheduled onto the new 1g", lambda: _bound(admin_client, namespace, waiting)) == node
    obj = _wait("GPU0 reported as waiting", lambda: (o := _gpunode(admin_client, node))
                and _condition(o, "LayoutApplied").get("reason") == "WaitingForIdle" and o)
    assert "GPU 0" in _condition(obj, "LayoutApplied")["message"]
    gpu0 = obj["status"]["gpus"][0]["instances"]
    assert [(i["profile"], i["inUse"]) for i in gpu0] == [("7g.141gb", True)]
    assert _allocatable(admin_client, node).get("nvidia.com/mig-7g.141gb") == "1"

    # 6. The holder goes away: after the idle time GPU0 is reshaped as well.
    client.CoreV1Api(admin_client).delete_namespaced_pod(holder, namespace, grace_period_seconds=0)
    _wait("GPU0 reshaped", lambda: _allocatable(admin_client, node).get("nvidia.com/mig-1g.18gb") == "11")
    assert _allocatable(admin_client, node).get("nvidia.com/mig-7g.141gb") == "0"
    obj = _wait("LayoutApplied=True again", lambda: (o := _gpunode(admin_client, node))
                and _condition(o, "LayoutApplied").get("status") == "True" and o)
    assert sorted(i["profile"] for i in obj["status"]["gpus"][0]["instances"]) == ["1g.18gb"] * 7
    # The pod on GPU1's new 1g instance kept its device through GPU0's reshape.
    gpu1 = obj["status"]["gpus"][1]["instances"]
    assert any(f"{namespace}/{waiting}" in i["pods"] for i in gpu1)

    events = client.CoreV1Api(admin_client).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node}").items
    reasons = {e.reason for e in events}
    assert {"MigReconfigurationStarted", "MigReconfigurationSucceeded"} <= reasons

    # 7. Restart: a new agent on the same state file sees the same GPUs and instances.
    agent.stop()
    agent_factory(node, "H200:2")
    time.sleep(1.5)
    obj = _gpunode(admin_client, node)
    assert [g["uuid"] for g in obj["status"]["gpus"]] == uuids
    assert sorted(i["profile"] for i in obj["status"]["gpus"][0]["instances"]) == ["1g.18gb"] * 7
    print(f"\nreconcile latency (spec change -> Node allocatable), first layout: {first_latency:.2f}s")


def test_layout_that_does_not_fit_is_refused_and_nothing_changes(
    admin_client: Any, node_name: str, agent_factory: Callable[[str, str], RunningAgent]
) -> None:
    node = node_name
    agent_factory(node, "A30:1")
    _wait("status", lambda: (_gpunode(admin_client, node).get("status") or {}).get("gpus"))
    _set_spec(admin_client, node, {0: ["4g.24gb", "1g.6gb"]})
    obj = _wait("LayoutRefused", lambda: (o := _gpunode(admin_client, node))
                and _condition(o, "LayoutApplied").get("reason") == "LayoutRefused" and o)
    assert "does not fit" in _condition(obj, "LayoutApplied")["message"]
    assert obj["status"]["gpus"][0]["instances"] == []
    assert not any(k.startswith("nvidia.com/mig-") and v != "0" for k, v in _allocatable(admin_client, node).items())


def test_sharing_policy_freezes_the_layout_until_lifted(
    admin_client: Any, node_name: str, agent_factory: Callable[[str, str], RunningAgent]
) -> None:
    node = node_name
    custom = client.CustomObjectsApi(admin_client)
    policy = {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": f"freeze-{node}"},
              "spec": {"nodeSelector": {"matchLabels": {"e2e-run": node}}, "reshaping": {"maxConcurrent": 0}}}
    custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "sharingpolicies", policy)
    agent_factory(node, "H100:1")
    _wait("status", lambda: (_gpunode(admin_client, node).get("status") or {}).get("gpus"))
    _set_spec(admin_client, node, {0: ["7g.80gb"]})
    obj = _wait("ReshapingNotAllowed", lambda: (o := _gpunode(admin_client, node))
                and _condition(o, "LayoutApplied").get("reason") == "ReshapingNotAllowed" and o)
    assert f"frozen by SharingPolicy freeze-{node}" in _condition(obj, "LayoutApplied")["message"]
    assert obj["status"]["gpus"][0]["instances"] == []
    custom.delete_cluster_custom_object("gpupack.io", "v1alpha1", "sharingpolicies", f"freeze-{node}")
    _wait("reshaped once the policy is gone",
          lambda: _allocatable(admin_client, node).get("nvidia.com/mig-7g.80gb") == "1")


def test_an_agent_playing_a_usage_trace_shows_the_traces_use_on_its_metrics_endpoint(
    admin_client: Any, namespace: str, node_name: str, agent_kubeconfig: Callable[[str], Path], tmp_path: Path,
    apply_manifests: Callable[..., list[dict[str, Any]]],
) -> None:
    """A real ``gpupack agent run --usage-trace`` process: the pod kube-scheduler binds to its simulated T4 plays
    the trace's one pod, 10 trace minutes a second, and its series follow the trace from one phase to the next."""
    apply_manifests(POLICY_RBAC)
    # 400 steps (40 s at scale 600) at 37.5 % and 7 GiB, then 62.5 % and 9 GiB for the rest of the test.
    trace = write_usage_trace(tmp_path / "trace", {"p": [(37.5, 7 * GIB)] * 400 + [(62.5, 9 * GIB)] * 2000})
    port = free_port()
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpupack", "agent", "run", "--node", node_name, "--simulate", "T4:1",
         "--state-file", str(tmp_path / "gpus.json"), "--emulate-device-plugin", "--poll-seconds", "0.5",
         "--metrics-port", str(port), "--usage-trace", str(trace), "--usage-time-scale", "600",
         "--kubeconfig", str(agent_kubeconfig(node_name))],
        cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    try:
        _wait("nvidia.com/gpu advertised", lambda: _allocatable(admin_client, node_name).get("nvidia.com/gpu") == "1")
        pod = _pod(admin_client, namespace, node_name, "nvidia.com/gpu")
        url = f"http://127.0.0.1:{port}/metrics"
        first = _wait("the trace's first phase on the metrics endpoint", lambda: (
            s := pod_series(url).get((namespace, pod), {})).get("DCGM_FI_DEV_GPU_UTIL") == 37.5 and s)
        assert first["DCGM_FI_DEV_FB_USED"] == 7 * 1024 and first["gpupack_pod_gpu_use_attributed"] == 1.0
        second = _wait("the trace's second phase", lambda: (
            s := pod_series(url).get((namespace, pod), {})).get("DCGM_FI_DEV_GPU_UTIL") == 62.5 and s, 90)
        assert second["DCGM_FI_DEV_FB_USED"] == 9 * 1024
    finally:
        stop_process(agent)
        print(log.read_text()[-3000:])

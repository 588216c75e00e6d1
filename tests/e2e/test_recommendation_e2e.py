"""The right-sizer's publication and recommender on the real control plane (issue 35).

A SIMULATED node agent (in a thread, as ``gpupack-node-agent`` confined to its node) runs two
pods of one Deployment on a time-sliced GPU (under MPS the simulated NVML, as the real one,
samples only the MPS server, so the replicas' compute would be unattributed), each with a process
of given SM load and memory; it publishes their use histories in its GPUNode's ``status.usage``
every second. The controller
(``gpupack controller run``, a subprocess, as ``gpupack-controller``) runs its recommender every
second with a minimum history of 20 s. The Deployment's ``GPURecommendation`` first says
``NotEnoughHistory``, then carries the size the recommender's own rules give for that use, and
the API server renders it with the columns ``kubectl get gpurec`` shows.

The same test runs on each usage source (``--usage-source``): ``agents`` reads the histories the
agent publishes; ``prometheus`` reads the per-pod series the agent exports on its real
``/metrics`` endpoint from a real Prometheus server (``tools/prometheus/build.sh``) scraping it
every second. Both must give the same size, and say their source in ``status.source``. The
Prometheus source samples once per the recommender's 60 s interval, so its run waits for two
such instants (about two minutes).
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import start_http_server

from gpupack.devcluster.process import ManagedProcess
from node.agent import Agent
from node.base.kube import Kube
from node.base.pods import sim_pid
from node.base.settings import AgentSettings
from node.metrics import AgentMetrics
from node.nvml.simulated import simulated_backend
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.crd import GROUP, NodeUsage, VERSION
from sharing.api.keys import ALLOCATION_ANNOTATION, SHARED_RESOURCE
from sharing.usage.recommender import Recommendation, Recommender, RecommenderSettings
from sharing.usage.sizing import size_for
from tests.e2e.tables import table_row
from tests.e2e.test_prometheus_source import JOB, _free_port, prometheus_server
from tests.e2e.waiting import wait_for

__all__ = ["prometheus_server"]  # the fixture, shared with the Prometheus source's e2e test

MIB = 1024**2
MIN_OBSERVED_S = 20
LOADS = {"a": (30.0, 6000), "b": (20.0, 3000)}
"""Per replica: SM percent and GPU memory (MiB) of its process."""


def _replica(name: str, rs: str, template_hash: str) -> dict[str, Any]:
    allocation = Allocation(mode="time-slicing", gated=False, capacity_existed=True, policy="e2e", reason="e2e",
                            containers=(ContainerAllocation("main", "containers", 250, 16 * 1024 * MIB,
                                                            SHARED_RESOURCE),))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "labels": {"pod-template-hash": template_hash},
        "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()},
        # Owned by a Deployment's ReplicaSet (which no controller-manager here reconciles).
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": str(uuid.uuid4()),
                             "controller": True}]},
        "spec": {"containers": [{"name": "main", "image": "example.com/app:1",
                                 "resources": {"limits": {SHARED_RESOURCE: "1"}}}]}}


@pytest.fixture
def gpu_node(admin_client: Any, gpupack_installed: Any) -> Iterator[str]:
    """A Ready Node (no kubelet) and its GPUNode, sharing its GPU by time-slicing; deleted afterwards."""
    name = f"rec-{uuid.uuid4().hex[:6]}"
    core, custom = client.CoreV1Api(admin_client), client.CustomObjectsApi(admin_client)
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={
        "kubernetes.io/hostname": name, "nvidia.com/gpu.deploy.device-plugin": "true"})))
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
    core.patch_node(name, {"spec": {"taints": None}})
    custom.create_cluster_custom_object(GROUP, VERSION, "gpunodes", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": {"name": name},
        "spec": {"sharing": {"mode": "time-slicing", "replicas": 4}}})
    yield name
    custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodes", name)
    core.delete_node(name)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[ManagedProcess]]:
    running: list[ManagedProcess] = []
    yield running
    for proc in running:
        log = proc.log_path.read_text(errors="replace")[-2000:] if proc.log_path.exists() else ""
        proc.stop(grace_s=5.0)
        print(f"--- {proc.name} ---\n{log}")


SOURCES = {"agents": "Agents", "prometheus": "Prometheus"}
"""``--usage-source`` -> the ``status.source`` it writes."""


@pytest.mark.parametrize("source", list(SOURCES))
def test_a_workloads_use_becomes_its_recommendation(
        admin_client: Any, gpu_node: str, namespace: str, tmp_path: Path, processes: list[ManagedProcess],
        sa_kubeconfig: Callable[[str], Path], agent_kubeconfig: Callable[[str], Path], source: str,
        request: pytest.FixtureRequest) -> None:
    core, custom = client.CoreV1Api(admin_client), client.CustomObjectsApi(admin_client)
    uids: dict[str, str] = {}
    for replica in LOADS:
        body = _replica(f"web-7c9d4-{replica}", "web-7c9d4", "7c9d4")
        body["spec"]["nodeName"] = gpu_node
        created: Any = core.create_namespaced_pod(namespace, body)  # type: ignore[arg-type]
        uids[replica] = str(created.metadata.uid)
    # Each replica's process, given its load and memory before the agent starts: the emulated
    # device plugin keeps a process it finds for a pod it places.
    state = tmp_path / f"{gpu_node}.json"
    sim = simulated_backend("H100-80GB", 1, state, gpu_node, mig_enabled=False)
    for replica, (sm, memory) in LOADS.items():
        sim.start_process(0, sim_pid(uids[replica]), memory)
        sim.set_process_load(0, sim_pid(uids[replica]), sm)

    metrics = AgentMetrics()
    reading = ["--usage-source", source]
    if source == "prometheus":  # the agent's /metrics, scraped by a real Prometheus every second
        agent_port = _free_port()
        server, _thread = start_http_server(agent_port, addr="127.0.0.1", registry=metrics.registry)
        request.addfinalizer(server.shutdown)
        url = request.getfixturevalue("prometheus_server")(agent_port)
        reading += ["--prometheus-url", url, "--prometheus-selector", f'job="{JOB}"']
    controller = ManagedProcess("controller", [
        sys.executable, "-m", "gpupack", "controller", "run", "--kubeconfig", str(sa_kubeconfig("gpupack-controller")),
        "--metrics-port", "0", "--namespaces", namespace, "--identity", "rec-e2e", "--lease-name",
        f"rec-{uuid.uuid4().hex[:6]}", "--lease-seconds", "4", "--resync-seconds", "1",
        "--recommend-seconds", "1", "--recommend-min-observed-seconds", str(MIN_OBSERVED_S), *reading],
        tmp_path / "controller.log")
    controller.start()
    processes.append(controller)

    settings = AgentSettings(node_name=gpu_node, simulate="H100-80GB:1", state_file=str(state),
                             emulate_device_plugin=True, poll_seconds=0.5, min_patch_seconds=0.2,
                             usage_publish_seconds=1.0, metrics_port=0)
    agent = Agent(settings, simulated_backend("H100-80GB", 1, state, gpu_node, mig_enabled=False),
                  Kube.connect(str(agent_kubeconfig(gpu_node))), metrics=metrics)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run_forever, args=(stop.is_set,), daemon=True)
    thread.start()
    try:
        def published() -> NodeUsage | None:
            obj: Any = custom.get_cluster_custom_object(GROUP, VERSION, "gpunodes", gpu_node)
            status = obj.get("status") or {}
            usage = NodeUsage.model_validate(status["usage"]) if status.get("usage") else None
            return usage if usage and len([p for p in usage.pods if p.samples]) == 2 else None

        usage = wait_for("both replicas' use published", published, 60)
        assert {p.pod for p in usage.pods} == {f"{namespace}/web-7c9d4-{r}" for r in LOADS}
        assert all(not p.unattributed and p.container == "main" for p in usage.pods)

        def recommendation() -> dict[str, Any] | None:
            try:
                obj: dict[str, Any] = custom.get_namespaced_custom_object(  # type: ignore[assignment]
                    GROUP, VERSION, namespace, "gpurecommendations", "deployment-web")
            except client.ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return obj if (obj.get("status") or {}).get("conditions") else None

        first = wait_for("the Deployment's GPURecommendation", recommendation, 90 if source == "agents" else 180)
        cond = first["status"]["conditions"][0]
        assert (cond["type"], cond["status"], cond["reason"]) == ("RecommendationProvided", "False", "NotEnoughHistory")
        assert first["spec"]["targetRef"] == {"kind": "Deployment", "name": "web"}

        done = wait_for("a recommendation", lambda: (r := recommendation()) and r["status"].get("containers") and r,
                        120 if source == "agents" else 180)
    finally:
        stop.set()
        thread.join(timeout=15)
    status = done["status"]
    [container] = status["containers"]
    duty = RecommenderSettings().duty
    p99 = duty.bucket_start(duty.bucket(max(sm for sm, _ in LOADS.values())) + 1)  # the busier replica's bucket
    assert container["gpuMilli"] == size_for(Recommendation(min(100.0, p99 * 1.15), 0, 0, 0, 0), 80 * 1024 * MIB).milli
    peak = max(m for _, m in LOADS.values())  # MiB; the margin shrinks as the history grows (recommender.py)
    margin = Recommender(RecommenderSettings(min_observed_s=MIN_OBSERVED_S)).memory_margin(container["observedSeconds"])
    assert abs(int(container["gpuMemory"].removesuffix("Mi")) - peak * (1 + margin)) <= 1 + peak * 0.002
    assert (container["containerName"], container["pods"], container["ooms"]) == ("main", 2, 0)
    assert container["observedSeconds"] >= MIN_OBSERVED_S
    assert (status["mode"], status["source"], status["conditions"][0]["reason"]) == ("Off", SOURCES[source],
                                                                                      "Recommended")

    # What `kubectl get gpurec` asks for: the server renders the printer columns.
    row = table_row(admin_client, f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/gpurecommendations/deployment-web")
    assert (row["Name"], row["Kind"], row["Workload"]) == ("deployment-web", "Deployment", "web")
    assert (row["GPU-Milli"], row["GPU-Memory"]) == (container["gpuMilli"], container["gpuMemory"])
    assert (row["Mode"], row["Provided"]) == ("Off", "True")

"""The recommender's Prometheus source against a real Prometheus server scraping a real node agent.

A node agent (its own thread, the simulated NVML, the emulated device plugin, against the real
control plane) runs two pods time-slicing one simulated T4: a bare pod and a Deployment's pod (owned
by a ReplicaSet, so the source must lift it to its Deployment). The test gives each pod's process
an SM load that changes halfway; the agent attributes the samples to the pods through the process
owners it resolves and exports them per pod on its real ``/metrics`` endpoint. Prometheus, built
from its Go module (``tools/prometheus/build.sh``), scrapes it every second.

``controller.usage_prometheus.PrometheusUsageSource`` then reads the period back over
Prometheus's HTTP API, in two reads, into a ``Recommender``; a second ``Recommender`` gets the
agent's own per-pod samples of the same period, recorded as the agent published them. Their
histories must agree: each duty-cycle percentile within one histogram bucket, the same memory
peak.

A second test runs the pods as MPS clients (the simulated NVML gives their SM time to the MPS
server, as the real one does): their memory alone is theirs, and one grows to its MPS memory limit
(its allocation record's), a hit the agent counts and exports. The source must learn both pods'
memory without observed time, and raise the hitting pod's memory at once, as the agents source
does from the agent's published record. No mocks: a real agent, real HTTP, a real Prometheus.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import start_http_server

from controller.state.prometheus_usage import Matrix, samples_of
from controller.usage_prometheus import PrometheusUsageSource
from controller.usage_source import with_hits
from node.base.pods import sim_pid
from node.base.settings import AgentSettings
from node.metrics import AgentMetrics
from node.nvml.simulated import SimulatedNvml
from node.usage.attribution import PodGpuUse
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION, SHARED_RESOURCE
from sharing.usage.recommender import MIB, Recommender, RecommenderSettings, WorkloadKey
from tests.e2e.test_agent_e2e import POLICY_RBAC, RunningAgent, _allocatable, _gpunode, _wait, node_name

__all__ = ["node_name"]  # the Node fixture, shared with the agent's e2e tests

JOB = "gpupack-node-agent"
PHASE_S = (15.0, 25.0)
"""Seconds of each load phase: 37.5 % and 62.5 % of the period, so every percentile checked lies well
inside one phase's share."""
LOADS = {"solo": (20.0, 70.0), "web": (60.0, 10.0)}
"""SM percent of each pod's process in each phase."""
PERCENTILES = (0.2, 0.5, 0.75, 0.95)


class RecordingMetrics(AgentMetrics):
    """The agent's metrics, also keeping every per-pod use it published, with the time of the poll."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[tuple[float, Sequence[PodGpuUse]]] = []

    def observe_pod_usage(self, uses: Sequence[PodGpuUse]) -> None:
        super().observe_pod_usage(uses)
        self.published.append((time.time(), tuple(uses)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus_server(prometheus_binary: Path, tmp_path: Path) -> Iterator[Callable[[int], str]]:
    """``start(agent_port)`` -> the URL of a Prometheus scraping ``127.0.0.1:agent_port`` every second."""
    procs: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "prometheus.log"

    def start(agent_port: int) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}]}))
        port = _free_port()
        procs.append(subprocess.Popen(
            [str(prometheus_binary), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log.open("ab"), stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        _wait("Prometheus ready", lambda: _answers(url + "/-/ready") or procs[0].poll() is not None)
        assert procs[0].poll() is None, f"Prometheus exited: {log.read_text()[-3000:]}"
        return url

    yield start
    for proc in procs:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - a local http URL
            return bool(response.status == 200)
    except OSError:
        return False


def _scraped(url: str, metric: str = "DCGM_FI_DEV_GPU_UTIL") -> bool:
    """Prometheus has the agent's per-pod series ``metric`` of both pods."""
    query = urllib.parse.urlencode({"query": f'count({metric}{{job="{JOB}",pod!=""}})'})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=2) as response:  # noqa: S310
            result = json.loads(response.read())["data"]["result"]
    except OSError:
        return False
    return bool(result) and result[0]["value"][1] == "2"


def _pod(admin: Any, namespace: str, node: str, name: str, owner: dict[str, Any] | None = None,
         labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> None:
    client.CoreV1Api(admin).create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations,
                                     owner_references=[owner] if owner else None),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(
            name="main", image="registry.k8s.io/pause:3.10",
            resources=client.V1ResourceRequirements(limits={SHARED_RESOURCE: "1"}))])))


def _agent_matrices(published: list[tuple[float, Sequence[PodGpuUse]]], start: float, end: float
                    ) -> tuple[Matrix, Matrix]:
    """The agent's own attributed samples in ``start..end``, as the two series a range query answers."""
    duty: Matrix = {}
    memory: Matrix = {}
    for at, uses in published:
        if not start <= at <= end:
            continue
        for use in uses:
            if use.attributed and use.sm_percent is not None and use.memory_used_mib is not None:
                key = (use.namespace, use.name, use.container)
                duty.setdefault(key, {})[at] = use.sm_percent
                memory.setdefault(key, {})[at] = float(use.memory_used_mib)
    return duty, memory


@dataclass
class TwoPods:
    """A running agent on a simulated T4 shared by two pods: a bare pod, ``solo``, and a Deployment's, ``web``."""

    running: RunningAgent
    sim: SimulatedNvml
    agent_port: int
    pods: dict[str, dict[str, Any]]
    """The pod objects by ``namespace/name``."""
    pids: dict[str, int]
    """``solo`` / ``web`` -> its simulated process."""


@contextmanager
def _two_pods(admin: Any, node: str, namespace: str, kubeconfig: Path, tmp_path: Path, metrics: AgentMetrics,
              mode: str, solo_annotations: dict[str, str] | None = None) -> Iterator[TwoPods]:
    """The agent serving its ``/metrics`` on a local port, its GPU shared by ``mode``, both pods' processes up."""
    settings = AgentSettings(node_name=node, simulate="T4:1", state_file=str(tmp_path / "gpus.json"),
                             emulate_device_plugin=True, poll_seconds=1.0, min_patch_seconds=0.2,
                             idle_seconds=1.0, retry_seconds=1.0, metrics_port=0)
    agent_port = _free_port()
    server, _thread = start_http_server(agent_port, addr="127.0.0.1", registry=metrics.registry)
    running = RunningAgent(kubeconfig, settings, metrics)
    try:
        sim = running.agent.backend
        assert isinstance(sim, SimulatedNvml)
        _wait("GPUNode status", lambda: (_gpunode(admin, node).get("status") or {}).get("gpus"))
        client.CustomObjectsApi(admin).patch_cluster_custom_object(
            "gpupack.io", "v1alpha1", "gpunodes", node, {"spec": {"sharing": {"mode": mode, "replicas": 4}}})
        _wait(f"{mode} shares advertised", lambda: _allocatable(admin, node).get(SHARED_RESOURCE) == "4")
        template_hash = "5d8f7c9b4"
        _pod(admin, namespace, node, "solo", annotations=solo_annotations)
        _pod(admin, namespace, node, f"web-{template_hash}-x2k9q",
             owner={"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"web-{template_hash}",
                    "uid": str(uuid.uuid4()), "controller": True},
             labels={"pod-template-hash": template_hash})
        listed: list[dict[str, Any]] = admin.sanitize_for_serialization(
            client.CoreV1Api(admin).list_namespaced_pod(namespace).items)
        pods = {f"{namespace}/{p['metadata']['name']}": p for p in listed}
        pids = {name.split("/")[1].split("-")[0]: sim_pid(pod["metadata"]["uid"]) for name, pod in pods.items()}
        _wait("both pods' processes running", lambda: {p.pid for p in sim.processes(0)} >= set(pids.values()))
        yield TwoPods(running, sim, agent_port, pods, pids)
    finally:
        running.stop()
        server.shutdown()


def test_the_prometheus_source_feeds_what_the_agent_measured(
    admin_client: Any, node_name: str, namespace: str, agent_kubeconfig: Callable[[str], Path],
    apply_manifests: Callable[..., list[dict[str, Any]]], prometheus_server: Callable[[int], str], tmp_path: Path,
) -> None:
    apply_manifests(POLICY_RBAC)  # the agent reads the SharingPolicies that select its node
    metrics = RecordingMetrics()
    # Time-slicing: under MPS only the MPS server is sampled (as by the real NVML), so no pod's compute is.
    with _two_pods(admin_client, node_name, namespace, agent_kubeconfig(node_name), tmp_path, metrics,
                   "time-slicing") as node:
        sim, pods, pids = node.sim, node.pods, node.pids
        url = prometheus_server(node.agent_port)
        for who, pid in pids.items():
            sim.set_process_load(0, pid, LOADS[who][0])
        _wait("Prometheus scraped both pods' use", lambda: _scraped(url), 30)
        time.sleep(2.0)  # the first phase's load reached the agent's samples and a scrape
        start = time.time()
        time.sleep(PHASE_S[0])
        for who, pid in pids.items():
            sim.set_process_load(0, pid, LOADS[who][1])
        time.sleep(PHASE_S[1])
        end = time.time()
        time.sleep(3.0)  # the last scrape of the period is in Prometheus before it is read

        # Two reads, the second going on where the first ended: the first (at start + lookback) reaches back
        # to the period's start, the second (at end) to where the first stopped, within its lookback.
        lookback = (end - start) / 2 + 1
        source = PrometheusUsageSource(url, selector=f'job="{JOB}"', lookback_s=lookback)
        from_prometheus = Recommender(RecommenderSettings(sample_interval_s=1.0))
        source.feed(from_prometheus, pods, start + lookback)
        first_read = source.last_counts
        source.feed(from_prometheus, pods, end)
        from_agent = Recommender(RecommenderSettings(sample_interval_s=1.0))
        samples, _counts = samples_of(*_agent_matrices(metrics.published, start, end), pods)
        for s in samples:
            assert s.duty_percent is not None  # the agent's attributed samples: every one has its duty cycle
            from_agent.observe(s.key, s.time_s, s.duty_percent, s.memory_bytes)

    keys = {WorkloadKey(namespace, "Pod", "solo", "main"), WorkloadKey(namespace, "Deployment", "web", "main")}
    assert set(from_prometheus.histories) == set(from_agent.histories) == keys
    assert first_read.series == 2 and first_read.skipped_series == 0 and first_read.samples > 0
    duty_shape = from_prometheus.settings.duty
    for key in keys:
        ours, theirs = from_prometheus.histories[key], from_agent.histories[key]
        assert abs(ours.samples - (end - start)) <= 2, (key, ours.samples)  # one per second, none twice
        low, high = sorted(LOADS["solo" if key.kind == "Pod" else "web"])
        for q in PERCENTILES:
            a, b = ours.duty.percentile(q), theirs.duty.percentile(q)
            assert abs(duty_shape.bucket(a) - duty_shape.bucket(b)) <= 1, (key, q, a, b)
        # The loads themselves: the low one's share is 37.5 % or 62.5 %, never under 20 % or over 95 %.
        assert duty_shape.bucket(ours.duty.percentile(0.2)) in {duty_shape.bucket(low), duty_shape.bucket(low) + 1}
        assert duty_shape.bucket(ours.duty.percentile(0.95)) in {duty_shape.bucket(high),
                                                                   duty_shape.bucket(high) + 1}
        assert ours.memory.peak() == theirs.memory.peak() == 1024 * MIB  # the emulated process's memory


MPS_LIMIT_MIB = 4096
"""The memory the solo pod's allocation record gives it (its MPS pinned memory limit)."""


def test_an_mps_clients_memory_and_limit_hit_come_through_prometheus_as_from_the_agent(
    admin_client: Any, node_name: str, namespace: str, agent_kubeconfig: Callable[[str], Path],
    apply_manifests: Callable[..., list[dict[str, Any]]], prometheus_server: Callable[[int], str], tmp_path: Path,
) -> None:
    apply_manifests(POLICY_RBAC)
    record = Allocation(mode="mps", gated=False, capacity_existed=True, policy="p", reason="e2e", containers=(
        ContainerAllocation("main", "containers", 250, MPS_LIMIT_MIB * MIB, SHARED_RESOURCE),))
    with _two_pods(admin_client, node_name, namespace, agent_kubeconfig(node_name), tmp_path, AgentMetrics(), "mps",
                   {ALLOCATION_ANNOTATION: record.to_annotation()}) as node:
        sim, pods, pids, running = node.sim, node.pods, node.pids, node.running
        for pid in pids.values():
            sim.set_process_load(0, pid, 40.0)  # sampled to the MPS server: no pod's compute is known

        url = prometheus_server(node.agent_port)
        _wait("Prometheus scraped both pods' memory and hit counters",
              lambda: _scraped(url, "DCGM_FI_DEV_FB_USED") and _scraped(url, "gpupack_pod_gpu_memory_limit_hits_total"),
              30)
        time.sleep(2.0)
        start = time.time()
        sim.set_process_memory(0, pids["web"], 3072)
        sim.set_process_memory(0, pids["solo"], MPS_LIMIT_MIB)  # grows to its pinned limit: an OOM in the pod
        time.sleep(4.0)
        hit_read = time.time()
        sim.set_process_memory(0, pids["solo"], 2048)
        time.sleep(4.0)
        end = time.time()
        time.sleep(3.0)  # the last scrape of the period is in Prometheus before it is read

        # Two reads: the first sees the hit, the second goes on from there and must not count it again.
        source = PrometheusUsageSource(url, selector=f'job="{JOB}"', lookback_s=end - start + 2)
        from_prometheus = Recommender(RecommenderSettings(sample_interval_s=1.0))
        source.feed(from_prometheus, pods, hit_read + 1)
        first_read = source.last_counts
        source.feed(from_prometheus, pods, end)
        second_read = source.last_counts
    published = {r.pod: r for r in running.agent.usage.usage().pods}

    solo, web = WorkloadKey(namespace, "Pod", "solo", "main"), WorkloadKey(namespace, "Deployment", "web", "main")
    assert (first_read.hits, second_read.hits) == (1, 0)
    assert first_read.memory_only > 0 and first_read.samples == first_read.memory_only  # no duty: MPS clients
    ours, theirs = from_prometheus.histories[solo], with_hits(published[f"{namespace}/solo"], from_prometheus.settings)
    assert "no known pod used its SMs" in published[f"{namespace}/solo"].compute_unattributed
    assert ours.samples == theirs.samples == 0  # memory-only time is not observed time
    assert ours.ooms == theirs.ooms == 1
    # Raised at once past the limit, by the same bump as the agents source: the limit times the OOM ratio.
    raised = max(ours.memory.peak(), ours.oom_floor.peak())
    assert raised == max(theirs.memory.peak(), theirs.oom_floor.peak()) > MPS_LIMIT_MIB * MIB
    assert from_prometheus.histories[web].memory.peak() == 3072 * MIB and from_prometheus.histories[web].ooms == 0

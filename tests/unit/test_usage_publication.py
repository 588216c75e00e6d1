"""The agent's compact publication of per-pod use (``node.usage.publication``), ticked on a
simulated shared node (time-slicing, or MPS, where only the MPS server's SM is sampled):
histories per pod container, memory-limit hits per episode, unattributed pods marked for good
(per signal: compute alone, or memory and so everything), a write only every interval and only
when changed, and a restarted agent going on with what it published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.agent import Agent
from node.base.pods import sim_pid
from node.base.settings import AgentSettings
from node.base.snapshot import read_snapshot
from node.metrics import AgentMetrics
from node.nvml import errors
from node.nvml.simulated import Fault, SimulatedNvml, simulated_backend
from node.usage.attribution import PodGpuUse
from node.usage.publication import MIB, PodLimit, UsageAggregator, limit_mib
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.crd import NodeUsage, PodUsage
from sharing.api.keys import ALLOCATION_ANNOTATION, SHARED_RESOURCE
from sharing.usage.compact import decode
from sharing.usage.recommender import RecommenderSettings
from tests.unit.test_nvml_simulated_plain import _pod
from tests.unit.test_pod_usage import H200, _mig
from tests.unit.test_reconciler_agent import Clock, FakeKube

GIB = 1024**3


def _limited(name: str, memory_bytes: int) -> dict[str, Any]:
    """A pod whose allocation record gives its container ``memory_bytes`` (its MPS memory limit; on a
    time-slicing node the limit the agent reads all the same)."""
    pod = _pod(name, SHARED_RESOURCE)
    record = Allocation(mode="mps", gated=False, capacity_existed=True, policy="p", reason="r", containers=(
        ContainerAllocation("c", "containers", 250, memory_bytes, SHARED_RESOURCE),))
    pod["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: record.to_annotation()}
    return pod


def _agent(tmp_path: Path, kube: FakeKube) -> tuple[Agent, SimulatedNvml]:
    sim = simulated_backend("T4", 1, tmp_path / "s.json", "n1")
    settings = AgentSettings(node_name="n1", simulate="T4:1", emulate_device_plugin=True, min_patch_seconds=0.1,
                             metrics_port=0, usage_publish_seconds=5.0)
    return Agent(settings, sim, kube, clock=Clock()), sim  # type: ignore[arg-type]


def _shared_node(tmp_path: Path, mode: str = "time-slicing") -> tuple[Agent, SimulatedNvml, FakeKube]:
    kube = FakeKube("n1")
    agent, sim = _agent(tmp_path, kube)
    agent.tick()
    kube.set_spec({"sharing": {"mode": mode, "replicas": 4}})
    kube.pods = [_limited("a", GIB), _pod("b", SHARED_RESOURCE)]  # a's 1 GiB limit is what its process holds
    for _ in range(3):
        agent.tick()
    sim.clock = Clock()
    return agent, sim, kube


def _published(kube: FakeKube) -> dict[str, PodUsage]:
    assert kube.gpunode is not None
    usage = NodeUsage.model_validate(kube.gpunode["status"]["usage"])
    return {p.pod: p for p in usage.pods}


def test_each_pod_container_is_published_with_its_history_and_limit_hits(tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path)
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    sim.set_process_load(0, sim_pid("uid-b"), 60.0)
    for _ in range(12):
        agent.tick()
    pods = _published(kube)
    assert set(pods) == {"ml/a", "ml/b"} and pods["ml/a"].container == "c" and pods["ml/a"].uid == "uid-a"
    a, _ = decode(pods["ml/a"], RecommenderSettings())
    b, _ = decode(pods["ml/b"], RecommenderSettings())
    assert a.duty.percentile(0.99) == RecommenderSettings().duty.bucket_start(RecommenderSettings().duty.bucket(30) + 1)
    assert b.duty.percentile(0.99) > 60 and b.memory.peak() == 1024 * 1024**2
    # a sat at its limit for every sample: one hit (one episode), not one per sample
    assert (pods["ml/a"].limit_hits, pods["ml/a"].last_hit_limit_bytes, pods["ml/b"].limit_hits) == (1, GIB, 0)
    assert pods["ml/a"].gpu_memory_mib == agent.snapshot().gpus[0].info.memory_total_mib
    assert not pods["ml/a"].unattributed and pods["ml/a"].samples >= 10


def test_an_mps_clients_memory_and_limit_hits_are_published_without_its_compute(tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path, "mps")
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    for _ in range(12):
        agent.tick()
    pods = _published(kube)
    for pod in ("ml/a", "ml/b"):  # the MPS server has the SM samples (benchmarks/nvml_usage_check.md)
        assert "belongs to no known pod used its SMs" in pods[pod].compute_unattributed
        assert (pods[pod].unattributed, pods[pod].samples, pods[pod].duty.buckets) == ("", 0, [])
    a, hits = decode(pods["ml/a"], RecommenderSettings())
    assert a.memory.peak() == GIB and (hits.count, hits.last_limit_bytes) == (1, GIB)  # at its MPS limit


def _usage_patches(agent: Agent) -> float | None:
    return agent.metrics.registry.get_sample_value("gpupack_agent_usage_patches_total")


def test_publication_waits_for_its_interval_and_skips_what_did_not_change(tmp_path: Path) -> None:
    kube = FakeKube("n1")
    agent, _sim = _agent(tmp_path, kube)
    for _ in range(30):  # no pods ever: nothing to write
        agent.tick()
    assert _usage_patches(agent) == 0.0 and "usage" not in (kube.gpunode or {}).get("status", {})
    kube.set_spec({"sharing": {"mode": "mps", "replicas": 4}})
    kube.pods = [_pod("b", SHARED_RESOURCE)]
    agent.tick()
    assert _usage_patches(agent) == 0.0  # within the interval: not yet
    for _ in range(12):
        agent.tick()
    written = _usage_patches(agent)
    assert written is not None and written >= 1 and "publishedTime" in kube.gpunode["status"]["usage"]  # type: ignore[index]
    kube.pods = []
    for _ in range(24):  # the pod has gone: its record goes, once, and nothing is written after
        agent.tick()
    assert kube.gpunode is not None and kube.gpunode["status"]["usage"]["pods"] == []
    assert _usage_patches(agent) == written + 1


def test_a_pod_whose_compute_cannot_be_attributed_is_published_with_its_memory_only_for_good(
        tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path)
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    for _ in range(6):
        agent.tick()
    assert _published(kube)["ml/a"].samples > 0  # compute was measured until the fault
    sim.inject_fault(Fault("process_utilization", errors.NO_PERMISSION, times=2))
    for _ in range(12):
        agent.tick()
    pods = _published(kube)
    for pod in ("ml/a", "ml/b"):  # readable again, still marked; the duty samples before it are dropped too
        assert "per-process utilisation" in pods[pod].compute_unattributed and not pods[pod].unattributed
        assert (pods[pod].samples, pods[pod].duty.buckets) == (0, [])
    a, hits = decode(pods["ml/a"], RecommenderSettings())
    assert a.memory.peak() == GIB and hits.count == 1  # its memory and its limit hit are still observed


def test_each_signal_is_marked_for_good_and_only_what_is_attributed_is_added() -> None:
    plain = SimulatedNvml(H200, 1, mig_enabled=False)
    snapshot = read_snapshot(plain, plain.kind)
    uuid, total = snapshot.gpus[0].info.uuid, snapshot.gpus[0].info.memory_total_mib
    stranger = "a process on GPU 0 that belongs to no known pod used its SMs"
    unknown = "1 process(es) on GPU 0 belong to no known pod, and none is known to be this pod's"

    def use(pod: str, sm: float | None, mib: int | None, compute: str = "", memory: str = "") -> PodGpuUse:
        return PodGpuUse(pod, "c", 0, uuid, None, "processes", sm, mib, compute, memory)

    polls = [  # (measured, an MPS client, a pod whose memory may be a stranger's), one poll each
        [use("a/w", 20.0, 1000), use("a/m", 30.0, 2000), use("a/x", 10.0, 500)],
        [use("a/w", 40.0, 1500), use("a/m", None, total, stranger), use("a/x", None, None, unknown, unknown)],
        [use("a/w", 20.0, 1000), use("a/m", 50.0, 3000), use("a/x", 10.0, 4000)],  # the marks stay
    ]
    aggregator = UsageAggregator()
    uids = {"a/w": "w", "a/m": "m", "a/x": "x"}
    for at, poll in enumerate(polls):
        aggregator.observe(poll, uids, snapshot, {}, 100.0 + at)
    found = {p.pod: p for p in aggregator.usage().pods}
    assert (found["a/w"].samples, found["a/w"].unattributed, found["a/w"].compute_unattributed) == (3, "", "")
    memory_only, hits = decode(found["a/m"], RecommenderSettings())
    assert (found["a/m"].compute_unattributed, found["a/m"].unattributed) == (stranger, "")
    assert (memory_only.samples, memory_only.duty.total_weight, found["a/m"].first_seconds) == (0, 0.0, 0.0)
    assert memory_only.memory.peak() == total * MIB and hits.count == 1  # its peak and its hit (at the GPU's memory)
    assert found["a/x"].unattributed == unknown and found["a/x"].samples == 1  # nothing added after the mark
    assert found["a/x"].compute_unattributed == ""


def test_a_gone_pod_is_dropped_and_a_restarted_agent_goes_on_with_its_histories(tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path)
    sim.set_process_load(0, sim_pid("uid-a"), 30.0)
    for _ in range(12):
        agent.tick()
    before = _published(kube)["ml/a"].samples
    kube.pods = [_limited("a", GIB)]  # b has gone
    restarted, _ = _agent(tmp_path, kube)
    for _ in range(12):
        restarted.tick()
    after = _published(kube)
    assert set(after) == {"ml/a"}
    assert after["ml/a"].samples > before  # continued, not started afresh
    assert after["ml/a"].limit_hits == 1  # the episode in force when the old agent stopped is not counted twice


# ------------------------------------------------------------ the limit hits as metrics (Prometheus's source)

def _limit_metric(agent: Agent, name: str, pod: str) -> float | None:
    return agent.metrics.registry.get_sample_value(name, {"namespace": "ml", "pod": pod, "container": "c"})


def test_the_hits_the_agent_counts_and_the_limits_are_per_pod_metrics(tmp_path: Path) -> None:
    agent, sim, kube = _shared_node(tmp_path)
    for _ in range(6):
        agent.tick()
    # a sits at its 1 GiB allocation: the one hit published is the one exported; b never hit, its counter is 0.
    assert _published(kube)["ml/a"].limit_hits == 1
    assert _limit_metric(agent, "gpupack_pod_gpu_memory_limit_hits_total", "a") == 1.0
    assert _limit_metric(agent, "gpupack_pod_gpu_memory_limit_hits_total", "b") == 0.0
    assert _limit_metric(agent, "gpupack_pod_gpu_memory_limit_bytes", "a") == GIB
    gpu_mib = agent.snapshot().gpus[0].info.memory_total_mib
    assert _limit_metric(agent, "gpupack_pod_gpu_memory_limit_bytes", "b") == gpu_mib * MIB

    kube.pods = [_limited("a", GIB)]  # b has gone; a restarted agent counts from 0 what it sees anew
    restarted, _ = _agent(tmp_path, kube)
    for _ in range(6):
        restarted.tick()
    assert _published(kube)["ml/a"].limit_hits == 1  # the restored count goes on in status.usage
    assert _limit_metric(restarted, "gpupack_pod_gpu_memory_limit_hits_total", "a") == 0.0  # a counter's reset
    assert _limit_metric(restarted, "gpupack_pod_gpu_memory_limit_hits_total", "b") is None


def test_hit_counters_rise_with_the_count_start_anew_for_a_new_pod_and_go_with_their_pod() -> None:
    metrics = AgentMetrics()

    def value(name: str = "gpupack_pod_gpu_memory_limit_hits_total") -> float | None:
        return metrics.registry.get_sample_value(name, {"namespace": "ml", "pod": "a", "container": "c"})

    metrics.observe_pod_limits([PodLimit("ml/a", "u1", "c", 0, None)])
    assert value() == 0.0 and value("gpupack_pod_gpu_memory_limit_bytes") is None  # a limit not known yet
    metrics.observe_pod_limits([PodLimit("ml/a", "u1", "c", 2, GIB)])
    metrics.observe_pod_limits([PodLimit("ml/a", "u1", "c", 2, GIB)])
    assert value() == 2.0 and value("gpupack_pod_gpu_memory_limit_bytes") == GIB
    metrics.observe_pod_limits([PodLimit("ml/a", "u2", "c", 1, 2 * GIB)])  # a new pod of the name
    assert value() == 1.0 and value("gpupack_pod_gpu_memory_limit_bytes") == 2 * GIB
    metrics.observe_pod_limits([])
    assert value() is None and value("gpupack_pod_gpu_memory_limit_bytes") is None


def test_an_unattributed_pod_has_no_limit_series() -> None:
    aggregator = UsageAggregator()
    assert aggregator.limits() == []
    restored = {"usage": {"pods": [{"pod": "ml/a", "uid": "u1", "container": "c", "unattributed": "why",
                                    "limitHits": 0}]}}
    assert aggregator.restore(restored) == 1 and aggregator.limits() == []


# ------------------------------------------------------------ the limit of each kind of device

def test_the_limit_is_the_gpus_the_instances_or_the_allocated_share() -> None:

    sim, gi = _mig()
    snapshot = read_snapshot(sim, sim.kind)
    uuid = snapshot.gpus[0].info.uuid
    instance = PodGpuUse("a/m", "c", 0, uuid, gi, "instance", 10.0, 1000)
    assert limit_mib(instance, snapshot, {}) == H200.profile("3g.71gb").memory_mib
    plain = SimulatedNvml(H200, 1, mig_enabled=False)
    snapshot = read_snapshot(plain, plain.kind)
    uuid, total = snapshot.gpus[0].info.uuid, snapshot.gpus[0].info.memory_total_mib
    whole = PodGpuUse("a/w", "c", 0, uuid, None, "device", 10.0, 1000)
    shared = PodGpuUse("a/s", "c", 0, uuid, None, "processes", 10.0, 1000)
    assert limit_mib(whole, snapshot, {("a/w", "c"): GIB}) == total  # a whole GPU's record is not its limit
    assert limit_mib(shared, snapshot, {("a/s", "c"): 20 * GIB + 1}) == 20 * 1024 + 1  # rounded up to MiB
    assert limit_mib(shared, snapshot, {}) == total  # time-slicing: no limit but the GPU's
    elsewhere = PodGpuUse("a/x", "c", 0, "GPU-gone", None, "processes", 10.0, 1000)
    assert limit_mib(elsewhere, snapshot, {}) is None

"""The controller's recommender on the Prometheus source (``controller.recommending`` with
``controller.usage_prometheus``), against a fake API and a fake Prometheus (the source's HTTP
read replaced by a store of samples answering as a range query does): the same object the agents
source writes for the same use, ``source: Prometheus``, gone pods kept in the checkpoint and
nothing counted twice after a restart, a pod made again under an old name, the GPU memory from
the GPUNodes, and the source chosen from the settings."""

from __future__ import annotations

import copy
from typing import Any

from controller.recommending import RecommenderCycle, usage_source_for
from controller.settings import ControllerSettings
from controller.state.prometheus_usage import Matrix, QueryRange
from controller.usage_prometheus import PrometheusUsageSource
from controller.usage_source import AgentsSource
from kube.times import format_time
from sharing.usage.compact import LimitHits
from sharing.usage.recommender import RecommenderSettings, WorkloadKey
from tests.unit.test_recommender_cycle import (
    GIB,
    H100_MIB,
    T0,
    Clock,
    FakeKube,
    _bytes,
    _memory_record,
    _pod,
    _record,
    _rounded,
    _with_margin,
)

WEB = WorkloadKey("ml", "Deployment", "web", "main")
STALE_S = 60.0
"""An instant takes a series' latest sample at most this old: one scrape interval of the fake, as a
series that ends is marked stale by Prometheus at the next scrape (the agent removes it)."""


class FakePrometheus:
    """Per-pod samples as the agent exports them, answered for a window as ``query_range`` does."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, str], dict[float, tuple[float | None, float]]] = {}
        self.hits: dict[tuple[str, str, str], list[tuple[float, int]]] = {}
        """The agent's memory-limit hits: (time, limit in bytes) each."""
        self.reads: list[QueryRange] = []
        self.down = False

    def add(self, pod: str, duty: float | None, memory_bytes: int, minutes: int, start: float = T0) -> None:
        """``duty`` None: an MPS client's memory alone (the agent exports no duty cycle for it)."""
        series = self.samples.setdefault(("ml", pod, "main"), {})
        for i in range(minutes):
            series[start + 60 * i] = (duty, memory_bytes / 2**20)

    def hit(self, pod: str, at: float, limit_bytes: int) -> None:
        self.hits.setdefault(("ml", pod, "main"), []).append((at, limit_bytes))

    def query(self, query: str, window: QueryRange) -> Matrix:
        from controller.usage_prometheus import _ReadFailed

        if self.down:
            raise _ReadFailed("unreachable", "cannot reach the fake")
        self.reads.append(window)
        out: Matrix = {}
        steps = int((window.end - window.start) // window.step) + 1
        times = [window.start + i * window.step for i in range(steps)]
        if "limit_hits" in query or "limit_bytes" in query:  # the counter and the limit, from the first hit on
            for key, hits in self.hits.items():
                for t in times:
                    seen = [limit for at, limit in sorted(hits) if at <= t]
                    out.setdefault(key, {})[t] = float(len(seen) if "limit_hits" in query else
                                                       seen[-1] if seen else hits[0][1])
            return out
        memory, unattributed = "FB_USED" in query, "use_attributed" in query
        for key, points in self.samples.items():
            for t in times:
                latest = max((at for at in points if t - STALE_S < at <= t), default=None)
                if latest is None:
                    continue
                duty, mib = points[latest]
                # The agent's mark where the compute is not the pod's own (use_attributed 0).
                value = (0.0 if duty is None else None) if unattributed else mib if memory else duty
                if value is not None:
                    out.setdefault(key, {})[t] = value
        return out


class PromKube(FakeKube):
    """The fake API, its GPUNodes reporting an H100 each (the Prometheus source's GPU memory)."""

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": node}, "status": {"gpus": [
            {"index": 0, "uuid": "GPU-0", "product": "NVIDIA-H100-80GB-HBM3", "memoryMiB": H100_MIB}]}}
            for node in ("n1", "n2")]


def _on(pod: dict[str, Any], node: str, created: float | None = None) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    if created is not None:
        pod["metadata"]["creationTimestamp"] = format_time(created)
    return pod


def _prometheus_cycle(kube: FakeKube, clock: Clock, prometheus: FakePrometheus) -> RecommenderCycle:
    settings = ControllerSettings(recommend_min_observed_seconds=3600.0, metrics_port=0, usage_source="prometheus",
                                  prometheus_url="http://prometheus.invalid:9090")
    cycle = RecommenderCycle(kube, settings, clock=clock)  # type: ignore[arg-type]
    assert isinstance(cycle.source, PrometheusUsageSource)
    cycle.source._query = prometheus.query  # type: ignore[method-assign]
    return cycle


def _source(cycle: RecommenderCycle) -> PrometheusUsageSource:
    assert isinstance(cycle.source, PrometheusUsageSource)
    return cycle.source


def _two_replicas() -> tuple[PromKube, Clock, FakePrometheus]:
    kube, clock, prometheus = PromKube(), Clock(), FakePrometheus()
    kube.pods = [_on(_pod("web-5d8f9-a"), "n1"), _on(_pod("web-5d8f9-b"), "n2")]
    prometheus.add("web-5d8f9-a", 20.0, 10 * GIB, 150)
    prometheus.add("web-5d8f9-b", 40.0, 30 * GIB, 150)
    return kube, clock, prometheus


def test_the_same_use_gives_the_same_recommendation_as_the_agents_source() -> None:
    kube, clock, prometheus = _two_replicas()
    _prometheus_cycle(kube, clock, prometheus).run()
    ours = kube.objects[("ml", "deployment-web")]["status"]
    agents = FakeKube()
    agents.pods = kube.pods
    agents.publish("n1", [_record("web-5d8f9-a", 20.0, 10 * GIB, 150)])
    agents.publish("n2", [_record("web-5d8f9-b", 40.0, 30 * GIB, 150)])
    settings = ControllerSettings(recommend_min_observed_seconds=3600.0, metrics_port=0)
    RecommenderCycle(agents, settings, clock=clock).run()  # type: ignore[arg-type]
    theirs = agents.objects[("ml", "deployment-web")]["status"]
    assert (ours["source"], theirs["source"]) == ("Prometheus", "Agents")
    assert ours["containers"] == theirs["containers"] and ours["containers"]
    [container] = ours["containers"]
    assert (container["pods"], container["ooms"]) == (2, 0)
    assert _bytes(container["gpuMemory"]) == _rounded(_with_margin(30 * GIB))
    assert ours["conditions"][0]["reason"] == "Recommended"


def test_an_mps_clients_memory_and_limit_hit_give_what_the_agents_source_gives() -> None:
    """One replica measured, one an MPS client (memory alone) that hit its 32 GiB limit: the memory is
    learned from both and raised at the hit, the compute and observed time come from the measured one."""
    kube, clock, prometheus = PromKube(), Clock(), FakePrometheus()
    kube.pods = [_on(_pod("web-5d8f9-a"), "n1"), _on(_pod("web-5d8f9-b"), "n2")]
    prometheus.add("web-5d8f9-a", 20.0, 10 * GIB, 150)
    prometheus.add("web-5d8f9-b", None, 30 * GIB, 150)
    hit_at = T0 + 100 * 60
    prometheus.hit("web-5d8f9-b", hit_at, 32 * GIB)
    cycle = _prometheus_cycle(kube, clock, prometheus)
    cycle.run()
    ours = kube.objects[("ml", "deployment-web")]["status"]
    agents = FakeKube()
    agents.pods = kube.pods
    agents.publish("n1", [_record("web-5d8f9-a", 20.0, 10 * GIB, 150)])
    agents.publish("n2", [_memory_record("web-5d8f9-b", 30 * GIB, 150, LimitHits(1, hit_at, 32 * GIB))])
    settings = ControllerSettings(recommend_min_observed_seconds=3600.0, metrics_port=0)
    RecommenderCycle(agents, settings, clock=clock).run()  # type: ignore[arg-type]
    theirs = agents.objects[("ml", "deployment-web")]["status"]
    assert ours["containers"] == theirs["containers"] and ours["containers"]
    [container] = ours["containers"]
    assert (container["pods"], container["ooms"]) == (2, 1)
    assert _bytes(container["gpuMemory"]) > 32 * GIB  # above the limit hit, beyond the 30 GiB seen
    history = cycle.recommender.histories[WEB]
    assert history.samples == 150  # the MPS client's memory-only time is not observed time
    assert _source(cycle).last_counts.memory_only == 150
    cycle.run()  # the next cycle reads on: the hit is not counted again
    assert kube.objects[("ml", "deployment-web")]["status"]["containers"][0]["ooms"] == 1


def test_a_pod_whose_compute_stops_being_its_own_keeps_its_memory_only() -> None:
    """The rule the agent follows (sharing.usage.pod_history): the duty samples it had are dropped."""
    kube, clock, prometheus = PromKube(), Clock(), FakePrometheus()
    kube.pods = [_on(_pod("web-5d8f9-a"), "n1")]
    prometheus.add("web-5d8f9-a", 20.0, 10 * GIB, 60)
    prometheus.add("web-5d8f9-a", None, 12 * GIB, 60, start=T0 + 60 * 60)
    prometheus.add("web-5d8f9-a", 50.0, 11 * GIB, 30, start=T0 + 120 * 60)
    cycle = _prometheus_cycle(kube, clock, prometheus)
    cycle.run()
    history = cycle.recommender.histories[WEB]
    assert (history.samples, history.duty.total_weight, history.memory.peak()) == (0, 0.0, 12 * GIB)


def test_gone_pods_are_checkpointed_and_a_restart_counts_nothing_twice() -> None:
    kube, clock, prometheus = _two_replicas()
    cycle = _prometheus_cycle(kube, clock, prometheus)
    cycle.run()
    assert cycle.recommender.histories[WEB].samples == 300
    kube.pods = [kube.pods[0]]  # the busy replica has gone; its series stay in Prometheus
    clock.t += 60
    cycle.run()
    status = dict(kube.objects[("ml", "deployment-web")]["status"])
    [checkpoint] = status["checkpoint"]
    assert (checkpoint["pods"], checkpoint["samples"], checkpoint["gpuMemoryMiB"]) == (1, 150, H100_MIB)
    assert _bytes(status["containers"][0]["gpuMemory"]) == _rounded(_with_margin(30 * GIB))  # the gone pod's peak
    assert status["containers"][0]["pods"] == 2

    restarted = _prometheus_cycle(kube, clock, prometheus)  # a new leader: checkpoint, then a day's lookback
    clock.t += 60
    restarted.run()
    assert _source(restarted).next_s is not None and restarted.recommender.histories[WEB].samples == 300
    again = dict(kube.objects[("ml", "deployment-web")]["status"])
    assert again["containers"] == status["containers"]
    assert again["checkpoint"][0]["pods"] == 1 and again["checkpoint"][0]["samples"] == 150
    # A new term of the same process: the same, not the live pod folded a second time.
    restarted.restored = False
    clock.t += 60
    restarted.run()
    assert restarted.recommender.histories[WEB].samples == 300


def test_a_pod_made_again_under_its_name_does_not_take_the_old_ones_samples() -> None:
    kube, clock, prometheus = PromKube(), Clock(), FakePrometheus()
    old = _on(_pod("db-0", owner=("StatefulSet", "db")), "n1", created=T0 - 60)
    kube.pods = [old]
    prometheus.add("db-0", 50.0, 20 * GIB, 120)  # T0 .. T0 + 2 h
    cycle = _prometheus_cycle(kube, clock, prometheus)
    clock.t = T0 + 120 * 60
    cycle.run()
    key = WorkloadKey("ml", "StatefulSet", "db", "main")
    assert cycle.recommender.histories[key].samples == 120
    new = _on(old, "n1", created=T0 + 125 * 60)
    new["metadata"]["uid"] = "uid-db-0-again"
    kube.pods = [new]
    prometheus.add("db-0", 10.0, 5 * GIB, 30, start=T0 + 126 * 60)
    clock.t = T0 + 160 * 60
    cycle.run()
    history = cycle.recommender.histories[key]
    assert history.samples == 150 and cycle.source.workloads.gone_pods[key] == 1
    restarted = _prometheus_cycle(kube, clock, prometheus)  # the lookback reads the old pod's times again
    clock.t += 60
    restarted.run()
    assert restarted.recommender.histories[key].samples == 150
    assert _source(restarted).last_counts.dropped.get("before_pod", 0) > 0


def test_pods_that_go_while_prometheus_is_down_are_still_folded() -> None:
    kube, clock, prometheus = _two_replicas()
    cycle = _prometheus_cycle(kube, clock, prometheus)
    cycle.run()
    prometheus.down = True
    kube.pods = [kube.pods[0]]
    clock.t += 120
    cycle.run()
    assert cycle.source.workloads.gone_pods == {WEB: 1}
    assert cycle.recommender.histories[WEB].samples == 300


def test_a_pod_on_a_node_without_a_gpunode_is_capped_at_its_own_memory() -> None:
    kube, clock, prometheus = _two_replicas()
    kube.pods = [_on(_pod("web-5d8f9-a"), "elsewhere")]
    _prometheus_cycle(kube, clock, prometheus).run()
    [container] = kube.objects[("ml", "deployment-web")]["status"]["containers"]
    assert _bytes(container["gpuMemory"]) == _rounded(_with_margin(10 * GIB)) and container["pods"] == 1


def test_the_source_is_the_settings_choice() -> None:
    kube = FakeKube()
    recommender = RecommenderSettings()
    agents = usage_source_for(ControllerSettings(metrics_port=0), kube, recommender)  # type: ignore[arg-type]
    assert isinstance(agents, AgentsSource) and agents.source == "Agents"
    settings = ControllerSettings(metrics_port=0, usage_source="prometheus", prometheus_url="http://p:9090/",
                                  prometheus_selector='job="agents"', prometheus_lookback_seconds=600.0)
    prometheus = usage_source_for(settings, kube, recommender)  # type: ignore[arg-type]
    assert isinstance(prometheus, PrometheusUsageSource) and prometheus.source == "Prometheus"
    assert (prometheus.url, prometheus.lookback_s) == ("http://p:9090", 600.0)
    assert 'job="agents"' in prometheus.duty_query and prometheus.workloads.settings is recommender

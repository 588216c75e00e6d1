"""The controller's recommender (``controller.recommending``, ``controller.usage_source``,
``controller.writes.recommendations``) against a fake API: one GPURecommendation per workload from
its pods' published use, merged across pods, kept across a rollout (checkpoint) and a restart,
limit hits raising memory, unattributed pods never sized, the mode from policies and labels, and
writes only when something changed."""

from __future__ import annotations

import copy
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.recommending import RecommenderCycle
from controller.settings import ControllerSettings
from controller.writes.recommendations import ContainerInput, needs_write, status_for
from kube.errors import KubeError
from kube.times import format_time
from mig.units import parse_quantity
from sharing.api.crd import NodeUsage, PodUsage, to_wire
from sharing.api.keys import RIGHT_SIZING_LABEL
from sharing.usage.compact import LimitHits, encode, memory_only
from sharing.usage.recommender import ContainerHistory, Recommendation, Recommender, RecommenderSettings
from sharing.usage.sizing import size_for

GIB = 1024**3
T0 = 1.8e9
H100_MIB = 81559


def _record(pod: str, duty: float, memory: int, minutes: int, start: float = T0, hits: LimitHits | None = None,
            unattributed: str = "") -> PodUsage:
    history = ContainerHistory(RecommenderSettings())
    for i in range(minutes):
        history.observe(start + 60 * i, duty, memory)
    value = encode(history, hits or LimitHits(), H100_MIB)
    return PodUsage(pod=f"ml/{pod}", uid=f"uid-{pod}", container="main", unattributed=unattributed, **dict(value))


def _memory_record(pod: str, memory: int, minutes: int, hits: LimitHits | None = None) -> PodUsage:
    """A pod whose compute is not its own (an MPS client): memory peaks and limit hits, no duty samples."""
    settings = RecommenderSettings()
    history = memory_only(ContainerHistory(settings), settings)
    for i in range(minutes):
        history.memory.add(float(memory), T0 + 60 * i)
    value = encode(history, hits or LimitHits(), H100_MIB)
    return PodUsage(pod=f"ml/{pod}", uid=f"uid-{pod}", container="main",
                    compute_unattributed="a process on GPU 0 that belongs to no known pod used its SMs", **dict(value))


def _pod(name: str, owner: tuple[str, str] | None = ("ReplicaSet", "web-5d8f9")) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ml", "name": name, "uid": f"uid-{name}",
                            "labels": {"pod-template-hash": "5d8f9"}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True, "uid": "x"}]
    return {"metadata": meta, "spec": {}}


class FakeKube:
    def __init__(self) -> None:
        self.usage: dict[str, list[PodUsage]] = {}
        self.stamp = 0
        self.pods: list[dict[str, Any]] = []
        self.policies: list[dict[str, Any]] = []
        self.namespaces: list[dict[str, Any]] = [{"metadata": {"name": "ml", "labels": {}}}]
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[str] = []

    def publish(self, node: str, records: list[PodUsage]) -> None:
        self.usage[node] = records
        self.stamp += 1

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": node}, "status": {"usage": {
            **to_wire(NodeUsage(pods=records)), "publishedTime": f"2027-01-01T00:00:{self.stamp:02d}Z"}}}
            for node, records in self.usage.items()]

    def list_pods(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def list_policies(self) -> list[dict[str, Any]]:
        return self.policies

    def list_namespaces(self) -> list[dict[str, Any]]:
        return self.namespaces

    def list_recommendations(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.objects.values()))

    def create_recommendation(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        key = (namespace, body["metadata"]["name"])
        if key in self.objects:
            raise KubeError(409, "exists")
        self.objects[key] = copy.deepcopy(body)
        self.writes.append(f"create {key[1]}")
        return body

    def patch_recommendation_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if (namespace, name) not in self.objects:
            raise KubeError(404, "not found")
        self.objects[(namespace, name)]["status"] = copy.deepcopy(status)
        self.writes.append(f"status {name}")
        return self.objects[(namespace, name)]


class Clock:
    def __init__(self) -> None:
        self.t = T0 + 3 * 3600

    def __call__(self) -> float:
        return self.t


def _cycle(kube: FakeKube, clock: Clock, min_observed_s: float = 3600.0) -> RecommenderCycle:
    settings = ControllerSettings(recommend_min_observed_seconds=min_observed_s, metrics_port=0)
    return RecommenderCycle(kube, settings, clock=clock)  # type: ignore[arg-type]


def _bytes(quantity: str) -> int:
    return int(parse_quantity(quantity))


def _with_margin(peak: float, minutes: int = 150, min_observed_s: float = 3600.0) -> float:
    """``peak`` with the recommender's memory margin after ``minutes`` samples (a span one shorter)."""
    margin = Recommender(RecommenderSettings(min_observed_s=min_observed_s)).memory_margin(60.0 * (minutes - 1))
    return peak * (1 + margin)


def _rounded(memory: float) -> int:
    """The recommender's memory (whole bytes), written in whole MiB."""
    return math.ceil(math.ceil(memory) / 2**20) * 2**20


def _status(kube: FakeKube, name: str = "deployment-web") -> dict[str, Any]:
    return dict(kube.objects[("ml", name)]["status"])


def _two_replicas() -> tuple[FakeKube, Clock]:
    kube, clock = FakeKube(), Clock()
    kube.pods = [_pod("web-5d8f9-a"), _pod("web-5d8f9-b")]
    kube.publish("n1", [_record("web-5d8f9-a", 20.0, 10 * GIB, 150)])
    kube.publish("n2", [_record("web-5d8f9-b", 40.0, 30 * GIB, 150)])
    return kube, clock


def test_a_workloads_pods_are_merged_into_one_recommendation() -> None:
    kube, clock = _two_replicas()
    report = _cycle(kube, clock).run()
    assert kube.writes == ["create deployment-web", "status deployment-web"] and report.recommended == 1
    obj = kube.objects[("ml", "deployment-web")]
    assert obj["spec"] == {"targetRef": {"kind": "Deployment", "name": "web"}}
    [container] = obj["status"]["containers"]
    settings = RecommenderSettings()
    p99 = settings.duty.bucket_start(settings.duty.bucket(40.0) + 1)  # the busier replica's bucket
    assert container["gpuMilli"] == size_for(Recommendation(min(100.0, p99 * 1.15), 0, 0, 0, 0), 80 * GIB).milli
    assert _bytes(container["gpuMemory"]) == _rounded(_with_margin(30 * GIB))  # the larger peak + the margin
    assert (container["pods"], container["ooms"], obj["status"]["mode"], obj["status"]["source"]) == (
        2, 0, "Off", "Agents")
    assert obj["status"]["conditions"][0]["reason"] == "Recommended"


def test_nothing_is_rewritten_until_something_changes_or_the_refresh_is_due() -> None:
    kube, clock = _two_replicas()
    cycle = _cycle(kube, clock)
    cycle.run()
    clock.t += 60
    kube.writes.clear()
    cycle.run()
    assert kube.writes == []
    clock.t += 600  # the observed time is refreshed every recommendation_refresh_seconds
    cycle.run()
    assert kube.writes == ["status deployment-web"]


def test_a_rollout_keeps_the_gone_pods_history_in_the_checkpoint_across_a_restart() -> None:
    kube, clock = _two_replicas()
    _cycle(kube, clock).run()
    first = _cycle(kube, clock)  # a fresh leader: restores from the objects
    first.run()
    kube.pods = [_pod("web-5d8f9-a")]
    kube.publish("n2", [])  # the busy replica has gone
    clock.t += 60
    first.run()
    status = _status(kube)
    [checkpoint] = status["checkpoint"]
    assert (checkpoint["containerName"], checkpoint["pods"]) == ("main", 1)
    assert _bytes(status["containers"][0]["gpuMemory"]) == _rounded(_with_margin(30 * GIB))  # the gone pod's peak
    restarted = _cycle(kube, clock)
    clock.t += 60
    restarted.run()
    again = _status(kube)
    assert again["containers"][0]["gpuMemory"] == status["containers"][0]["gpuMemory"]
    assert again["containers"][0]["pods"] == 2 and again["checkpoint"][0]["pods"] == 1  # not folded twice


def test_a_pod_that_went_in_another_leaders_term_is_not_folded_again() -> None:
    kube, clock = _two_replicas()
    first = _cycle(kube, clock)
    first.run()
    first.restored = False  # its term ends (RecommenderLoop); another leader sees the busy replica go
    other = _cycle(kube, clock)
    other.run()
    kube.pods = [_pod("web-5d8f9-a")]
    kube.publish("n2", [])
    clock.t += 60
    other.run()
    assert _status(kube)["checkpoint"][0]["pods"] == 1
    clock.t += 60
    first.run()  # a new term: the checkpoint holds the replica, so it is not folded a second time
    status = _status(kube)
    assert status["containers"][0]["pods"] == 2 and status["checkpoint"][0]["pods"] == 1


def test_before_the_minimum_history_the_condition_says_so() -> None:
    kube, clock = FakeKube(), Clock()
    kube.pods = [_pod("solo", owner=None)]
    kube.publish("n1", [_record("solo", 20.0, GIB, 30)])
    _cycle(kube, clock).run()
    status = _status(kube, "pod-solo")
    assert status["containers"] == []
    cond = status["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == ("RecommendationProvided", "False", "NotEnoughHistory")
    assert "29 min" in cond["message"] and "60 min" in cond["message"]


def test_a_limit_hit_raises_the_memory_at_once() -> None:
    kube, clock = FakeKube(), Clock()
    kube.pods = [_pod("solo", owner=None)]
    kube.publish("n1", [_record("solo", 20.0, 10 * GIB, 150, hits=LimitHits(3, T0 + 3000, 10 * GIB))])
    _cycle(kube, clock).run()
    [container] = _status(kube, "pod-solo")["containers"]
    assert container["ooms"] == 3
    bump = RecommenderSettings().oom_bump_ratio
    assert _bytes(container["gpuMemory"]) == _rounded(_with_margin(10 * GIB * bump))  # the bumped limit + the margin


def test_an_unattributed_pod_is_never_sized() -> None:
    kube, clock = FakeKube(), Clock()
    kube.pods = [_pod("shared", owner=None)]
    kube.publish("n1", [_record("shared", 20.0, GIB, 150, unattributed="a process of no known pod used the SMs")])
    cycle = _cycle(kube, clock)
    report = cycle.run()
    assert kube.objects == {} and report.workloads == 0
    assert cycle.source.unattributed == {"ml/shared": "a process of no known pod used the SMs"}


def test_an_mps_clients_memory_and_hits_are_merged_while_compute_comes_from_measured_pods() -> None:
    kube, clock = FakeKube(), Clock()
    kube.pods = [_pod("web-5d8f9-a"), _pod("web-5d8f9-b")]
    kube.publish("n1", [_record("web-5d8f9-a", 20.0, 10 * GIB, 150)])  # held a GPU alone: compute measured
    kube.publish("n2", [_memory_record("web-5d8f9-b", 30 * GIB, 150)])
    cycle = _cycle(kube, clock)
    cycle.run()
    [container] = _status(kube)["containers"]
    settings = RecommenderSettings()
    p99 = settings.duty.bucket_start(settings.duty.bucket(20.0) + 1)  # a's alone: b added no duty weight
    assert container["gpuMilli"] == size_for(Recommendation(min(100.0, p99 * 1.15), 0, 0, 0, 0), 80 * GIB).milli
    assert _bytes(container["gpuMemory"]) == _rounded(_with_margin(30 * GIB))  # the client's peak is the larger
    assert (container["pods"], container["observedSeconds"]) == (2, 149 * 60)  # observed: a's samples only
    assert cycle.source.unattributed == {}
    kube.publish("n2", [_memory_record("web-5d8f9-b", 30 * GIB, 150, hits=LimitHits(1, T0 + 3000, 32 * GIB))])
    clock.t += 60
    cycle.run()
    [hit] = _status(kube)["containers"]
    bump = settings.oom_bump_ratio
    assert hit["ooms"] == 1 and _bytes(hit["gpuMemory"]) == _rounded(_with_margin(32 * GIB * bump))  # raised at once


def test_a_workload_whose_compute_was_never_measured_gets_no_recommendation() -> None:
    kube, clock = FakeKube(), Clock()
    kube.pods = [_pod("solo", owner=None)]
    kube.publish("n1", [_memory_record("solo", 30 * GIB, 150)])  # hours of memory, no compute
    report = _cycle(kube, clock).run()
    status = _status(kube, "pod-solo")
    assert status["containers"] == [] and report.waiting == 1
    assert status["conditions"][0]["reason"] == "NotEnoughHistory"


@pytest.mark.parametrize(("policy_mode", "label", "mode"), [
    (None, None, "Off"), ("Recreate", None, "Recreate"), ("Recreate", "Initial", "Initial"), (None, "Off", "Off"),
])
def test_the_mode_is_the_namespaces(policy_mode: str | None, label: str | None, mode: str) -> None:
    kube, clock = _two_replicas()
    if policy_mode:
        kube.policies = [{"metadata": {"name": "p"}, "spec": {"rightSizing": {"mode": policy_mode}}}]
    if label:
        kube.namespaces = [{"metadata": {"name": "ml", "labels": {RIGHT_SIZING_LABEL: label}}}]
    _cycle(kube, clock).run()
    assert _status(kube)["mode"] == mode


def test_a_write_that_fails_is_counted_and_tried_again_next_cycle() -> None:
    kube, clock = _two_replicas()
    cycle = _cycle(kube, clock)
    real = kube.patch_recommendation_status

    def failing(*_: Any) -> dict[str, Any]:
        raise KubeError(503, "unavailable")

    kube.patch_recommendation_status = failing  # type: ignore[method-assign,assignment]
    report = cycle.run()
    assert report.errors and report.written == []
    kube.patch_recommendation_status = real  # type: ignore[method-assign]
    clock.t += 60
    assert cycle.run().written == ["ml/deployment-web"]


def test_needs_write_ignores_growing_figures_but_not_a_new_size() -> None:
    now = datetime(2027, 1, 1, tzinfo=timezone.utc)
    rec = Recommendation(30.0, 10 * GIB, 7200.0, 0.08, 0)
    base = status_for([ContainerInput("main", rec, 1, 80 * GIB)], "Off", "Agents", 3600, {}, now)
    later = now + timedelta(seconds=60)
    grown = status_for([ContainerInput("main", Recommendation(30.0, 10 * GIB, 7260.0, 0.084, 0), 1, 80 * GIB)],
                       "Off", "Agents", 3600, base, later)
    assert not needs_write(base, grown, later, 600)
    resized = status_for([ContainerInput("main", Recommendation(60.0, 10 * GIB, 7260.0, 0.084, 0), 1, 80 * GIB)],
                         "Off", "Agents", 3600, base, later)
    assert needs_write(base, resized, later, 600)
    assert needs_write(base, grown, now + timedelta(seconds=600), 600)
    assert grown["conditions"][0]["lastTransitionTime"] == format_time(now)  # the condition did not change

"""The controller's cycle carries out ``Recreate`` (controller.reconcile): through the one eviction
writer, a PodDisruptionBudget's 429 leaves the pod and is told once, and nothing is read while no
namespace is in ``Recreate``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controller.kube import Kube
from controller.metrics import ControllerMetrics
from controller.reconcile import Controller
from controller.settings import ControllerSettings
from kube.errors import KubeError
from sharing.api.keys import RESIZED_AT_ANNOTATION, RIGHT_SIZING_LABEL
from tests.unit.test_right_size_evictions import NOW, pod, recommendation
from tests.unit.test_right_size_rollouts import deployment


class FakeKube(Kube):
    """The calls a cycle makes, in memory; ``guarded`` pods answer an eviction with 429, as a
    PodDisruptionBudget that allows no disruption makes the API server do."""

    def __init__(self, pods: list[dict[str, Any]], mode: str = "Recreate") -> None:
        super().__init__(api=None)  # type: ignore[arg-type]  # every call it makes is overridden
        self.pods = pods
        self.namespaces = [{"metadata": {"name": "team", "labels": {RIGHT_SIZING_LABEL: mode}}}]
        self.recommendations = [recommendation()]
        self.guarded: set[str] = set()
        self.evicted: list[str] = []
        self.recommendation_reads = 0
        self.events: list[tuple[str, str, str, str]] = []
        self.deployments: dict[str, dict[str, Any]] = {}
        self.patched: list[tuple[str, Any]] = []

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return []

    def list_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def list_nodes(self) -> list[dict[str, Any]]:
        return []

    def list_policies(self) -> list[dict[str, Any]]:
        return []

    def list_namespaces(self) -> list[dict[str, Any]]:
        return self.namespaces

    def list_resource_claims(self) -> list[dict[str, Any]]:
        return []

    def list_recommendations(self) -> list[dict[str, Any]]:
        self.recommendation_reads += 1
        return self.recommendations

    def evict_pod(self, namespace: str, name: str) -> None:
        if f"{namespace}/{name}" in self.guarded:
            raise KubeError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        self.evicted.append(f"{namespace}/{name}")

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.deployments.get(f"{namespace}/{name}")

    def patch_deployment(self, namespace: str, name: str, body: Any) -> None:
        self.patched.append((f"{namespace}/{name}", body))

    def event(self, involved: Any, type_: str, reason: str, message: str, host: str | None = None) -> None:
        self.events.append((involved["name"], type_, reason, message))


def controller(kube: FakeKube) -> tuple[Controller, ControllerMetrics]:
    metrics = ControllerMetrics()
    clock = iter(NOW + timedelta(seconds=10 * i) for i in range(100))
    return Controller(kube, ControllerSettings(), metrics,
                      clock=lambda: next(clock)), metrics


def count(metrics: ControllerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_one_pod_per_budget_is_evicted_and_told() -> None:
    kube = FakeKube([pod("a"), pod("b")])
    ctl, metrics = controller(kube)
    report = ctl.cycle()
    assert report.right_size_evicted == ["team/a"] and kube.evicted == ["team/a"], report.errors
    ((name, type_, reason, message),) = kube.events
    assert (name, type_, reason) == ("a", "Normal", "EvictedToRightSize")
    assert "GPURecommendation deployment-web" in message
    assert count(metrics, "gpupack_right_size_evictions_total", reason="far") == 1
    kube.pods = [pod("b"), pod("a2", created=NOW)]  # the ReplicaSet's replacement
    assert ctl.cycle().right_size_evicted == [] and kube.evicted == ["team/a"]  # the hour's budget is spent


def test_a_budget_that_allows_no_disruption_leaves_the_pod_and_says_so_once() -> None:
    kube = FakeKube([pod("a"), pod("b")])
    kube.guarded = {"team/a", "team/b"}
    ctl, metrics = controller(kube)
    for _ in range(3):
        report = ctl.cycle()
        assert report.right_size_blocked == ["team/a"] and report.errors == []
    assert kube.evicted == []
    assert [(n, t, r) for n, t, r, _ in kube.events] == [("a", "Warning", "RightSizeEvictionBlocked")]
    assert count(metrics, "gpupack_evictions_blocked_total", cause="right-size") == 3
    kube.guarded = set()  # the budget allows it now: the next cycle evicts, nothing was spent meanwhile
    assert ctl.cycle().right_size_evicted == ["team/a"]


def test_no_namespace_in_recreate_reads_no_recommendation() -> None:
    for mode in ("Off", "Initial"):
        kube = FakeKube([pod("a"), pod("b")], mode=mode)
        ctl, _ = controller(kube)
        ctl.cycle()
        assert (kube.recommendation_reads, kube.evicted, kube.events) == (0, [], [])


def test_a_refused_grant_names_the_component_to_install() -> None:
    kube = FakeKube([pod("a"), pod("b")])

    def forbidden(namespace: str, name: str) -> None:
        raise KubeError(403, 'pods "a" is forbidden: cannot create resource "pods/eviction"')

    kube.evict_pod = forbidden  # type: ignore[method-assign]
    ctl, _ = controller(kube)
    (error,) = ctl.cycle().errors
    assert "manifests/right-sizing-recreate" in error and "team/a" in error


def test_a_deployments_only_pod_is_moved_by_a_rollout_once_per_budget() -> None:
    kube = FakeKube([pod("only")])
    kube.deployments["team/web"] = deployment()
    ctl, metrics = controller(kube)
    report = ctl.cycle()
    assert report.right_size_rolled_out == ["team/web"] and kube.evicted == [], report.errors
    ((name, body),) = kube.patched
    assert name == "team/web" and body["metadata"] == {"resourceVersion": "42"}
    assert RESIZED_AT_ANNOTATION in body["spec"]["template"]["metadata"]["annotations"]
    ((involved, type_, reason, message),) = kube.events
    assert (involved, type_, reason) == ("web", "Normal", "RolledOutToRightSize") and "only pod only" in message
    assert count(metrics, "gpupack_right_size_rollouts_total", reason="far") == 1
    ctl.cycle()
    assert len(kube.patched) == 1  # the hour's budget is spent


def test_a_deployment_that_would_not_surge_is_left_alone() -> None:
    kube = FakeKube([pod("only")])
    kube.deployments["team/web"] = deployment(strategy={"type": "Recreate"})
    ctl, _ = controller(kube)
    report = ctl.cycle()
    assert (report.right_size_rolled_out, kube.patched, kube.evicted, report.errors) == ([], [], [], [])

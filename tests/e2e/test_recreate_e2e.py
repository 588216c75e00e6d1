"""Right-sizing's ``Recreate`` mode end to end (issue 35, item 3): pods far from their recommendation
are evicted through the Eviction API, one per workload per hour, never the last ready replica, and a
PodDisruptionBudget holds; a Deployment's only pod moves by a rollout that brings the new pod up first.

One control plane of this module's own runs kube-apiserver, kube-scheduler and
kube-controller-manager (Deployment, ReplicaSet and disruption controllers: ReplicaSets recreate
evicted pods, and the API server evaluates PodDisruptionBudgets from the disruption controller's
status). gpupack's RBAC and admission policies are installed, with the optional grant
``manifests/right-sizing-recreate`` (and its policy on Deployment writes); the controller runs as its ServiceAccount (``gpupack
controller run``), scoped to the test's namespace, which is labelled
``gpupack.io/right-sizing=Recreate``.

The pods ask for a whole GPU in gpupack's units (``gpupack.io/gpu-milli: 1000``,
``gpupack.io/gpu-memory: 80Gi``) on a Node that advertises them: no webhook runs here, so each
pod's size is its own request, and the replacement is sized as its template says (sizing it
from the recommendation is the webhook's ``Initial`` mode, not tested here). The
``GPURecommendation`` is written by hand, far below: 100 milli, 20 GiB. There is no kubelet: the
test plays it (Running, Ready), and an evicted pod stays Terminating (graceful deletion).

Deadlines only, no timing assertions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.devcluster.apply import apply_objects, gpupack_manifests, load_manifests
from gpupack.devcluster.controlplane import ControlPlane
from gpupack.devcluster.clients import api_client
from sharing.api.keys import MEMORY_RESOURCE, MILLI_RESOURCE, RESIZED_AT_ANNOTATION, RIGHT_SIZING_LABEL
from tests.e2e.test_controller_e2e import GROUP, VERSION, Harness
from tests.e2e.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RECREATE = ROOT / "manifests" / "right-sizing-recreate"
WAIT_S = 90.0


@pytest.fixture(scope="module")
def plane(controller_manager_scheduler_plane: ControlPlane) -> ControlPlane:
    with controller_manager_scheduler_plane.admin_client() as admin:
        apply_objects(admin, gpupack_manifests() + load_manifests(RECREATE / "rbac.yaml", RECREATE / "deployment-policy.yaml"), field_manager="recreate-e2e")
    return controller_manager_scheduler_plane


@pytest.fixture(scope="module")
def admin(plane: ControlPlane) -> Iterator[Any]:
    with plane.admin_client() as api:
        yield api


class RecreateHarness(Harness):
    """The controller e2e harness, with Deployments, a Node that advertises gpupack's units, and the kubelet's part."""

    def __init__(self, admin: Any, plane: ControlPlane, tmp: Path, namespace: str) -> None:
        cache: dict[str, Path] = {}

        def sa(name: str) -> Path:
            if name not in cache:
                cache[name] = plane.serviceaccount_kubeconfig(name)
            return cache[name]

        super().__init__(admin, sa, tmp, namespace, plane.node_agent_kubeconfig)
        self.apps = client.AppsV1Api(admin)
        self.budgets = client.PolicyV1Api(admin)
        self.node_name = f"rc-{self.run}"
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=self.node_name, labels={
            "kubernetes.io/hostname": self.node_name, "e2e-ctl": self.run})))
        res = {"cpu": "64", "memory": "512Gi", "pods": "110", MILLI_RESOURCE: "16000", MEMORY_RESOURCE: "2Ti"}
        self.core.patch_node_status(self.node_name, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})

    def leading(self, name: str) -> None:
        """Start a controller and wait for its first cycle (its eviction memory begins there)."""
        self.controller(name)
        wait_for(f"{name}'s first cycle", lambda: "watch caches listed" in self.log(name), WAIT_S)

    def deployment(self, name: str, replicas: int, strategy: str = "RollingUpdate") -> list[str]:
        """A Deployment of ``replicas`` pods of a whole GPU each, bound and Ready; their names."""
        labels = {"app": name}
        self.apps.create_namespaced_deployment(self.namespace, client.V1Deployment(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1DeploymentSpec(
                replicas=replicas, selector=client.V1LabelSelector(match_labels=labels),
                strategy=client.V1DeploymentStrategy(type=strategy),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(
                        node_selector={"e2e-ctl": self.run}, termination_grace_period_seconds=30,
                        containers=[client.V1Container(name="main", image="registry.invalid/serve:1", resources=(
                            client.V1ResourceRequirements(limits={MILLI_RESOURCE: "1000",
                                                                  MEMORY_RESOURCE: "80Gi"})))])))))
        pods = wait_for(f"{name}'s {replicas} pods bound", lambda: (
            p := self.live(name)) and len(p) == replicas and all(x.spec.node_name for x in p) and p, WAIT_S)
        for p in pods:
            self.running(p.metadata.name)
        return sorted(p.metadata.name for p in pods)

    def live(self, app: str) -> list[Any]:
        pods: list[Any] = self.core.list_namespaced_pod(self.namespace, label_selector=f"app={app}").items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def running(self, pod: str) -> None:
        """Play the kubelet: the pod runs and is Ready (a PodDisruptionBudget counts only healthy pods)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}})

    def recommend(self, app: str, milli: int = 100, memory: str = "20Gi") -> None:
        """The workload's GPURecommendation, as the recommender would write it."""
        name = f"deployment-{app}"
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, "gpurecommendations", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "GPURecommendation", "metadata": {"name": name},
            "spec": {"targetRef": {"kind": "Deployment", "name": app}}})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, "gpurecommendations", name, {
            "status": {"source": "Agents", "mode": "Recreate", "containers": [
                {"containerName": "main", "gpuMilli": milli, "gpuMemory": memory, "observedSeconds": 86400,
                 "confidenceDays": 1.0, "pods": 2}],
                "conditions": [{"type": "RecommendationProvided", "status": "True", "lastTransitionTime": now,
                                "reason": "Observed", "message": "written by the e2e test"}]}})

    def events(self, reason: str) -> list[tuple[str, str, str]]:
        """(pod, type, message) of the namespace's Events with ``reason``."""
        items: list[Any] = self.core.list_namespaced_event(self.namespace, field_selector=f"reason={reason}").items
        return [(str(e.involved_object.name), str(e.type), str(e.message or "")) for e in items]

    def remove(self) -> None:
        deployments: list[Any] = self.apps.list_namespaced_deployment(self.namespace).items
        for d in deployments:
            self.apps.delete_namespaced_deployment(d.metadata.name, self.namespace)
        self.cleanup()
        self.core.delete_node(self.node_name)


@pytest.fixture
def h(admin: Any, plane: ControlPlane, tmp_path: Path) -> Iterator[RecreateHarness]:
    namespace = f"recreate-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=namespace, labels={RIGHT_SIZING_LABEL: "Recreate"})))
    harness = RecreateHarness(admin, plane, tmp_path, namespace)
    yield harness
    logs = {name: harness.log(name)[-2500:] for name in harness.processes}
    harness.remove()
    for name, text in logs.items():
        print(f"--- {name} ---\n{text}")


def _resized_at(h: RecreateHarness, name: str) -> str | None:
    deployment: Any = h.apps.read_namespaced_deployment(name, h.namespace)
    return (deployment.spec.template.metadata.annotations or {}).get(RESIZED_AT_ANNOTATION)


def _several_cycles() -> None:
    time.sleep(5)  # the controller runs a cycle every second (--resync-seconds 1)


def test_one_pod_per_budget_is_evicted_and_a_lone_replica_never(h: RecreateHarness) -> None:
    # The controller first: pods created in the hour before it started could replace an earlier
    # leader's evictions, and would spend the budget (controller.planning.right_size_evictions).
    h.leading("ctl-recreate")
    web = h.deployment("web", 2)
    solo = h.deployment("solo", 1, strategy="Recreate")  # a rollout would take its only pod down first
    h.recommend("web")  # last: nothing is far before both pods are Ready
    h.recommend("solo")

    ((evicted, type_, message),) = wait_for("one of web's pods evicted to resize it",
                                            lambda: h.events("EvictedToRightSize"), WAIT_S)
    assert evicted in web and type_ == "Normal"
    assert "GPURecommendation deployment-web recommends 100 milli and 20.0 GiB" in message
    gone: Any = h.core.read_namespaced_pod(evicted, h.namespace)
    assert gone.metadata.deletion_timestamp is not None  # graceful: no kubelet here to finish it
    (kept,) = set(web) - {evicted}
    replacement = wait_for("the ReplicaSet's replacement bound", lambda: (
        p := [x for x in h.live("web") if x.metadata.name not in web and x.spec.node_name]) and p[0], WAIT_S)
    h.running(replacement.metadata.name)  # two Ready pods again: only the budget holds the other far pod back
    _several_cycles()
    assert [e[0] for e in h.events("EvictedToRightSize")] == [evicted]  # one per workload per hour
    assert kept in {p.metadata.name for p in h.live("web")}
    assert [p.metadata.name for p in h.live("solo")] == solo  # the last ready replica never goes
    assert (f"{h.namespace}/{solo[0]}: the last ready replica of {h.namespace}/Deployment/solo, and a rollout "
            "would not bring its replacement up first: its strategy is Recreate") in h.log("ctl-recreate")


def test_a_pod_disruption_budget_keeps_the_pods(h: RecreateHarness) -> None:
    h.leading("ctl-guarded")
    guarded = h.deployment("guarded", 2)
    h.budgets.create_namespaced_pod_disruption_budget(h.namespace, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="guarded"),
        spec=client.V1PodDisruptionBudgetSpec(min_available=2,
                                              selector=client.V1LabelSelector(match_labels={"app": "guarded"}))))
    wait_for("the budget to count both pods healthy and allow no disruption", lambda: (
        s := h.budgets.read_namespaced_pod_disruption_budget("guarded", h.namespace).status)
        and s.current_healthy == 2 and s.disruptions_allowed == 0, WAIT_S)
    h.recommend("guarded")

    ((pod, type_, message),) = wait_for("the refused eviction told on the pod",
                                        lambda: h.events("RightSizeEvictionBlocked"), WAIT_S)
    assert pod in guarded and type_ == "Warning" and "PodDisruptionBudget" in message
    assert f"eviction of {h.namespace}/{pod} waits for its PodDisruptionBudget" in h.log("ctl-guarded")
    _several_cycles()
    assert sorted(p.metadata.name for p in h.live("guarded")) == guarded
    assert h.events("EvictedToRightSize") == []
    assert len(h.events("RightSizeEvictionBlocked")) == 1  # told once while it stays refused


def test_a_deployments_only_pod_moves_by_a_rollout_that_brings_the_new_pod_up_first(h: RecreateHarness) -> None:
    h.leading("ctl-rollout")
    (old,) = h.deployment("single", 1)  # the default strategy: maxSurge 25 % (1), maxUnavailable 25 % (0)
    h.recommend("single")

    stamp = wait_for("the controller to roll the Deployment out", lambda: _resized_at(h, "single"), WAIT_S)
    new = wait_for("the rollout's new pod bound", lambda: (
        p := [x for x in h.live("single") if x.metadata.name != old and x.spec.node_name]) and p[0], WAIT_S)
    _several_cycles()  # the new pod is not Ready: the Deployment keeps the old one serving
    assert old in {p.metadata.name for p in h.live("single")}
    h.running(new.metadata.name)
    wait_for("the old pod removed once the new one is Ready", lambda: old not in {
        p.metadata.name for p in h.live("single")}, WAIT_S)
    ((deployment, type_, message),) = h.events("RolledOutToRightSize")
    assert (deployment, type_) == ("single", "Normal") and f"its only pod {old}" in message
    assert h.events("EvictedToRightSize") == []
    _several_cycles()
    assert _resized_at(h, "single") == stamp  # one move per workload per hour

    # The grant lets the controller patch Deployments; the policy lets it change that annotation only.
    with api_client(h.sa_kubeconfig("gpupack-controller")) as api:
        apps = client.AppsV1Api(api)
        image = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "registry.invalid/x:2"}]

        def refused(dry_run: str | None) -> ApiException | None:
            try:
                apps.patch_namespaced_deployment("single", h.namespace, image, dry_run=dry_run)
            except ApiException as exc:
                return exc if exc.status == 403 else None
            return None

        # A policy just installed reaches the admission chain asynchronously: wait on a dry run.
        wait_for("the deployment-writes policy to be enforced", lambda: refused("All"), WAIT_S)
        refusal = refused(None)
        assert refusal is not None and "right-sizing.gpupack.io/resized-at only" in str(refusal.body)

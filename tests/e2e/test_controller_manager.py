"""The optional kube-controller-manager of the dev control plane runs real controllers.

A control plane started with ``ControlPlaneConfig(controller_manager=True)`` (its
default controllers): the ReplicaSet controller creates and replaces owned pods,
the disruption controller writes PodDisruptionBudget status, the garbage
collector removes a deleted ReplicaSet's pods, and the ServiceAccount and
namespace controllers make ``default`` ServiceAccounts and finalize deleted
namespaces. The pods select a node label no node has, so they stay Pending: no
kubelet runs here, and no scheduler either. Only waits with generous deadlines,
no timing assertions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpupack.devcluster.controlplane import ControlPlane
from tests.e2e.waiting import wait_for

TIMEOUT_S = 60.0
# A label no node carries: the pods stay Pending, unbound, wherever they are scheduled from.
NO_NODE = {"gpupack.io/e2e-no-such-node": "true"}


@pytest.fixture(scope="module")
def admin(controller_manager_plane: ControlPlane) -> Iterator[Any]:
    with controller_manager_plane.admin_client() as api:
        yield api


@pytest.fixture
def ns(admin: Any) -> str:
    name = f"kcm-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def _replicaset(name: str, replicas: int) -> client.V1ReplicaSet:
    labels = {"app": name}
    return client.V1ReplicaSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ReplicaSetSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector=NO_NODE,
                    containers=[client.V1Container(name="main", image="registry.invalid/pause:1")],
                ),
            ),
        ),
    )


# The API objects are read as Any: the client's models make every field Optional.
def _owned_pods(admin: Any, namespace: str, owner: Any) -> list[Any]:
    """The live (not terminating) pods whose controller is ``owner``."""
    pods: list[Any] = client.CoreV1Api(admin).list_namespaced_pod(namespace).items
    return [p for p in pods if p.metadata.deletion_timestamp is None and any(
        ref.uid == owner.metadata.uid and ref.controller for ref in p.metadata.owner_references or ())]


def _names(objects: list[Any]) -> set[str]:
    return {o.metadata.name for o in objects}


def _wait_for_pods(admin: Any, namespace: str, owner: Any, count: int, what: str) -> list[Any]:
    """Wait until exactly ``count`` (> 0) live pods are owned by ``owner``; those pods."""

    def probe() -> list[Any] | None:
        pods = _owned_pods(admin, namespace, owner)
        return pods if len(pods) == count else None

    pods: list[Any] = wait_for(what, probe, TIMEOUT_S)
    return pods


def test_replicaset_controller_creates_owned_pods_and_replaces_a_deleted_one(
    admin: Any, ns: str, controller_manager_plane: ControlPlane
) -> None:
    apps, core = client.AppsV1Api(admin), client.CoreV1Api(admin)
    rs: Any = apps.create_namespaced_replica_set(ns, _replicaset("web", 2))
    pods = _wait_for_pods(admin, ns, rs, 2, "the ReplicaSet controller to create 2 pods owned by the ReplicaSet")
    for pod in pods:
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"
        assert pod.metadata.owner_references[0].name == "web"
        assert pod.spec.node_selector == NO_NODE and not pod.spec.node_name
        assert pod.status.phase == "Pending"
    def counted() -> bool:
        now: Any = apps.read_namespaced_replica_set("web", ns)
        return bool(now.status.replicas == 2)

    wait_for("the ReplicaSet's status to count 2 replicas", counted, TIMEOUT_S)

    gone = pods[0].metadata.name
    core.delete_namespaced_pod(gone, ns)
    replaced = _wait_for_pods(
        admin, ns, rs, 2,
        f"the ReplicaSet controller to replace deleted pod {gone}")
    assert gone not in {p.metadata.name for p in replaced}
    assert pods[1].metadata.name in {p.metadata.name for p in replaced}

    # Stopped and started again like the other components, it picks up where it left off.
    controller_manager_plane.stop_component("kube-controller-manager")
    controller_manager_plane.start_component("kube-controller-manager")
    apps.patch_namespaced_replica_set("web", ns, {"spec": {"replicas": 3}})
    _wait_for_pods(admin, ns, rs, 3, "the restarted controller-manager to scale the ReplicaSet to 3 pods")


def test_disruption_controller_writes_the_budget_status(admin: Any, ns: str) -> None:
    apps, policy = client.AppsV1Api(admin), client.PolicyV1Api(admin)
    rs: Any = apps.create_namespaced_replica_set(ns, _replicaset("guarded", 2))
    _wait_for_pods(admin, ns, rs, 2, "the ReplicaSet controller to create 2 pods")
    pdb: Any = policy.create_namespaced_pod_disruption_budget(ns, client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="guarded"),
        spec=client.V1PodDisruptionBudgetSpec(
            min_available=1, selector=client.V1LabelSelector(match_labels={"app": "guarded"})),
    ))

    def observed() -> Any:
        status: Any = policy.read_namespaced_pod_disruption_budget("guarded", ns).status
        return status if status and status.observed_generation == pdb.metadata.generation else None

    wait_for("the disruption controller to write the PodDisruptionBudget's status", observed, TIMEOUT_S)
    def counted() -> Any:
        status: Any = policy.read_namespaced_pod_disruption_budget("guarded", ns).status
        return status if status.expected_pods == 2 else None

    status = wait_for("the budget to count the ReplicaSet's 2 pods", counted, TIMEOUT_S)
    assert status.desired_healthy == 1
    # No kubelet: the pods never become Ready, so no disruption is allowed.
    assert status.current_healthy == 0 and status.disruptions_allowed == 0


def test_garbage_collector_deletes_the_pods_of_a_deleted_replicaset(admin: Any, ns: str) -> None:
    apps = client.AppsV1Api(admin)
    rs: Any = apps.create_namespaced_replica_set(ns, _replicaset("doomed", 2))
    _wait_for_pods(admin, ns, rs, 2, "the ReplicaSet controller to create 2 pods")
    apps.delete_namespaced_replica_set("doomed", ns, propagation_policy="Background")
    wait_for("the garbage collector to delete the deleted ReplicaSet's pods",
             lambda: not _owned_pods(admin, ns, rs), TIMEOUT_S)


def test_namespaces_get_a_default_serviceaccount_and_are_finalized_when_deleted(admin: Any, ns: str) -> None:
    core = client.CoreV1Api(admin)
    wait_for(f"the ServiceAccount controller to create {ns}/default",
             lambda: "default" in _names(core.list_namespaced_service_account(ns).items), TIMEOUT_S)
    core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="content")))
    core.delete_namespace(ns)

    wait_for(f"the namespace controller to empty and finalize namespace {ns}",
             lambda: ns not in _names(core.list_namespace().items), TIMEOUT_S)

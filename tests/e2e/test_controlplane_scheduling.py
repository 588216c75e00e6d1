"""Nodes advertising NVIDIA extended resources, and kube-scheduler placing pods on them.

The Node objects carry in ``status.capacity/allocatable`` what the NVIDIA device
plugin would advertise (``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb`` under the
mixed strategy, ``nvidia.com/gpu.shared`` when sharing with a rename-free
config). Each test labels its nodes with a run id and pins its pods to that
label, so tests sharing the control plane never see each other's capacity.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.waiting import wait_for

POD_TIMEOUT_S = 60.0


def _node(admin: Any, run: str, suffix: str, extended: dict[str, str]) -> str:
    core = client.CoreV1Api(admin)
    name = f"{run}-{suffix}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=name, labels={"e2e-run": run, "kubernetes.io/hostname": name})))
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", **extended}
    core.patch_node_status(name, {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "E2E",
                        "message": "no kubelet: status written by the test"}]}})
    return name


def _pod(admin: Any, namespace: str, run: str, limits: dict[str, str],
         gates: list[str] | None = None) -> str:
    name = f"p-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin).create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"e2e-run": run},
            scheduling_gates=[client.V1PodSchedulingGate(name=g) for g in gates or []] or None,
            containers=[client.V1Container(
                name="main", image="registry.k8s.io/pause:3.10",
                resources=client.V1ResourceRequirements(limits=limits))])))
    return name


def _wait(what: str, probe: Callable[[], Any], timeout_s: float = POD_TIMEOUT_S) -> Any:
    return wait_for(what, probe, timeout_s, interval_s=0.25)


def _scheduled_condition(admin: Any, namespace: str, pod: str) -> Any:
    status = client.CoreV1Api(admin).read_namespaced_pod(pod, namespace).status
    return next((c for c in status.conditions or [] if c.type == "PodScheduled"), None)


def _bound_node(admin: Any, namespace: str, pod: str) -> str:
    return str(_wait(f"pod {namespace}/{pod} to be bound",
                     lambda: client.CoreV1Api(admin).read_namespaced_pod(pod, namespace)
                     .spec.node_name))


def _unschedulable(admin: Any, namespace: str, pod: str) -> str:
    cond = _wait(f"pod {namespace}/{pod} to be marked unschedulable",
                 lambda: (c := _scheduled_condition(admin, namespace, pod))
                 and c.status == "False" and c.reason == "Unschedulable" and c)
    assert client.CoreV1Api(admin).read_namespaced_pod(pod, namespace).spec.node_name is None
    return str(cond.message)


@pytest.fixture
def run(admin_client: Any, namespace: str) -> Iterator[str]:
    """A run id labelling this test's Nodes; they and the test's pods go afterwards,
    so other tests sharing the control plane never see this capacity."""
    run_id = f"e2e-{uuid.uuid4().hex[:6]}"
    yield run_id
    core = client.CoreV1Api(admin_client)
    for pod in core.list_namespaced_pod(namespace).items:
        # Bound pods wait for a kubelet to confirm deletion; there is none.
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    for node in core.list_node(label_selector=f"e2e-run={run_id}").items:
        core.delete_node(node.metadata.name)


def test_node_extended_resources_can_be_created_and_patched(admin_client: Any, run: str) -> None:
    core = client.CoreV1Api(admin_client)
    name = _node(admin_client, run, "a100", {"nvidia.com/gpu": "8"})
    # The device plugin re-advertises after a MIG change: whole GPUs become MIG devices.
    patch = {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"}
    core.patch_node_status(name, {"status": {"capacity": patch, "allocatable": patch}})
    allocatable = core.read_node(name).status.allocatable
    for resource, amount in patch.items():
        assert allocatable[resource] == amount


def test_scheduler_binds_to_the_node_with_the_resource(
    admin_client: Any, namespace: str, run: str
) -> None:
    _node(admin_client, run, "plain", {})
    mig = _node(admin_client, run, "mig", {"nvidia.com/mig-1g.10gb": "1"})
    shared = _node(admin_client, run, "mps", {"nvidia.com/gpu.shared": "4"})
    pod_mig = _pod(admin_client, namespace, run, {"nvidia.com/mig-1g.10gb": "1"})
    pod_shared = _pod(admin_client, namespace, run, {"nvidia.com/gpu.shared": "1"})
    assert _bound_node(admin_client, namespace, pod_mig) == mig
    assert _bound_node(admin_client, namespace, pod_shared) == shared

    # The only MIG slice is taken: the next such pod stays Pending, and says why.
    second = _pod(admin_client, namespace, run, {"nvidia.com/mig-1g.10gb": "1"})
    assert "Insufficient nvidia.com/mig-1g.10gb" in _unschedulable(admin_client, namespace, second)


def test_pod_stays_pending_when_no_node_has_the_resource(
    admin_client: Any, namespace: str, run: str
) -> None:
    _node(admin_client, run, "whole", {"nvidia.com/gpu": "2"})
    pod = _pod(admin_client, namespace, run, {"nvidia.com/mig-3g.40gb": "1"})
    assert "Insufficient nvidia.com/mig-3g.40gb" in _unschedulable(admin_client, namespace, pod)


def test_scheduling_gate_holds_the_pod_until_lifted(
    admin_client: Any, namespace: str, run: str
) -> None:
    node = _node(admin_client, run, "gated", {"nvidia.com/gpu.shared": "2"})
    pod = _pod(admin_client, namespace, run, {"nvidia.com/gpu.shared": "1"},
               gates=["gpupack.io/capacity"])
    cond = _wait("PodScheduled=False/SchedulingGated",
                 lambda: (c := _scheduled_condition(admin_client, namespace, pod))
                 and c.reason == "SchedulingGated" and c)
    assert cond.status == "False"
    core = client.CoreV1Api(admin_client)
    assert core.read_namespaced_pod(pod, namespace).spec.node_name is None
    # Lifting the gate is what gpupack's controller does once capacity exists.
    core.patch_namespaced_pod(pod, namespace, {"spec": {"schedulingGates": None}})
    assert _bound_node(admin_client, namespace, pod) == node


def test_scheduler_runs_the_shipped_packing_config(
    admin_client: Any, namespace: str, run: str
) -> None:
    """The dev cluster's kube-scheduler runs ``manifests/scheduler/kube-scheduler-config.yaml``:
    MostAllocated scoring (cpu and memory weighted 50) sends a pod to the node whose
    CPU and memory are already partly used. kube-scheduler's default, LeastAllocated,
    would send the second pod to the empty node (its cpu/memory score is higher
    there), so this fails if the default configuration were running."""
    limits = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu.shared": "1"}
    nodes = {_node(admin_client, run, s, {"nvidia.com/gpu.shared": "4"}) for s in ("gpu-a", "gpu-b")}
    first = _pod(admin_client, namespace, run, limits)
    used = _bound_node(admin_client, namespace, first)  # both empty: either node
    assert used in nodes
    for _ in range(2):  # one at a time, so that each decision sees the previous binding
        pod = _pod(admin_client, namespace, run, limits)
        assert _bound_node(admin_client, namespace, pod) == used

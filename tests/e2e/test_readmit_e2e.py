"""A burst of ``auto`` pods is not stranded in the mode it was recorded in (issue 33, item 5).

The whole stack of ``gpupack demo`` (its own real control plane with kube-scheduler and
kube-controller-manager, the webhook registered over TLS, node agents on simulated NVML
emulating the device plugin, the controller as its own ServiceAccount) on two nodes:

- ``mps-a``: 1 x A100 80GB shared by MPS into 4 replicas;
- ``h100-a``: 1 x H100 80GB in MIG mode with three idle ``2g.20gb`` instances (a 10 GiB ask
  does not fit a ``1g.10gb``, which holds 9.75 GiB).

A ReplicaSet of 6 ``auto`` pods (200 milli, 10 GiB) is created at once: the webhook decides
each from the same GPUNode status, four free MPS replicas, and records every one ``mps``.
Four take the replicas; before this fix the other two waited at the gate for good while the
MIG instances sat idle. Now the controller deletes them (gated: they never ran), the
ReplicaSet re-creates them, and the webhook records them ``mig``: every pod is bound.

Also: the controller's token may delete a pod only while it carries the ``gpupack.io/capacity``
gate (ValidatingAdmissionPolicy ``gpupack-controller-pod-deletes``). Deadlines only, no timing
assertions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupack.demo.stack import DEMO_NAMESPACE, DemoNode, Stack
from mig.catalog import get_model
from mig.model import Placement
from node.nvml.simulated import SimulatedNvml
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE
from tests.e2e.waiting import wait_for
from gpupack.testing.admission_reviews import gpu_container

NODES = (DemoNode("mps-a", "A100-80GB", 1, sharing="mps", replicas=4), DemoNode("h100-a", "H100-80GB", 1))
BURST = 6


@pytest.fixture
def stack(control_plane: Any, tmp_path: Path) -> Iterator[Stack]:
    h100 = get_model("H100-80GB")
    sim = SimulatedNvml(h100, 1, tmp_path / "h100-a.nvml.json", seed="h100-a", mig_enabled=True)
    for start in (0, 2, 4):
        sim.create_gpu_instance(0, h100.profile("2g.20gb").profile_id, Placement(start, 2))
    sim.close()
    running = Stack(tmp_path, nodes=NODES, controller_manager=True)
    try:
        running.start(lambda _: None)
        yield running
    finally:
        logs = tmp_path / "logs"
        for name in ("controller", "webhook"):
            path = logs / f"{name}.log"
            if path.exists():
                print(f"--- {name} ---\n{path.read_text(errors='replace')[-3000:]}")
        running.stop()


def _replicaset(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": BURST, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [gpu_container("main", "200", "10Gi")]}}}}


def _live(core: Any, app: str) -> list[Any]:
    pods: list[Any] = core.list_namespaced_pod(DEMO_NAMESPACE, label_selector=f"app={app}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _mode(pod: Any) -> str:
    return str(json.loads(pod.metadata.annotations[ALLOCATION_ANNOTATION])["mode"])


def test_a_burst_of_auto_pods_recorded_mps_all_end_up_bound(stack: Stack) -> None:
    core = client.CoreV1Api(stack.admin)
    wait_for("h100-a's idle MIG instances reported", lambda: _idle_instances(stack) == 3, timeout_s=60)
    client.AppsV1Api(stack.admin).create_namespaced_replica_set(DEMO_NAMESPACE, _replicaset("burst"))
    first = wait_for("the burst admitted", lambda: (lambda p: p if len(p) == BURST else None)(_live(core, "burst")),
                     timeout_s=60)
    assert all(_mode(p) == "mps" for p in first), [_mode(p) for p in first]  # one status for all: the report's burst

    def all_bound() -> list[Any] | None:
        pods = _live(core, "burst")
        return pods if len(pods) == BURST and all(p.spec.node_name for p in pods) else None

    bound = wait_for("every pod of the burst bound", all_bound, timeout_s=180)
    where = sorted((_mode(p), p.spec.node_name) for p in bound)
    assert where == [("mig", "h100-a")] * 2 + [("mps", "mps-a")] * 4, where
    events = core.list_namespaced_event(DEMO_NAMESPACE, field_selector="reason=Readmitted").items
    assert {(e.involved_object.kind, e.involved_object.name) for e in events} == {("ReplicaSet", "burst")}
    assert all("recorded mps" in e.message and "mig has room now" in e.message for e in events)


def _idle_instances(stack: Stack) -> int:
    gpunode = client.CustomObjectsApi(stack.admin).get_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes",
                                                                             "h100-a")
    gpus = (gpunode.get("status") or {}).get("gpus") or []
    return sum(1 for g in gpus for i in g.get("instances") or () if i.get("profile") == "2g.20gb" and not i.get("inUse"))


def test_the_controllers_token_deletes_only_pods_still_gated(
    admin_client: Any, gpupack_installed: Any, sa_client: Callable[[str], Any], namespace: str
) -> None:
    core = client.CoreV1Api(admin_client)
    controller = client.CoreV1Api(sa_client("gpupack-controller"))
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "running-workload"},
             "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1"}]}}
    core.create_namespaced_pod(namespace, plain)

    def refused(dry_run: str | None) -> ApiException | None:
        try:
            controller.delete_namespaced_pod("running-workload", namespace, dry_run=dry_run)
        except ApiException as exc:
            return exc if exc.status == 403 else None
        return None

    # A policy just installed reaches the admission chain asynchronously: wait on a dry run (admitted
    # like the real delete, but it deletes nothing), then ask for real.
    wait_for("the pod-deletes policy to be enforced", lambda: refused("All"), timeout_s=60)
    refusal = refused(None)
    assert refusal is not None, "the controller's token deleted a pod that is not gated on gpupack.io/capacity"
    assert "gated on gpupack.io/capacity" in str(refusal.body)
    assert core.read_namespaced_pod("running-workload", namespace).metadata.deletion_timestamp is None

    gated = {**plain, "metadata": {"name": f"gated-{uuid.uuid4().hex[:6]}"},
             "spec": {**plain["spec"], "schedulingGates": [{"name": CAPACITY_GATE}]}}
    core.create_namespaced_pod(namespace, gated)
    controller.delete_namespaced_pod(gated["metadata"]["name"], namespace)  # allowed: it never ran

"""gpupack through an outage of kube-apiserver or etcd, on a control plane of this module's own.

A simulated node agent and the controller run as their ServiceAccounts while
kube-apiserver (or etcd) is stopped for 8 s: each must wait quietly (a bounded log,
where an agent once wrote megabytes of tracebacks), and once the component is back
a newly created gated pod must be released and bound, with nothing restarted.
Timings are measured by benchmarks/faults.py, not asserted here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpupack.devcluster.apply import apply_objects, gpupack_manifests, node_isolation_manifests
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from tests.e2e.test_controller_e2e import Harness
from tests.e2e.waiting import wait_for

OUTAGE_SECONDS = 8
QUIET_LOG_BYTES = 8_000
"""Most a component may log while the API is gone (a line or two when the failure starts; a
busy loop with tracebacks writes megabytes)."""


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    own = ControlPlane(control_plane.binaries, ControlPlaneConfig()).start()  # with kube-scheduler
    try:
        with own.admin_client() as admin:
            apply_objects(admin, gpupack_manifests() + node_isolation_manifests(), field_manager="outage-e2e")
        yield own
    finally:
        own.stop()


@pytest.fixture
def h(plane: ControlPlane, tmp_path: Any) -> Iterator[Harness]:
    admin = plane.admin_client()
    namespace = f"outage-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(admin).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    harness = Harness(admin, plane.serviceaccount_kubeconfig, tmp_path, namespace, plane.node_agent_kubeconfig)
    yield harness
    logs = {name: harness.log(name)[-1500:] for name in harness.processes}
    harness.cleanup()
    admin.close()
    for name, text in logs.items():
        print(f"--- {name} ---\n{text}")


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_gpupack_waits_quietly_through_an_outage_and_places_pods_after_it(
    h: Harness, plane: ControlPlane, component: str
) -> None:
    node = h.node("a", 1, {0: ["1g.10gb"] * 7})  # starts its agent, and waits for its report
    h.policy()
    h.controller("ctl-1")
    h.gated_pod("before", "1g.10gb")
    wait_for("a pod bound before the outage", lambda: h.node_of("before") == node, timeout_s=90)
    logged = {name: len(h.log(name)) for name in h.processes}

    plane.stop_component(component)
    time.sleep(OUTAGE_SECONDS)
    grown = {name: len(h.log(name)) - logged[name] for name in h.processes}
    plane.start_component(component)
    assert all(size < QUIET_LOG_BYTES for size in grown.values()), grown
    assert all(proc.running() for proc in h.processes.values())  # nothing crashed out

    def created() -> bool:
        try:
            h.gated_pod("after", "1g.10gb")
        except client.ApiException as exc:
            if exc.status != 409:
                return False
        return True

    wait_for("the API to take a pod again", created, timeout_s=60)
    pod: Any = wait_for("the controller to release it", lambda: (
        p := h.core.read_namespaced_pod("after", h.namespace)) and not p.spec.scheduling_gates and p, timeout_s=90)
    assert pod.metadata.name == "after"
    wait_for("kube-scheduler to bind it", lambda: h.node_of("after") == node, timeout_s=180)

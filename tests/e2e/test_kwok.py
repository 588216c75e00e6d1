"""KWOK on the real control plane (``kwok_plane``: kube-scheduler, kube-controller-manager, kwok).

A KWOK node turns Ready and keeps a renewed Lease; a Node without kwok's annotation is left
alone; pods bound to KWOK nodes run, end Succeeded after the seconds of their
``gpupack.io/duration-seconds`` annotation or run on without one, and go away when deleted;
a small fleet of 20 nodes comes up and takes a full load of GPU pods; ``gpupack dev cluster up
--kwok`` runs it all (docs/kwok.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.devcluster import kwok
from gpupack.devcluster.clients import api_client
from gpupack.devcluster.controlplane import ControlPlane
from sharing.api.keys import DURATION_ANNOTATION
from tests.e2e.waiting import wait_for

WAIT_S = 90.0  # generous: the 2-core CI machine runs other components too
LEASE_NAMESPACE = "kube-node-lease"


@pytest.fixture(scope="module")
def api(kwok_plane: ControlPlane) -> Iterator[Any]:
    with kwok_plane.admin_client() as admin:
        yield admin


@pytest.fixture(scope="module")
def node(api: Any) -> str:
    """One KWOK node, Ready, for the pod tests."""
    (name,) = kwok.create_nodes(api, 1, prefix="pods-", cpu=16, memory="64Gi", extended={"nvidia.com/gpu": 8})
    kwok.wait_ready(api, [name], WAIT_S)
    return name


@pytest.fixture
def namespace(api: Any) -> str:
    name = f"kwok-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def _eventually(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll ``probe`` (``tests.e2e.waiting.wait_for``, every 0.5 s) with this module's patience."""
    return wait_for(what, probe, timeout_s, interval_s=0.5)


def _pod(name: str, selector: dict[str, str], annotations: dict[str, str] | None = None,
         gpus: int = 0) -> client.V1Pod:
    """A pod for kube-scheduler to bind (as in a fleet run) to a node ``selector`` picks."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        spec=client.V1PodSpec(
            restart_policy="Never",
            node_selector=selector,
            containers=[client.V1Container(
                name="main", image="registry.invalid/job:1",
                resources=client.V1ResourceRequirements(
                    requests={"cpu": "100m"}, limits={"nvidia.com/gpu": str(gpus)} if gpus else None),
            )],
        ),
    )


def _on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def _read(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    return core.read_namespaced_pod(name, namespace)


def _phase(core: client.CoreV1Api, namespace: str, name: str) -> str:
    return str(_read(core, namespace, name).status.phase)


def test_a_kwok_node_turns_ready_with_its_capacity_and_keeps_a_renewed_lease(api: Any) -> None:
    core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
    (name,) = kwok.create_nodes(api, 1, prefix="lease-", cpu=8, memory="32Gi", pods=50,
                                extended={"nvidia.com/gpu": 4}, labels={"gpupack.io/pool": "a"})
    kwok.wait_ready(api, [name], WAIT_S)
    node: Any = core.read_node(name)
    assert node.status.allocatable == node.status.capacity == {
        "cpu": "8", "memory": "32Gi", "pods": "50", "nvidia.com/gpu": "4"}
    assert node.metadata.labels["gpupack.io/pool"] == "a"
    assert node.spec.taints is None  # nothing tainted it: no node-lifecycle controller runs
    assert node.status.node_info.kubelet_version.startswith("kwok-")

    def lease() -> Any:
        try:
            return leases.read_namespaced_lease(name, LEASE_NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    first = _eventually(f"a Lease for {name}", lease)
    # Held by the kwok instance (its id; a kubelet writes its node's name), for the kubelet's duration.
    assert first.spec.holder_identity
    assert first.spec.lease_duration_seconds == kwok.NODE_LEASE_SECONDS
    # Renewed every quarter of the lease duration, as a kubelet renews its own.
    def renewed() -> Any:
        now = lease()
        return now if now.spec.renew_time > first.spec.renew_time else None

    renewal = _eventually("the Lease renewed", renewed)
    assert renewal.metadata.owner_references[0].name == name
    assert _node(core, name).spec.taints is None


def _node(core: client.CoreV1Api, name: str) -> Any:
    return core.read_node(name)


def test_a_node_without_the_annotation_is_left_alone(api: Any, node: str) -> None:
    core = client.CoreV1Api(api)
    name = f"by-hand-{uuid.uuid4().hex[:6]}"
    manifest = kwok.node_manifest(name)
    del manifest["metadata"]["annotations"]
    core.create_node(body=manifest)  # type: ignore[arg-type]  # the client sends a dict as it is
    # kwok made another node Ready since; this one stays as written: no conditions, no Lease.
    (other,) = kwok.create_nodes(api, 1, prefix=f"{name}-kwok-")
    kwok.wait_ready(api, [other], WAIT_S)
    assert not _node(core, name).status.conditions
    with pytest.raises(ApiException) as missing:
        client.CoordinationV1Api(api).read_namespaced_lease(name, LEASE_NAMESPACE)
    assert missing.value.status == 404


def test_pods_run_and_finish_after_their_duration(api: Any, node: str, namespace: str) -> None:
    core = client.CoreV1Api(api)
    duration = 3
    pods = {
        "timed": {DURATION_ANNOTATION: str(duration)},
        "untimed": {},
        "garbled": {DURATION_ANNOTATION: "soon"},  # not a number: treated as no duration
    }
    for name, marks in pods.items():
        core.create_namespaced_pod(namespace, _pod(name, _on(node), marks, gpus=1))
    def started(name: str) -> bool:
        return _phase(core, namespace, name) in ("Running", "Succeeded")

    for name in pods:
        _eventually(f"{name} Running", lambda: started(name))
    running = _read(core, namespace, "untimed")
    assert running.spec.node_name == node
    assert running.status.pod_ip and running.status.host_ip
    assert {c.type for c in running.status.conditions if c.status == "True"} >= {"PodScheduled", "Ready"}

    _eventually("timed Succeeded", lambda: _phase(core, namespace, "timed") == "Succeeded")
    timed = _read(core, namespace, "timed")
    (status,) = timed.status.container_statuses
    assert status.state.terminated.exit_code == 0 and status.state.terminated.reason == "Completed"
    assert {c.type: c.status for c in timed.status.conditions}["Ready"] == "False"
    # Not before its duration: the stage's deadline is startTime + duration.
    assert (status.state.terminated.finished_at - timed.status.start_time).total_seconds() >= duration
    # Both others started with it and run on.
    assert _phase(core, namespace, "untimed") == "Running"
    assert _phase(core, namespace, "garbled") == "Running"


def test_a_deleted_pod_goes_away(api: Any, node: str, namespace: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, _pod("doomed", _on(node)))
    _eventually("doomed Running", lambda: _phase(core, namespace, "doomed") == "Running")
    core.delete_namespaced_pod("doomed", namespace)  # graceful: 30 s, which no kubelet would wait out here

    def gone() -> bool:
        try:
            core.read_namespaced_pod("doomed", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    _eventually("doomed deleted", gone, timeout_s=25)


def test_a_fleet_of_20_nodes_comes_up_and_takes_a_full_gpu_load(api: Any, namespace: str) -> None:
    core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
    names = kwok.create_nodes(api, 20, prefix="fleet-", cpu=64, memory="512Gi",
                              extended={"nvidia.com/gpu": 8}, labels={"gpupack.io/fleet": "e2e"})
    kwok.wait_ready(api, names, WAIT_S)
    listed: Any = leases.list_namespaced_lease(LEASE_NAMESPACE)
    held = {lease.metadata.name for lease in listed.items}
    assert set(names) <= held
    # 40 pods of 4 GPUs fill 20 nodes of 8 exactly: every one runs, on every node, 2 each.
    for i in range(40):
        core.create_namespaced_pod(namespace, _pod(f"gpu-{i:02d}", {"gpupack.io/fleet": "e2e"}, gpus=4))

    def running() -> list[Any]:
        pods: list[Any] = core.list_namespaced_pod(namespace).items
        return pods if sum(p.status.phase == "Running" for p in pods) == 40 else []

    pods = _eventually("40 pods Running", running)
    per_node: dict[str, int] = {}
    for pod in pods:
        per_node[pod.spec.node_name] = per_node.get(pod.spec.node_name, 0) + 1
    assert per_node == {name: 2 for name in names}


def test_cli_up_kwok_runs_nodes_and_down_stops_it(kwok_plane: ControlPlane, tmp_path: Path) -> None:
    """``gpupack dev cluster up --kwok``: kube-controller-manager and kwok run, a KWOK node turns
    Ready in it; ``down`` stops all five."""
    env = {**os.environ, "GPUPACK_DEVCLUSTER_DIR": str(tmp_path / "dev"),
           "GPUPACK_K8S_BIN_DIR": str(kwok_plane.binaries.bin_dir)}

    def gpupack(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpupack", "dev", "cluster", *args],
                              env=env, capture_output=True, text=True, timeout=180)

    up = gpupack("up", "--kwok", "--bare")
    assert up.returncode == 0, up.stderr
    kubeconfig = Path(up.stdout.strip().splitlines()[-1].removeprefix("KUBECONFIG="))
    try:
        status = gpupack("status")
        assert status.returncode == 0, status.stdout
        running = {line.split()[0] for line in status.stdout.splitlines() if " running " in line}
        assert running == {"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok"}
        with api_client(kubeconfig) as admin:
            kwok.wait_ready(admin, kwok.create_nodes(admin, 2, prefix="cli-"), WAIT_S)
    finally:
        down = gpupack("down")
    assert down.returncode == 0 and "kwok" in down.stdout, down.stdout + down.stderr

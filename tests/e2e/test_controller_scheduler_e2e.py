"""The shipped kube-scheduler configuration packs GPU pods (real kube-scheduler binary).

A second kube-scheduler runs with ``manifests/scheduler/kube-scheduler-config.yaml``,
its profile renamed ``gpupack-packing`` so that it does not race the session's
scheduler (which runs the shipped configuration too). Pods naming that scheduler
go to the node whose resources (CPU and memory weighted 50, GPU 1) are most allocated; the same pods under a
scheduler with the stock scoring (the profile's plugin settings removed:
LeastAllocated) spread, which shows the test can tell the two apart.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupack.devcluster.process import free_port
from tests.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
RESOURCE = "nvidia.com/mig-1g.10gb"


@pytest.fixture
def packing_scheduler(control_plane: Any, tmp_path: Path, scheduler: str) -> Any:
    config = yaml.safe_load(CONFIG.read_text())
    config["clientConnection"]["kubeconfig"] = str(control_plane.workdir / "scheduler.kubeconfig")
    config["profiles"][0]["schedulerName"] = scheduler
    if scheduler == "stock-scoring":
        config["profiles"][0] = {"schedulerName": scheduler}
    config["leaderElection"] = {"leaderElect": False}
    config.pop("extenders", None)  # no webhook here to serve gpupack's prioritize extender
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "scheduler.log").open("wb")
    proc = subprocess.Popen([str(control_plane.binaries.kube_scheduler), f"--config={path}",
                             f"--secure-port={free_port()}", "--bind-address=127.0.0.1"],
                            stdout=log, stderr=subprocess.STDOUT)
    yield proc
    stop_process(proc)
    log.close()
    print((tmp_path / "scheduler.log").read_text()[-2000:])


def _node(core: Any, name: str, run: str) -> None:
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"sched-e2e": run})))
    res = {"cpu": "32", "memory": "128Gi", "pods": "110", RESOURCE: "7"}
    core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})


def _pod(core: Any, namespace: str, name: str, run: str, scheduler: str | None, node: str | None = None) -> None:
    # CPU and memory asked as GPU pods do: the shipped profile weighs them most.
    limits = {RESOURCE: "1", "cpu": "2", "memory": "8Gi"}
    spec: dict[str, Any] = {"nodeSelector": {"sched-e2e": run}, "containers": [
        {"name": "c", "image": "example.com/app:1", "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    body: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    core.create_namespaced_pod(namespace, body)


def _placed(core: Any, namespace: str, names: list[str]) -> list[str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = [core.read_namespaced_pod(n, namespace).spec.node_name for n in names]
        if all(nodes):
            return nodes
        time.sleep(0.2)
    pytest.fail(f"pods not bound: {names}")


@pytest.mark.parametrize("scheduler", ["gpupack-packing", "stock-scoring"])
def test_gpu_pods_pack_onto_the_most_allocated_node(
    packing_scheduler: Any, admin_client: Any, namespace: str, scheduler: str
) -> None:
    core = client.CoreV1Api(admin_client)
    run = uuid.uuid4().hex[:6]
    full, empty = f"sched-{run}-full", f"sched-{run}-empty"
    _node(core, full, run)
    _node(core, empty, run)
    for i in range(3):  # the "full" node already runs three 1g pods
        _pod(core, namespace, f"old-{i}", run, None, node=full)
    names = [f"new-{i}" for i in range(3)]
    for name in names:
        _pod(core, namespace, name, run, scheduler)
        _placed(core, namespace, [name])  # one at a time: each decision sees the previous one
    placed = _placed(core, namespace, names)
    if scheduler == "gpupack-packing":
        assert placed == [full, full, full]
    else:
        assert empty in placed  # the default LeastAllocated scoring spreads

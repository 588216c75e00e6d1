"""gpupack's prioritize extender with the real kube-scheduler (issue 36): kube-scheduler places its own
pods (plain ``nvidia.com/gpu`` pods here) first among the nodes holding no GPU pod of lower priority
(docs/priority.md, "kube-scheduler's pods").

The webhook runs as its own process with the ``gpupack-webhook`` ServiceAccount's kubeconfig (its RBAC
is exercised: it lists and watches pods) and serves ``/scheduler/prioritize`` over TLS. A second
kube-scheduler (its own ``schedulerName``) runs the shipped configuration as the local control plane
writes it (``gpupack.devcluster.components.scheduler_config``), calling that webhook, so the shared
scheduler of the other tests is left alone. Nodes have no kubelet; pods carry real PriorityClasses,
which the API server's Priority admission resolves into ``spec.priority``.

The pods' CPU is chosen so that MostAllocated alone would send the high pod beside the low one; a low
pod is not steered (it outranks nobody). Deadlines only, no timing assertions.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from gpupack.devcluster import components
from gpupack.devcluster.process import free_port
from sharing.api.keys import PRIORITIZE_VERB, SCHEDULER_EXTENDER_PREFIX
from tests.e2e.test_webhook_e2e import Webhook
from tests.e2e.waiting import wait_for
from tests.processes import stop_process

SCHEDULER = "gpupack-extender-e2e"
HIGH, LOW = 1000, 0


class Extender:
    """The webhook process and a kube-scheduler that calls its prioritize extender."""

    def __init__(self, hook: Webhook, scheduler: subprocess.Popen[bytes]) -> None:
        self.hook = hook
        self.scheduler = scheduler

    def scores(self, priority: int, nodes: list[str]) -> dict[str, int] | None:
        """What the extender answers for a pod of ``priority`` over ``nodes``, as kube-scheduler asks
        (``ExtenderArgs`` has no json tags: capitalised keys); None while it does not answer 200."""
        pod = {"metadata": {"name": "probe", "namespace": "default"}, "spec": {"priority": priority, "containers": []}}
        body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": nodes}).encode()
        request = urllib.request.Request(f"{self.hook.url}{SCHEDULER_EXTENDER_PREFIX}/{PRIORITIZE_VERB}", body,
                                         {"Content-Type": "application/json"}, method="POST")
        context = ssl.create_default_context(cafile=str(self.hook.ca_file))
        try:
            with urllib.request.urlopen(request, context=context, timeout=5) as answer:
                return {h["Host"]: int(h["Score"]) for h in json.loads(answer.read())}
        except (urllib.error.URLError, OSError):
            return None


@pytest.fixture
def extender(control_plane: Any, gpupack_installed: Any, sa_kubeconfig: Callable[[str], Path],
             tmp_path: Path) -> Iterator[Extender]:
    hook = Webhook(tmp_path, sa_kubeconfig("gpupack-webhook"))
    config = components.scheduler_config(
        control_plane.workdir, components.SchedulerExtender(hook.url + SCHEDULER_EXTENDER_PREFIX, hook.ca_file))
    config["profiles"][0]["schedulerName"] = SCHEDULER
    config["leaderElection"] = {"leaderElect": False}
    path = tmp_path / "scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp_path / "scheduler.log").open("wb")
    scheduler = subprocess.Popen([str(control_plane.binaries.kube_scheduler), f"--config={path}",
                                  f"--secure-port={free_port()}", "--bind-address=127.0.0.1", "--v=5"],
                                 stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Extender(hook, scheduler)
    finally:
        stop_process(scheduler)
        log.close()
        hook.stop()
        print(hook.log_path.read_text()[-3000:])
        print("\n".join(line for line in (tmp_path / "scheduler.log").read_text().splitlines()
                        if "xtender" in line)[-3000:])


class Cluster:
    """Two kubelet-less nodes of this run, PriorityClasses of its own, plain GPU pods."""

    def __init__(self, admin: Any, namespace: str) -> None:
        self.core = client.CoreV1Api(admin)
        self.scheduling = client.SchedulingV1Api(admin)
        self.namespace = namespace
        self.run = uuid.uuid4().hex[:6]
        self.classes: dict[int, str] = {}
        self.nodes: list[str] = []

    def node(self, suffix: str) -> str:
        name = f"ext-{self.run}-{suffix}"
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={"ext-e2e": self.run})))
        res = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "8"}
        self.core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
        self.nodes.append(name)
        return name

    def priority_class(self, value: int) -> str:
        name = f"ext-{self.run}-{value}"
        self.scheduling.create_priority_class(cast(Any, {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}))
        self.classes[value] = name
        return name

    def pod(self, name: str, priority: int, cpu: int, node: str | None = None) -> None:
        spec: dict[str, Any] = {
            "schedulerName": SCHEDULER, "priorityClassName": self.classes[priority],
            "nodeSelector": {"ext-e2e": self.run},
            "containers": [{"name": "c", "image": "example.com/app:1", "resources": {
                "limits": {"nvidia.com/gpu": "1", "cpu": str(cpu), "memory": "1Gi"}}}]}
        if node is not None:
            spec["nodeName"] = node
        self.core.create_namespaced_pod(self.namespace, cast(Any, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}))

    def bound(self, name: str) -> str:
        found: list[str] = []

        def placed() -> bool:
            node = self.core.read_namespaced_pod(name, self.namespace).spec.node_name
            if node:
                found.append(node)
            return bool(node)

        wait_for(f"pod {name} bound", placed, 60, interval_s=0.2)
        return found[-1]

    def cleanup(self) -> None:
        for name in self.classes.values():
            self.scheduling.delete_priority_class(name)
        for name in self.nodes:
            self.core.delete_node(name)


def test_kube_scheduler_places_by_priority_through_the_extender(extender: Extender, admin_client: Any,
                                                                namespace: str) -> None:
    cluster = Cluster(admin_client, namespace)
    try:
        a, b = cluster.node("a"), cluster.node("b")
        cluster.priority_class(HIGH)
        cluster.priority_class(LOW)
        wait_for("the extender to answer", lambda: extender.scores(HIGH, [a, b]) == {a: 10, b: 10}, 60, interval_s=0.25)

        cluster.pod("low-1", LOW, cpu=8, node=a)  # bound at creation: a GPU pod of low priority on a
        # The webhook's pod watch sees it: a high pod outranks it, so a is no longer preferred for one.
        wait_for("the extender to see the low pod", lambda: extender.scores(HIGH, [a, b]) == {a: 0, b: 10}, 60,
                 interval_s=0.25)
        assert extender.scores(LOW, [a, b]) == {a: 10, b: 10}  # a low pod outranks nobody

        # MostAllocated alone: a (8 + 20 of 32 CPUs) over b (20 of 32). The extender's 10 x 100 x 10 outranks it.
        cluster.pod("high-1", HIGH, cpu=20)
        assert cluster.bound("high-1") == b
        # A low pod is not steered: MostAllocated sends it to b (20 + 2 of 32 against 8 + 2), beside the high pod.
        cluster.pod("low-2", LOW, cpu=2)
        assert cluster.bound("low-2") == b
        wait_for("the extender to see the second low pod", lambda: extender.scores(HIGH, [a, b]) == {a: 0, b: 0},
                 60, interval_s=0.25)
        # No node is preferred now: a high pod goes where MostAllocated finds room (a preference, not a filter).
        cluster.pod("high-2", HIGH, cpu=16)
        assert cluster.bound("high-2") == a
    finally:
        cluster.cleanup()

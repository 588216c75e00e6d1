"""The right-sizing scenario's calls to the API server (``gpupack demo --right-sizing MODE``).

The rules and the summary are in :mod:`gpupack.demo.rightsizing` (pure); this module sets the
scenario up on a started :class:`gpupack.demo.stack.Stack`, and at each demo tick reads what the
scenario reports and acts where the demo stands in for someone: the kubelet (its pods run, and
go when deleted) and, with ``initial``, whatever restarts a pod.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from gpupack.demo.rightsizing import (
    APP_LABEL, RECOMMENDATION_PLURAL, Scenario, deployment, label_patch, playing_kubelet, ready_status, right_sized,
    workload_of_pod,
)
from gpupack.demo.stack import DemoNode, Stack
from gpupack.devcluster.apply import apply_objects, load_manifests
from sharing.api.crd import GROUP, VERSION

WORKLOADS = ("svc-a", "svc-b", "svc-c")
"""The scenario's Deployments (one replica each, a whole GPU each)."""
POLICY = "demo"
"""The SharingPolicy the demo stack creates (``Stack._policy``)."""
NODES = (
    DemoNode("a100-w", "A100-80GB", 4),
    DemoNode("a100-t", "A100-80GB", 2, sharing="time-slicing", replicas=4),
)
"""The nodes the scenario adds. A pod's compute is measured only where it holds a device alone, with
NVML's per-process samples (docs/right-sizing.md, "A right-sized share has no SM cap"): not on a MIG
instance (the simulated NVML, as the real one, has no per-instance activity) nor under MPS. So the
Deployments' whole GPUs come from ``a100-w``, whose GPUs run with MIG off, and their right-sized
time-slicing shares from ``a100-t``."""


def add_nodes(stack: Stack) -> None:
    """Add :data:`NODES` to ``stack`` before it starts, ``a100-w``'s GPUs with MIG off (the stack
    starts a node without sharing with MIG on; a MIG mode change needs a GPU reset, so a node is set
    up one way or the other before its agent runs)."""
    from mig.catalog import get_model
    from node.nvml.simulated import SimulatedNvml

    stack.nodes = (*stack.nodes, *NODES)
    whole = NODES[0]
    SimulatedNvml(get_model(whole.model), whole.gpus, stack.state_file(whole.name), seed=whole.name,
                  mig_enabled=False)


class LiveScenario:
    """The scenario on a running stack: :meth:`setup` once, :meth:`step` every demo tick."""

    def __init__(self, admin: Any, namespace: str, mode: str, say: Any) -> None:
        self.admin, self.namespace, self.say = admin, namespace, say
        self.scenario = Scenario(mode, WORKLOADS)
        self.core, self.apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
        self.custom = client.CustomObjectsApi(admin)

    def setup(self, repo: Any) -> None:
        """Label the namespace with the mode, install the Recreate grant (``recreate``), create the
        Deployments."""
        self.core.patch_namespace(self.namespace, label_patch(self.scenario.mode))
        if self.scenario.mode == "recreate":
            apply_objects(self.admin, load_manifests(repo / "manifests" / "right-sizing-recreate"),
                          field_manager="gpupack-demo")
        self._first_cycle()
        for name in WORKLOADS:
            body: Any = deployment(name, self.namespace)  # a dict body is sent as is
            self.apps.create_namespaced_deployment(self.namespace, body)
        self.say(f"right-sizing: namespace {self.namespace} labelled {self.scenario.summary()['right_sizing']}; "
                 f"{len(WORKLOADS)} Deployments of one replica ask a whole GPU each ({', '.join(WORKLOADS)})")

    def _first_cycle(self, timeout_s: float = 60.0) -> None:
        """Wait until the controller has run a planning cycle (its first writes the demo SharingPolicy's
        status). Recreate's budget counts a workload's pods created before the controller's first cycle
        as possible replacements of evictions it cannot remember (docs/right-sizing.md, "Budget"), so
        Deployments created earlier would not move for an hour."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            policy: Any = self.custom.get_cluster_custom_object(GROUP, VERSION, "sharingpolicies", POLICY)
            if (policy.get("status") or {}).get("observedGeneration"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for the controller's first cycle")

    def step(self) -> None:
        listed: Any = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                RECOMMENDATION_PLURAL)
        pods = [self.admin.sanitize_for_serialization(p) for p in
                self.core.list_namespaced_pod(self.namespace, label_selector=APP_LABEL).items]
        events = [self.admin.sanitize_for_serialization(e) for e in
                  self.core.list_namespaced_event(self.namespace).items]
        self.scenario.observe(listed.get("items") or [], pods, events)
        for pod in pods:
            self._kubelet(pod)
        if self.scenario.mode == "initial":
            self._restart(pods)

    def _kubelet(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        action = playing_kubelet(pod)
        try:
            if action == "ready":
                self.core.patch_namespaced_pod_status(name, self.namespace, ready_status())
            elif action == "remove":
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:  # gone meanwhile: nothing to play
                raise

    def _restart(self, pods: list[dict[str, Any]]) -> None:
        """Initial: restart each workload's unsized pod once its recommendation is provided, so the
        ReplicaSet's new pod goes through admission again."""
        provided = self.scenario.provided()
        for pod in pods:
            workload = workload_of_pod(pod)
            if workload not in provided or workload in self.scenario.restarted or right_sized(pod) is not None:
                continue
            if not (pod.get("spec") or {}).get("nodeName"):
                continue
            self.scenario.restarted.add(workload)
            self.say(f"right-sizing: {workload}'s recommendation is provided; restarting its pod "
                     f"{pod['metadata']['name']} (as a crash or a drain would)")
            self.core.delete_namespaced_pod(pod["metadata"]["name"], self.namespace, grace_period_seconds=0)

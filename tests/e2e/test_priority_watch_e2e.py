"""The scheduler extender's pod watch against the real API server, and its route over loopback HTTP.

Pods bound to nodes by ``spec.nodeName`` (no kubelet runs them: the API server accepts the
binding, and a pod's node is what the preference reads), with priorities resolved by the real
Priority admission plugin from PriorityClasses. The watch (``webhook.priority_watch``, the real
list call with the unfinished-pods selector) counts them; ``POST /scheduler/prioritize`` answers
kube-scheduler's ExtenderArgs from it. kube-scheduler calling the extender is the lead's e2e test.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from kubernetes import client

from tests.unit.test_priority_watch import Served, extender_args
from webhook.app import PRIORITIZE_PATH, build_app
from webhook.inventory_source import InventoryHolder
from webhook.metrics import Metrics
from webhook.priority_watch import PriorityWatch
from webhook.settings import WebhookSettings


def _pod(name: str, node: str, *, gpus: int = 1, priority_class: str | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/none",
                                                              "resources": {"limits": limits}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"not seen within 30 s: {what}"
        time.sleep(0.1)


def test_the_watch_counts_real_pods_and_the_route_scores_from_it(admin_client: Any, namespace: str) -> None:
    core: Any = client.CoreV1Api(admin_client)  # raw dicts, as the API server takes them
    scheduling: Any = client.SchedulingV1Api(admin_client)
    high = f"e2e-high-{uuid.uuid4().hex[:6]}"
    scheduling.create_priority_class({"metadata": {"name": high}, "value": 1000})
    tag = uuid.uuid4().hex[:6]
    a, b, c, empty = (f"node-{x}-{tag}" for x in "abce")
    for pod in (_pod("high-a", a, priority_class=high), _pod("low-b", b), _pod("high-b", b, priority_class=high),
                _pod("cpu-c", c, gpus=0, priority_class=high)):
        core.create_namespaced_pod(namespace, pod)
    watch = PriorityWatch.from_api(admin_client, WebhookSettings(resync_seconds=30))
    server = Served(build_app(InventoryHolder(), WebhookSettings(), Metrics(), priorities=watch))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.post(PRIORITIZE_PATH, content=extender_args(1000, [a])).status_code == 503
            watch.start()
            assert watch.informer.wait_synced(30)
            _until(lambda: watch.synced, "the first list counted")
            assert watch.priorities([a, b, c, empty]) == {a: frozenset({1000}), b: frozenset({0, 1000})}

            def scores(priority: int) -> list[int]:
                answer = http.post(PRIORITIZE_PATH, content=extender_args(priority, [a, b, c, empty]))
                assert answer.status_code == 200, answer.text
                return [h["Score"] for h in json.loads(answer.content)]

            assert scores(1000) == [10, 0, 10, 10]
            assert scores(0) == [10, 10, 10, 10]  # a pod of the lowest priority outranks nobody
            # a pod leaving node b leaves no lower pod there; a pod that finishes leaves its node empty
            core.delete_namespaced_pod("low-b", namespace, grace_period_seconds=0)
            _until(lambda: watch.priorities([b]) == {b: frozenset({1000})}, "low-b gone")
            assert scores(1000) == [10, 10, 10, 10]
            assert scores(2000) == [0, 0, 10, 10]  # a pod above every pod here outranks a's and b's
            core.patch_namespaced_pod_status("high-a", namespace, {"status": {"phase": "Succeeded"}})
            _until(lambda: watch.priorities([a]) == {}, "high-a finished")
            assert scores(2000) == [10, 0, 10, 10]
            assert watch.informer.lists == 1  # followed by the watch, never listed again
    finally:
        watch.stop()
        server.stop()
        scheduling.delete_priority_class(high)

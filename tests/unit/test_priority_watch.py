"""webhook.priority_watch and ``POST /scheduler/prioritize``: the pod index, and the route over real HTTP.

The pod watch is a real :class:`kube.informer.Informer` fed by a scripted list and watch (the
API server's answers); the route is served by uvicorn on a loopback socket and called with an
ExtenderArgs exactly as kube-scheduler marshals it (capitalized keys, ``NodeNames``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from tests.unit.test_gpu_pod_site import pod
from tests.unit.test_informer import ScriptedLister, listing
from webhook.app import PRIORITIZE_PATH, build_app
from webhook.inventory_source import InventoryHolder
from webhook.metrics import Metrics
from webhook.priority_watch import PriorityWatch
from webhook.settings import WebhookSettings


def versioned(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = rv
    return obj


def cluster() -> list[dict[str, Any]]:
    return [
        versioned(pod("high-a", gpus=1, node="a", priority=1000), "1"),
        versioned(pod("high-b", mode="mps", node="b", priority=1000), "2"),
        versioned(pod("low-b", mode="mps", node="b", priority=0), "3"),
        versioned(pod("low-c", mode="time-slicing", pinned="c", gated=True, priority=0), "4"),
        versioned(pod("mig-d", mode="mig", node="d", priority=0), "5"),
        versioned(pod("cpu-d", node="d", priority=0), "6"),
    ]


def test_the_index_follows_the_informers_events() -> None:
    moved = versioned(pod("low-b", mode="mps", node="a", priority=0), "11")
    lister = ScriptedLister([listing("10", *cluster())], [[
        {"type": "MODIFIED", "object": moved},
        {"type": "DELETED", "object": versioned(pod("high-b", mode="mps", node="b", priority=1000), "12")},
        {"type": "MODIFIED", "object": versioned(pod("high-a", gpus=1, node="a", priority=1000, phase="Succeeded"),
                                                 "13")},
    ]])
    watch = PriorityWatch(lister)
    assert not watch.synced
    watch.informer.relist()
    assert watch.synced and len(watch) == 4  # the MIG pod and the CPU-only pod are not GPU pods here
    assert watch.priorities(["a", "b", "c", "d", "e"]) == {
        "a": frozenset({1000}), "b": frozenset({0, 1000}), "c": frozenset({0})}
    assert watch.counts("b") == {0: 1, 1000: 1}
    watch.informer.watch_once()
    # low-b moved to a, high-b is gone, high-a finished: only low-b on a and low-c on c remain
    assert watch.priorities(["a", "b", "c"]) == {"a": frozenset({0}), "c": frozenset({0})}
    assert watch.counts("b") == {} and len(watch) == 2


def test_a_relist_replaces_what_the_index_counted() -> None:
    lister = ScriptedLister([listing("10", *cluster()), listing("20", cluster()[0])], [])
    watch = PriorityWatch(lister)
    watch.informer.relist()
    watch.informer.relist()
    assert watch.priorities(["a", "b", "c"]) == {"a": frozenset({1000})} and len(watch) == 1


class Served:
    """``app`` served by uvicorn on a loopback socket in a thread."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture()
def served() -> Iterator[tuple[Served, PriorityWatch, Metrics]]:
    watch = PriorityWatch(ScriptedLister([listing("10", *cluster())], []))
    metrics = Metrics()
    server = Served(build_app(InventoryHolder(), WebhookSettings(max_body_bytes=64 * 1024), metrics,
                              priorities=watch))
    try:
        yield server, watch, metrics
    finally:
        server.stop()


def extender_args(priority: int, names: list[str]) -> bytes:
    """An ExtenderArgs as kube-scheduler's Go client marshals it (no json tags; nodeCacheCapable)."""
    waiting = pod("web", gpus=1, priority=priority, phase="Pending")
    return json.dumps({"Pod": waiting, "Nodes": None, "NodeNames": names}).encode()


def test_the_route_scores_nodes_over_http(served: tuple[Served, PriorityWatch, Metrics]) -> None:
    server, watch, metrics = served
    with httpx.Client(base_url=server.url, timeout=10) as client:
        before = client.post(PRIORITIZE_PATH, content=extender_args(1000, ["a"]))
        assert before.status_code == 503 and "not synced" in before.json()["error"]
        watch.informer.relist()
        high = client.post(PRIORITIZE_PATH, content=extender_args(1000, ["a", "b", "c", "d", "e"]))
        assert high.status_code == 200
        assert high.json() == [{"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}, {"Host": "c", "Score": 0},
                               {"Host": "d", "Score": 10}, {"Host": "e", "Score": 10}]
        # A pod of priority 0 outranks nobody here: every node is preferred alike.
        low = client.post(PRIORITIZE_PATH, content=extender_args(0, ["a", "b", "c"]))
        assert [h["Score"] for h in low.json()] == [10, 10, 10]
        # Priority 500 outranks the priority-0 pods of b and c, not the priority-1000 pod of a.
        middle = client.post(PRIORITIZE_PATH, content=extender_args(500, ["a", "b", "c"]))
        assert [h["Score"] for h in middle.json()] == [10, 0, 0]
        broken = client.post(PRIORITIZE_PATH, content=b'{"Pod": {"metadata": {"name": "web"}}, "NodeNames": ["a"]}')
        assert broken.status_code == 400 and broken.json() == {"error": "ExtenderArgs Pod default/web has no spec"}
        not_json = client.post(PRIORITIZE_PATH, content=b"{")
        assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]
        too_large = client.post(PRIORITIZE_PATH, content=b" " * (64 * 1024 + 1))
        assert too_large.status_code == 413 and "larger than" in too_large.json()["error"]
        assert client.get(PRIORITIZE_PATH).status_code == 405
        assert client.get("/readyz").status_code == 503  # readiness is the inventory's, not the extender's
        text = client.get("/metrics").text
    counted = {o: metrics.prioritize_calls.labels(o)._value.get()
               for o in ("scored", "malformed", "too_large", "not_synced")}
    assert counted == {"scored": 3, "malformed": 2, "too_large": 1, "not_synced": 1}
    assert 'gpupack_webhook_scheduler_prioritize_calls_total{outcome="scored"} 3.0' in text


def test_without_the_watch_the_route_is_not_served() -> None:
    app = build_app(InventoryHolder(), WebhookSettings())
    assert PRIORITIZE_PATH not in app.paths
    assert PRIORITIZE_PATH in build_app(InventoryHolder(), WebhookSettings(),
                                        priorities=PriorityWatch(ScriptedLister([], []))).paths


def test_the_watch_lists_unfinished_pods_only() -> None:
    from kubernetes.client import ApiClient

    from sharing.api.gpu_pod_site import UNFINISHED_PODS
    from webhook.priority_watch import api_lister

    lister = api_lister(ApiClient())
    assert getattr(lister, "keywords", None) == {"field_selector": UNFINISHED_PODS}
    assert UNFINISHED_PODS == "status.phase!=Succeeded,status.phase!=Failed"

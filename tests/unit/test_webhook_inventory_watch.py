"""webhook.inventory_watch: informers into the holder; heartbeats publish nothing, bursts publish once per interval."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

from kube.informer import Lister
from sharing.admission.inventory import build_inventory
from tests.unit.test_informer import Answer, ScriptedLister, listing
from webhook.inventory_source import InventoryHolder
from webhook.inventory_watch import KubernetesWatch

A100 = "NVIDIA-A100-SXM4-80GB"


def gpunode(name: str, rv: str, *, percent: int = 0, in_use: int = 0, beat: str = "00:00") -> dict[str, Any]:
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode",
            "metadata": {"name": name, "resourceVersion": rv, "managedFields": [{"manager": "agent"}]},
            "status": {"product": A100, "heartbeatTime": f"2026-12-01T00:{beat}Z",
                       "gpus": [{"index": 0, "uuid": "GPU-0", "product": A100, "memoryMiB": 81920,
                                 "utilization": {"gpuPercent": percent}}],
                       "sharing": {"mode": "mps", "replicas": 4, "inUse": in_use}}}


def node(name: str, rv: str) -> dict[str, Any]:
    # As a list gives it: no kind on the items; a status the webhook drops.
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": {"gpupack.io/backend": "dra"}},
            "status": {"images": [{"names": ["x"] * 20}]}}


def scripted(gpunodes: ScriptedLister, nodes: ScriptedLister | None = None) -> dict[str, Lister]:
    return {"GPUNode": gpunodes, "SharingPolicy": ScriptedLister([listing("1")], []),
            "Namespace": ScriptedLister([listing("1", {"metadata": {"name": "ml", "resourceVersion": "1"}})], []),
            "Node": nodes or ScriptedLister([listing("1")], [])}


def test_synced_after_every_kind_listed_and_heartbeats_publish_nothing() -> None:
    gpunodes = ScriptedLister([listing("10", gpunode("a", "5"), gpunode("b", "6"))], [
        [{"type": "MODIFIED", "object": gpunode("a", "11", percent=80, beat="01:00")}],  # a heartbeat
        [{"type": "MODIFIED", "object": gpunode("a", "12", percent=80, in_use=3)}],  # replicas handed out
    ])
    nodes = ScriptedLister([listing("3", node("b", "2"))], [[{"type": "DELETED", "object": node("b", "4")}]])
    holder = InventoryHolder()
    watch = KubernetesWatch(holder, scripted(gpunodes, nodes))
    assert watch.publish_pending() is None  # nothing listed yet
    watch.informers["GPUNode"].relist()
    first = watch.publish_pending()
    assert first is not None and not first.synced and [n.name for n in first.nodes] == ["a", "b"]
    for kind in ("SharingPolicy", "Namespace", "Node"):
        watch.informers[kind].relist()
    synced = watch.publish_pending()
    assert synced is not None and synced.synced and synced.version > first.version
    assert dict(synced.namespace_labels) == {"ml": {}}
    assert {n.name: n.backend for n in synced.nodes} == {"a": "device-plugin", "b": "dra"}
    memo = holder.memo
    watch.informers["GPUNode"].watch_once()  # the heartbeat
    assert watch.publish_pending() is None and holder.memo is memo and holder.current is synced
    watch.informers["GPUNode"].watch_once()  # a change that matters
    changed = watch.publish_pending()
    assert changed is not None and holder.memo is not memo
    assert [n.shared_in_use for n in changed.nodes] == [3, 0]
    watch.informers["Node"].watch_once()  # b's label changed: it left the selection
    moved = watch.publish_pending()
    assert moved is not None and {n.backend for n in moved.nodes} == {"device-plugin"}
    # What was published equals a build from scratch over what the informers hold.
    everything = [o for i in watch.informers.values() for o in i.items()]
    assert moved == build_inventory(everything, synced=True, version=moved.version)
    # The informer holds a slimmed copy: no managedFields, a Node's labels only.
    assert "managedFields" not in watch.informers["GPUNode"].get("a")["metadata"]  # type: ignore[index]


class Stream(Answer):
    """A watch answer that sends its events and then stays open until closed (as a quiet watch does)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__()
        self.events = events
        self.closed = threading.Event()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for event in self.events:
            yield (json.dumps(event) + "\n").encode()
        self.closed.wait(10)

    def close(self) -> None:
        self.closed.set()


class Burst(ScriptedLister):
    def __init__(self, lists: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        super().__init__(lists, [])
        self.events = events
        self.go = threading.Event()

    def __call__(self, **kw: Any) -> Answer:
        if kw.get("watch"):
            self.go.wait(10)
            events, self.events = self.events, []
            return Stream(events)
        return super().__call__(**kw)


def test_a_burst_of_changes_is_published_once_per_interval_and_the_last_one_wins() -> None:
    events = [{"type": "MODIFIED", "object": gpunode("a", str(100 + i), in_use=i % 4 + 1)} for i in range(200)]
    gpunodes = Burst([listing("10", gpunode("a", "5"))], events)
    holder = InventoryHolder()
    quiet = {kind: Burst([listing("1")], []) for kind in ("SharingPolicy", "Namespace", "Node")}
    for lister in quiet.values():
        lister.go.set()
    watch = KubernetesWatch(holder, {"GPUNode": gpunodes, **quiet}, coalesce_seconds=0.3)
    watch.start()
    try:
        deadline = time.monotonic() + 10
        while not holder.current.synced and time.monotonic() < deadline:
            time.sleep(0.01)
        assert holder.current.synced
        published = watch.published
        started = time.monotonic()
        gpunodes.go.set()
        while holder.current.nodes[0].shared_in_use != 199 % 4 + 1 or watch.events < 201:
            assert time.monotonic() < deadline, "the last change was never published"
            time.sleep(0.01)
        took = time.monotonic() - started
        # 200 changes within a few ms: one snapshot at once, then one per 0.3 s at most.
        assert watch.published - published <= 2 + int(took / 0.3)
        assert watch.parts.reads == 201
    finally:
        watch.stop()


def test_the_settings_reach_the_informers_and_the_publisher() -> None:
    from kubernetes.client import ApiClient

    from webhook.settings import WebhookSettings

    settings = WebhookSettings(resync_seconds=60, inventory_coalesce_seconds=0.5)
    watch = KubernetesWatch.from_api(InventoryHolder(), ApiClient(), settings)
    assert watch.coalesce_seconds == 0.5
    assert sorted(watch.informers) == sorted(KubernetesWatch.KINDS)
    assert all(i._watch_seconds == 60 for i in watch.informers.values())

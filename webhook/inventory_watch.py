"""The webhook's inventory kept by watches on the API server: informers feeding an inventory by parts.

One :class:`kube.informer.Informer` (the project's one list-then-watch
implementation) per kind: ``GPUNode``, ``SharingPolicy``, ``Namespace``
(namespace labels serve SharingPolicy namespace selectors and the pool choice of
``sharing.admission.pool_choice``) and the ``Node`` objects of the DRA node pool
(``gpupack.io/backend=dra``: every other node is in the device plugin's pool, so
only these need to be known). This is the webhook's only module that talks to the
API server, and it only lists and watches.

Cost per event does not grow with the cluster. Each event goes to
:class:`sharing.admission.inventory_parts.InventoryParts`, which reads that one object
and says whether anything an Inventory holds changed. A heartbeat (every agent
rewrites its GPUNode's status about once a minute: ~20 events/s at 1,250 nodes)
changes nothing, so no snapshot is published and the decisions remembered for
the current one (``DecisionMemo``) keep serving. A change that matters marks the
view dirty; a publisher thread swaps in a new snapshot at once if none was
published in the last ``coalesce_seconds``, else at the end of that interval: a
burst of changes costs one snapshot per interval, however many events it holds
(benchmarks/webhook_scale.md).

Synced once each of the four kinds has completed its first list. The informer
tells its listeners what a list changed only after filling its cache, so at a
kind's first list the publisher also takes the informer's whole cache
(:meth:`InventoryParts.reset`, which skips every object already read at its
version) before calling the view synced.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from kube.informer import DELETED, Informer, Lister
from sharing.api.crd import GROUP, VERSION
from sharing.admission.inventory import Inventory
from sharing.admission.inventory_parts import KINDS, InventoryParts
from sharing.api.keys import BACKEND_LABEL
from webhook.inventory_source import InventoryHolder

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from webhook.settings import WebhookSettings

log = logging.getLogger("gpupack.webhook.inventory")

DRA_NODES_SELECTOR = f"{BACKEND_LABEL}=dra"
"""The Nodes the webhook watches. A node whose label changes away from ``dra`` leaves the
selection, and the API server sends a DELETED event for it: it is then in the default pool."""

COALESCE_SECONDS = 0.2
"""Least time between two published snapshots (s). A snapshot costs a pass over the nodes (its
assembly, and the index every decision reads: ``Inventory.prepare``, ~5 ms at 2,500 nodes on
the 2-core VM) and starts a new DecisionMemo. Pods starting at 20/s change ~20 GPUNodes a
second; this bounds the snapshots to 5/s however many changes come, while a change after a
quiet moment is published at once. What it adds to the view's staleness, 0.2 s at worst, is
far below the time a pod takes to reach a node, and the webhook's view is a moment old in
any case (benchmarks/webhook_scale.md)."""

_META_KEPT = {
    "GPUNode": ("name", "resourceVersion", "generation", "labels"),
    "SharingPolicy": ("name", "resourceVersion", "generation"),
    "Namespace": ("name", "resourceVersion", "labels"),
    "Node": ("name", "resourceVersion", "labels"),
}


def kept(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the inventory needs of a watched object, which is what its informer holds.

    ``kind`` set (the items of a list have none); of ``metadata`` only the name, labels,
    ``resourceVersion`` (by which a re-list tells what changed) and ``generation``, never
    ``managedFields`` (often larger than the rest); a GPUNode's and a SharingPolicy's spec and
    status whole; of a Node or Namespace nothing else (a Node's status lists images and
    conditions the webhook would only hold in memory).
    """
    metadata = obj.get("metadata") or {}
    out: dict[str, Any] = {"kind": kind, "metadata": {k: metadata[k] for k in _META_KEPT[kind] if k in metadata}}
    if kind in ("GPUNode", "SharingPolicy"):
        out.update((k, obj[k]) for k in ("spec", "status") if k in obj)
    return out


def api_listers(api: ApiClient) -> dict[str, Lister]:
    """The list calls of the four kinds, selectors bound (what each :class:`Informer` lists and watches)."""
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    return {
        "GPUNode": partial(custom.list_cluster_custom_object, GROUP, VERSION, "gpunodes"),
        "SharingPolicy": partial(custom.list_cluster_custom_object, GROUP, VERSION, "sharingpolicies"),
        "Namespace": core.list_namespace,
        "Node": partial(core.list_node, label_selector=DRA_NODES_SELECTOR),
    }


class KubernetesWatch:
    """Informers of GPUNodes, SharingPolicies, Namespaces and the DRA pool's Nodes, published into a holder.

    Threads (one per informer, one publisher) are daemons: they end with the process.
    Tests drive it without threads: ``informers[kind].relist()`` / ``.watch_once()``, then
    :meth:`publish_pending`.
    """

    KINDS = KINDS

    def __init__(
        self, holder: InventoryHolder, listers: Mapping[str, Lister], *,
        watch_seconds: float = 300.0, coalesce_seconds: float = COALESCE_SECONDS,
    ) -> None:
        self.holder = holder
        self.coalesce_seconds = coalesce_seconds
        self.parts = InventoryParts()
        self.informers = {
            kind: Informer(f"{kind}s", listers[kind], keep=partial(kept, kind), watch_seconds=watch_seconds)
            for kind in self.KINDS
        }
        for kind, informer in self.informers.items():
            informer.listeners.append(partial(self._on_event, kind))
        self._changed = threading.Condition()
        """Guards :attr:`parts`, ``_dirty`` and ``_listed``."""
        self._dirty = False
        self._listed: set[str] = set()
        self._stop = threading.Event()
        self.events = 0
        """Watch events (and list differences) applied."""
        self.published = 0
        """Snapshots published."""

    @classmethod
    def from_api(cls, holder: InventoryHolder, api: ApiClient, settings: WebhookSettings) -> KubernetesWatch:
        return cls(holder, api_listers(api), watch_seconds=settings.resync_seconds,
                   coalesce_seconds=settings.inventory_coalesce_seconds)

    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()
        threading.Thread(target=self._publish_loop, name="inventory-publish", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers.values():
            informer.stop()
        with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ events
    def _on_event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """An informer's listener (on its thread): one object into the parts."""
        with self._changed:
            self.events += 1
            changed = self.parts.delete(obj) if event_type == DELETED else self.parts.put(obj)
            if changed and not self._dirty:
                self._dirty = True
                self._changed.notify_all()

    # ------------------------------------------------------------------ publishing
    def publish_pending(self) -> Inventory | None:
        """Publish a snapshot if anything changed since the last one, or a kind finished its
        first list; the snapshot, or None when there was nothing to publish."""
        with self._changed:
            newly_listed = False
            for kind, informer in self.informers.items():
                if kind not in self._listed and informer.synced:
                    self._dirty = self.parts.reset(kind, informer.items()) or self._dirty
                    self._listed.add(kind)
                    newly_listed = True
            if not (self._dirty or newly_listed):
                return None
            self._dirty = False
            synced = len(self._listed) == len(self.informers)
            self.published += 1
            return self.holder.publish(lambda version: self.parts.snapshot(synced=synced, version=version))

    def _waiting(self) -> bool:
        return self._dirty or any(k not in self._listed and i.synced for k, i in self.informers.items())

    def _publish_loop(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                # Until every kind is listed, look for finished lists now and then (a list of
                # nothing tells no listener); after that, sleep until a change comes.
                poll = None if len(self._listed) == len(self.informers) else 0.05
                self._changed.wait_for(lambda: self._waiting() or self._stop.is_set(), poll)
            if self._stop.is_set():
                return
            try:
                self.publish_pending()
            except Exception:  # noqa: BLE001 - the publisher must outlive any one bad snapshot
                log.exception("publishing the inventory failed; the previous snapshot keeps serving")
            self._stop.wait(self.coalesce_seconds)

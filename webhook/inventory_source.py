"""Where the webhook's inventory view comes from: a file, or a watch on the API server.

Both feed an :class:`InventoryHolder`, whose ``current`` snapshot the request
path reads without a lock (a Python attribute read is atomic, and a snapshot is
never mutated, only replaced). The watch runs in background threads with the
official Kubernetes client; this is the webhook's only module that talks to the
API server, and it only lists and watches ``GPUNode``, ``SharingPolicy`` and
``Namespace`` objects (namespace labels serve SharingPolicy namespace selectors
and the pool choice of ``sharing.pool_choice``), and the ``Node`` objects of
the DRA node pool (``gpupack.io/backend=dra``: every other node is in the
device plugin's pool, so only these need to be known).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kube.backoff import Backoff
from sharing.crd import GROUP, VERSION
from sharing.keys import BACKEND_LABEL
from sharing.decision import DecisionMemo
from sharing.inventory import Inventory, build_inventory

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("gpupack.webhook.inventory")


class InventoryError(ValueError):
    """An inventory file that cannot be read; names the file and the problem."""


class InventoryHolder:
    """The current snapshot plus a counter of versions, swapped atomically."""

    def __init__(self, initial: Inventory | None = None) -> None:
        self.current: Inventory = initial if initial is not None else Inventory(synced=False)
        self.memo = DecisionMemo(self.current)
        """Decisions made against ``current``; a new snapshot starts a new memo."""
        self._version = self.current.version
        self._lock = threading.Lock()
        self.listeners: list[Callable[[Inventory], None]] = []

    def replace(self, objects: Iterable[Mapping[str, Any]], *, synced: bool) -> Inventory:
        with self._lock:
            self._version += 1
            snapshot = build_inventory(objects, synced=synced, version=self._version)
            for reason in sorted(set(snapshot.skipped_policies) - set(self.current.skipped_policies)):
                log.warning("%s; left out (the webhook enforces the other policies)", reason)
            for entry in sorted(set(snapshot.skipped_entries) - set(self.current.skipped_entries)):
                log.warning("GPUNode %s", entry)
            self.current = snapshot
            self.memo = DecisionMemo(snapshot)
        for listener in self.listeners:
            listener(snapshot)
        return snapshot


def load_objects(path: str | Path) -> list[Mapping[str, Any]]:
    """Objects of an inventory file: a YAML/JSON list, a ``List`` with ``items``,
    or a multi-document YAML stream of objects."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"cannot read inventory file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(f"inventory file {str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        if file.suffix == ".json":
            docs: list[Any] = [json.loads(text)]
        else:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (ValueError, yaml.YAMLError) as exc:
        raise InventoryError(f"inventory file {str(path)!r} is not valid YAML/JSON: {exc}") from None
    objects: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            objects.extend(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
            objects.extend(doc["items"])
        elif isinstance(doc, dict):
            objects.append(doc)
        else:
            raise InventoryError(f"inventory file {str(path)!r}: expected a list of GPUNode objects")
    bad = [i for i, o in enumerate(objects) if not isinstance(o, dict)]
    if bad:
        raise InventoryError(f"inventory file {str(path)!r}: item {bad[0]} is not an object")
    known = {"GPUNode", "SharingPolicy", "Namespace", "Node"}
    for i, obj in enumerate(objects):
        kind = obj.get("kind", "GPUNode")
        if kind not in known:
            raise InventoryError(
                f"inventory file {str(path)!r}: item {i} has kind {kind!r}; valid kinds: {', '.join(sorted(known))}"
            )
    return objects


def load_file(holder: InventoryHolder, path: str | Path) -> Inventory:
    """Fill ``holder`` from an inventory file (synced at once: the file is the truth)."""
    return holder.replace(load_objects(path), synced=True)


class FileWatch:
    """Reload an inventory file when it changes (polling its inode, size and mtime).

    A file that turns unreadable or invalid is logged and ignored: the last good
    view keeps serving, as a watch keeps its last state when the API is away.
    """

    def __init__(self, holder: InventoryHolder, path: str | Path, every: float = 2.0) -> None:
        self.holder, self.path, self.every = holder, Path(path), every
        self._stamp = self._stat()
        self._stop = threading.Event()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def check(self) -> bool:
        """Reload if the file changed; True when a new view was published."""
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            objects = load_objects(self.path)
        except InventoryError as exc:
            log.warning("%s; keeping the previous inventory", exc)
            return False
        self._stamp = stamp
        self.holder.replace(objects, synced=True)
        log.info("reloaded inventory from %s", self.path)
        return True

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.every):
                try:
                    self.check()
                except Exception:  # noqa: BLE001 - the watcher must outlive any one bad file
                    log.exception("inventory reload from %s failed; keeping the previous inventory", self.path)

        threading.Thread(target=loop, name="inventory-file", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


DRA_NODES_SELECTOR = f"{BACKEND_LABEL}=dra"
"""The Nodes the webhook watches. A node whose label changes away from ``dra`` leaves the
selection, and the API server sends a DELETED event for it: it is then in the default pool."""


def _kept(kind: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the inventory needs of a watched object: all of it, except a Node's (its labels only;
    a Node's status lists images and conditions the webhook would only hold in memory)."""
    if kind != "Node":
        return {**obj, "kind": kind}
    metadata = obj.get("metadata") or {}
    return {"kind": kind, "metadata": {"name": metadata.get("name"), "labels": metadata.get("labels") or {}}}


class KubernetesWatch:
    """List-then-watch of GPUNodes, SharingPolicies, Namespaces and the DRA pool's Nodes into a holder.

    Synced once each of the four lists has completed; a watch that fails or
    expires re-lists (after a short back-off), so the view converges to what the
    API server holds. Threads are daemons: they end with the process.
    """

    KINDS = ("GPUNode", "SharingPolicy", "Namespace", "Node")

    def __init__(self, holder: InventoryHolder, api: ApiClient, *, resync_seconds: float = 300.0):
        self.holder = holder
        self.resync_seconds = resync_seconds
        self.api = api
        self._objects: dict[str, dict[str, Mapping[str, Any]]] = {k: {} for k in self.KINDS}
        self._listed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        from kubernetes import client

        api = self.api
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        listers: dict[str, Callable[..., Any]] = {
            "GPUNode": lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, "gpunodes", **kw),
            "SharingPolicy": lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, "sharingpolicies", **kw),
            # Typed client: raw (streaming) response while watching, plain dicts when listing.
            "Namespace": lambda **kw: (
                core.list_namespace(**kw)
                if kw.get("watch")
                else api.sanitize_for_serialization(core.list_namespace(**kw))  # type: ignore[no-untyped-call]
            ),
            "Node": lambda **kw: (
                core.list_node(label_selector=DRA_NODES_SELECTOR, **kw)
                if kw.get("watch")
                else api.sanitize_for_serialization(  # type: ignore[no-untyped-call]
                    core.list_node(label_selector=DRA_NODES_SELECTOR, **kw))
            ),
        }
        for kind, lister in listers.items():
            thread = threading.Thread(target=self._run, args=(kind, lister), name=f"watch-{kind}", daemon=True)
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _publish(self) -> None:
        with self._lock:
            objects = [o for kind in self.KINDS for o in self._objects[kind].values()]
            synced = len(self._listed) == len(self.KINDS)
        self.holder.replace(objects, synced=synced)

    def _run(self, kind: str, lister: Callable[..., Any]) -> None:
        from kubernetes import watch

        backoff = Backoff(base_s=1.0, max_s=30.0)
        while not self._stop.is_set():
            try:
                listed = lister()
                if backoff.succeeded():
                    log.info("watch of %s works again", kind)
                items: dict[str, Mapping[str, Any]] = {
                    o["metadata"]["name"]: _kept(kind, o) for o in listed.get("items") or []
                }
                with self._lock:
                    self._objects[kind] = items
                    self._listed.add(kind)
                self._publish()
                version = listed.get("metadata", {}).get("resourceVersion")
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    lister, resource_version=version, timeout_seconds=int(self.resync_seconds)
                )
                for event in stream:
                    obj = event["object"]
                    if not isinstance(obj, dict):
                        continue
                    name = obj.get("metadata", {}).get("name")
                    if event["type"] == "ERROR" or not name:
                        break
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._objects[kind].pop(name, None)
                        else:
                            self._objects[kind][name] = _kept(kind, obj)
                    self._publish()
            except Exception as exc:  # noqa: BLE001 - keep watching whatever the API server does
                pause, news = backoff.failed(f"{type(exc).__name__}: {exc}")
                if news:  # once per change of state, not once per attempt
                    log.warning("watch of %s failed (%s); re-listing with back-off (next in %.1fs)", kind, exc, pause)
                self._stop.wait(pause)
            else:
                time.sleep(0)  # expired watch: re-list at once

"""Where the webhook's inventory view comes from: a file here, or watches (``webhook.inventory_watch``).

Both feed an :class:`InventoryHolder`, whose ``current`` snapshot the request
path reads without a lock (a Python attribute read is atomic, and a snapshot is
never mutated, only replaced). A file is read whole (``build_inventory``) when
it changes; the watches apply one object at a time and publish a snapshot only
when something the inventory holds changed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kube.inputfile import read_text
from sharing.admission.decision import DecisionMemo
from sharing.admission.inventory import Inventory, build_inventory

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
        """Publish the snapshot of ``objects`` (all of them: ``build_inventory``)."""
        return self.publish(lambda version: build_inventory(objects, synced=synced, version=version))

    def publish(self, make: Callable[[int], Inventory]) -> Inventory:
        """Publish ``make(version)``, the next version's snapshot: swapped in with a new memo, new
        skipped objects logged, listeners told (on the caller's thread)."""
        with self._lock:
            self._version += 1
            # What every decision reads of a snapshot is worked out here, not by the first request.
            snapshot = make(self._version).prepare()
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
        # Bounded in size, file type and nesting depth: a FIFO, /dev/zero or a document nested
        # 100,000 deep is one InventoryError, reported and skipped like any bad file.
        text = read_text(file, syntax="json" if file.suffix == ".json" else "yaml")
    except OSError as exc:
        raise InventoryError(f"cannot read inventory file {str(path)!r}: {exc.strerror or exc}") from None
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

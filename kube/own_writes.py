"""Read your own writes over an informer: the objects a component wrote that its cache may not show yet.

A component that reads from an :class:`kube.informer.Informer` and writes to
the API server sees its own write only when the watch event comes back, a few
milliseconds to seconds later. A cycle that runs in between must not act on the
old object (plan a switch twice, patch a label again). :class:`WrittenObjects`
keeps each write's answer and hands it out instead of the cached object while
the cache still shows a version the object had *before* the write.

Versions are compared as the API defines them, opaque strings: the overlay
records which versions are older than its copy (the one the cache showed when
the write was made, and those of earlier writes), so it never has to order
two versions. A copy is dropped when the cache shows any other version (it has
caught up, or someone else wrote since), when the object is deleted, or after
``ttl_s`` whatever the cache shows (a watch event that never comes is repaired
by the informer's next list long before).

One component writes one object from one thread at a time (the controller's
cycle, one node's agent), so answers arrive in the order of the writes; the
overlay does not reorder them.

Used by the controller's caches (``controller.watch_caches.CachedKube``) and the
agent fleet's (``gpupack.fleet.kube.SharedKube``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from kube.informer import DELETED, Informer, object_key

ABSENT: Final = "<absent>"
"""The version of an object the cache does not hold (a write that created it)."""


def version_of(obj: Mapping[str, Any] | None) -> str:
    """An object's ``metadata.resourceVersion``; :data:`ABSENT` for no object, "" when it has none."""
    if obj is None:
        return ABSENT
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


@dataclass(frozen=True)
class _Copy:
    obj: dict[str, Any]
    older: frozenset[str]
    """Versions the object had before this copy: while the cache shows one of them, it lags behind."""
    at: float


class WrittenObjects:
    """Per key, the answer of the newest write, kept until the informer shows it (or something newer).

    ``kind`` names the informer in logs and keys; several kinds may share one instance
    (the controller's pods and GPUNodes), each read against its own informer.
    """

    def __init__(self, ttl_s: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._copies: dict[tuple[str, str], _Copy] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._copies)

    def wrote(self, kind: str, seen: Mapping[str, Any] | None, answer: Mapping[str, Any] | None,
              key: str | None = None) -> None:
        """Record that the object the cache showed as ``seen`` (None: it held none) became ``answer``
        by our write. ``key`` defaults to the answer's own. An answer without a version is not kept."""
        if answer is None or version_of(answer) in ("", ABSENT):
            return
        key = key if key is not None else object_key(answer)
        with self._lock:
            before = self._copies.get((kind, key))
            older = {version_of(seen)}
            if before is not None:
                older |= before.older | {version_of(before.obj)}
            if seen is not None and not _same_uid(seen, answer):
                # A new object under the name of one the cache still shows (we deleted that one):
                # the cache lags behind while it shows the old one and while it shows none.
                older.add(ABSENT)
            older.discard("")
            older.discard(version_of(answer))
            self._copies[(kind, key)] = _Copy(dict(answer), frozenset(older), self.clock())

    def newest(self, kind: str, key: str, cached: dict[str, Any] | None) -> dict[str, Any] | None:
        """Our written copy of ``key`` while ``cached`` (the cache's object, or None) lags behind it,
        else ``cached``; a copy the cache has passed is forgotten."""
        with self._lock:
            copy = self._copies.get((kind, key))
            if copy is None:
                return cached
            if version_of(cached) in copy.older and self.clock() - copy.at < self.ttl_s:
                return copy.obj
            del self._copies[(kind, key)]
        return cached

    def overlay(self, kind: str, informer: Informer, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``items`` (the informer's objects) with our copies where the informer lags behind them,
        and the objects we created that it does not hold yet."""
        with self._lock:
            keys = [key for (k, key) in self._copies if k == kind]
        if not keys:
            return items
        newer: dict[str, dict[str, Any]] = {}
        for key in keys:
            cached = informer.get(key)
            shown = self.newest(kind, key, cached)
            if shown is not cached and shown is not None:
                newer[key] = shown
        if not newer:
            return items
        listed = [newer.pop(object_key(o), o) for o in items]
        return listed + list(newer.values())  # what is left: created by us, not listed yet

    def forget(self, kind: str, key: str) -> None:
        """Drop our copy of ``key`` (we deleted the object: a copy would bring it back)."""
        with self._lock:
            self._copies.pop((kind, key), None)

    def follow(self, kind: str, informer: Informer) -> None:
        """Forget copies of ``kind`` as ``informer``'s events pass them (:meth:`observe`)."""
        informer.listeners.append(partial(self.observe, kind))

    def observe(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """An informer listener: forget the copy of ``obj`` once the watch shows a version that is
        not older than it, or its deletion. Without it a copy is dropped only when read past, and
        a created object read after its deletion (the cache holds none, as before the create) would
        come back until ``ttl_s``."""
        key = (kind, object_key(obj))
        with self._lock:
            copy = self._copies.get(key)
            if copy is None:
                return
            if event == DELETED and not _same_uid(copy.obj, obj):
                return  # an earlier object of that name went (deleted, then created again by us)
            if event == DELETED or version_of(obj) not in copy.older:
                del self._copies[key]


def _same_uid(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Both are the same object (or either's UID is unknown)."""
    uid_a = str((a.get("metadata") or {}).get("uid") or "")
    uid_b = str((b.get("metadata") or {}).get("uid") or "")
    return not uid_a or not uid_b or uid_a == uid_b


__all__ = ["ABSENT", "WrittenObjects", "version_of"]

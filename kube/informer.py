"""List-then-watch caches of API objects: what a component reads instead of listing every cycle.

An :class:`Informer` keeps every object of one kind (and one selector) that the
API server holds, as the raw JSON dicts the server sent, up to date from a
watch. A component that read a whole kind every few seconds (the controller's
pods and GPUNodes, a node agent's own Node) reads the cache instead, so the API
server's load grows with what changes, not with the size of the cluster.

How it converges:

1. **list** (read raw: no client model classes at thousands of objects), in
   pages of :data:`PAGE_SIZE` objects (``limit`` and ``continue``, as client-go's
   pager does), so neither the API server nor this process builds one answer of
   every pod of a large cluster; the pages form one consistent list (the first
   page's snapshot), replacing the cache; what the list shows changed since the cache's
   previous contents is told to the listeners as ``ADDED``/``MODIFIED``/``DELETED``;
2. **watch** from the list's ``resourceVersion``, with bookmarks, applying each
   event; a watch that ends after its ``timeout_seconds`` resumes from the last
   version seen, without a list;
3. a watch answered ``410 Gone`` (the version expired) or any failure lists again,
   after a back-off while failures repeat (logged once per change of state).

A bad object costs the cache that object, never the watch of its kind: answers are
decoded by :func:`kube.safejson.loads` (any nesting the API server stores), and an
object nested deeper than :data:`kube.safejson.MAX_DEPTH`, or one the ``keep``
function fails on, is left out of the cache (told to listeners as ``DELETED`` if it
was there), named in :attr:`Informer.rejected` and logged once per version.

Objects are never mutated once stored, only replaced: readers get them without
copying. :attr:`Informer.version` counts changes, so a reader can wait for the
next one (:meth:`Informer.wait_changed`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kube import safejson
from kube.backoff import Backoff

log = logging.getLogger("gpupack.informer")

Lister = Callable[..., Any]
"""A list call of the Kubernetes client with the group, version, kind and selectors bound, taking the
client's keyword arguments (``watch``, ``resource_version``, ``timeout_seconds``, ``_preload_content`` ...)."""
Listener = Callable[[str, Mapping[str, Any]], None]
"""Called with the event type (``ADDED``, ``MODIFIED``, ``DELETED``) and the object, on the informer's thread."""

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

PAGE_SIZE = 500
"""Objects per list request (client-go's pager default). A continue token that expired between
pages fails the list, which is listed again from the start after the usual back-off."""


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if namespace else name


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _lines(response: Any) -> Iterator[str]:
    """The lines of a streamed (``_preload_content=False``) watch answer, one JSON event each."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line.decode("utf-8")
    if pending.strip():
        yield pending.decode("utf-8")


class WatchExpired(Exception):
    """The API server no longer has the version the watch asked for (410): list again."""


class Informer:
    """A cache of one kind of object, kept by a list and a watch on a background thread."""

    def __init__(
        self, name: str, lister: Lister, *, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        watch_seconds: float = 300.0, max_backoff_s: float = 30.0, page_size: int = PAGE_SIZE,
    ) -> None:
        self.name = name
        """What the cache holds, for logs (``pods``, ``gpunodes``)."""
        self._lister = lister
        self._keep = keep or (lambda obj: obj)
        self._watch_seconds = watch_seconds
        self._page_size = page_size
        self._backoff = Backoff(base_s=min(1.0, max_backoff_s), max_s=max_backoff_s)
        self._objects: dict[str, dict[str, Any]] = {}
        self._resource_version = ""
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self.version = 0
        """Changes applied so far (a list that changed nothing adds none)."""
        self.lists = 0
        """Lists made (the first one, and one after each expired or failed watch)."""
        self.list_requests = 0
        """List requests made: a list of more than one page makes several."""
        self.listeners: list[Listener] = []
        self.rejected: dict[str, str] = {}
        """Objects left out of the cache (key: why), such as one nested deeper than any reader survives."""
        self._rejected_logged: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ reading
    @property
    def synced(self) -> bool:
        """The first list has completed: the cache holds what the API server held then."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    def items(self) -> list[dict[str, Any]]:
        """Every object, in no particular order (a new list; the objects are shared, never mutated)."""
        with self._changed:
            return list(self._objects.values())

    def get(self, key: str) -> dict[str, Any] | None:
        """The object with ``key`` (:func:`object_key`), or None."""
        with self._changed:
            return self._objects.get(key)

    def __len__(self) -> int:
        with self._changed:
            return len(self._objects)

    def wait_changed(self, since: int, timeout_s: float) -> int:
        """Block until :attr:`version` passes ``since`` or ``timeout_s`` passes; the version then."""
        with self._changed:
            self._changed.wait_for(lambda: self.version != since or self._stop.is_set(), timeout_s)
            return self.version

    # ------------------------------------------------------------------ running
    def start(self) -> Informer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # End a watch blocked reading a quiet stream. ``shutdown`` (urllib3 2.3+) shuts the socket
            # down, which wakes the reading thread; ``close`` from this thread would wait on the lock
            # the blocked read holds (TLS), so it is left to the reader.
            shutdown = getattr(response, "shutdown", None)
            try:
                if shutdown is not None:
                    shutdown()
                else:
                    response.close()
            except Exception:  # noqa: BLE001 - best effort; the thread is a daemon anyway
                pass
        with self._changed:
            self._changed.notify_all()

    def _run(self) -> None:
        listed = False
        while not self._stop.is_set():
            try:
                if not listed:
                    self.relist()
                    listed = True
                self.watch_once()
            except WatchExpired:
                listed = False
            except Exception as exc:  # noqa: BLE001 - keep the cache alive whatever the API server does
                if self._stop.is_set():
                    break
                listed = False
                pause, news = self._backoff.failed(f"{type(exc).__name__}: {exc}")
                if news:
                    log.warning("watch of %s failed (%s); listing again with back-off (next in %.1fs)",
                                self.name, exc, pause)
                self._stop.wait(pause)
            else:
                if self._backoff.succeeded():
                    log.info("watch of %s works again", self.name)

    def relist(self) -> None:
        """One list, in pages, replacing the cache (what changed is told to the listeners)."""
        fresh: dict[str, dict[str, Any]] = {}
        token, version = "", ""
        while True:
            paging: dict[str, Any] = {"limit": self._page_size} if self._page_size > 0 else {}
            if token:
                paging["_continue"] = token
            response = self._lister(_preload_content=False, **paging)
            self.list_requests += 1
            data, cuts = safejson.loads(response.data or b"{}")
            if not isinstance(data, dict):
                raise RuntimeError(f"list of {self.name}: the API server answered {type(data).__name__}, not an object")
            for raw in data.get("items") or []:
                if isinstance(raw, dict):
                    obj = self._accepted(raw, cuts)
                    if obj is not None:
                        fresh[object_key(obj)] = obj
            meta = data.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token, previous = str(meta.get("continue") or ""), token
            if not token:
                break
            if token == previous:
                raise RuntimeError(f"list of {self.name}: the API server answered the same continue token twice")
        events: list[tuple[str, dict[str, Any]]] = []
        with self._changed:
            for key, obj in fresh.items():
                old = self._objects.get(key)
                if old is None:
                    events.append((ADDED, obj))
                elif _resource_version(old) != _resource_version(obj):
                    events.append((MODIFIED, obj))
            events.extend((DELETED, old) for key, old in self._objects.items() if key not in fresh)
            self._objects = fresh
            self._resource_version = version
            self.lists += 1
            if events:
                self.version += 1
            self._changed.notify_all()
        self._synced.set()
        self._tell(events)

    def watch_once(self) -> None:
        """Follow one watch request from the last version seen until it ends (or the informer stops)."""
        response = self._lister(
            watch=True, resource_version=self._resource_version, allow_watch_bookmarks=True,
            timeout_seconds=max(1, int(self._watch_seconds)), _request_timeout=self._watch_seconds + 30,
            _preload_content=False)
        self._response = response
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    return
                event, cuts = safejson.loads(line)
                if isinstance(event, dict):
                    self.apply(event, cuts)
        finally:
            self._response = None
            response.release_conn()

    def apply(self, event: Mapping[str, Any], cuts: int = 0) -> None:
        """One watch event into the cache (``cuts``: subtrees the decoder pruned from it)."""
        kind, raw = event.get("type"), event.get("object")
        if not isinstance(raw, dict):
            return
        if kind == "ERROR":
            if raw.get("code") == 410:
                raise WatchExpired(str(raw.get("message") or "resource version expired"))
            raise RuntimeError(f"watch error: {raw.get('message') or raw}")
        version = _resource_version(raw)
        if kind == "BOOKMARK":
            with self._changed:
                self._resource_version = version or self._resource_version
            return
        if kind not in (ADDED, MODIFIED, DELETED):
            return
        obj = self._accepted(raw, cuts if kind != DELETED else 0)
        if obj is None:  # rejected: whatever the cache held under this key is gone
            key = object_key(raw)
            with self._changed:
                old = self._objects.pop(key, None)
                self._resource_version = version or self._resource_version
                if old is not None:
                    self.version += 1
                    self._changed.notify_all()
            if old is not None:
                self._tell([(DELETED, old)])
            return
        key = object_key(obj)
        with self._changed:
            if kind == DELETED:
                self._objects.pop(key, None)
            else:
                self._objects[key] = obj
            self._resource_version = version or self._resource_version
            self.version += 1
            self._changed.notify_all()
        self._tell([(str(kind), obj)])

    def _accepted(self, raw: dict[str, Any], cuts: int) -> dict[str, Any] | None:
        """What the cache keeps of one object, or None when it is rejected (named in :attr:`rejected`)."""
        key = object_key(raw)
        why = ""
        if cuts and safejson.holds_pruned(raw):
            why = f"nested deeper than {safejson.MAX_DEPTH} levels"
        else:
            try:
                obj = self._keep(raw)
            except Exception as exc:  # noqa: BLE001 - one object's shape must not stop the watch
                why = f"unreadable: {type(exc).__name__}: {str(exc)[:200]}"
        if not why:
            self.rejected.pop(key, None)
            return obj
        self.rejected[key] = why
        version = _resource_version(raw)
        if (key, version) not in self._rejected_logged:
            if len(self._rejected_logged) > 10_000:  # bounded: a flood of bad versions only logs again
                self._rejected_logged.clear()
            self._rejected_logged.add((key, version))
            log.warning("%s %s (resourceVersion %s) left out of the cache: %s", self.name, key, version or "?", why)
        return None

    def _tell(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        for kind, obj in events:
            for listener in self.listeners:
                try:
                    listener(kind, obj)
                except Exception:  # noqa: BLE001 - one listener's bug must not stop the cache
                    log.exception("listener of %s failed on %s %s", self.name, kind, object_key(obj))


def wait_all_synced(informers: Mapping[str, Informer] | list[Informer], timeout_s: float) -> list[str]:
    """Wait for every informer's first list; the names of those not synced in time."""
    import time

    deadline = time.monotonic() + timeout_s
    values = list(informers.values()) if isinstance(informers, Mapping) else list(informers)
    for informer in values:
        informer.wait_synced(max(0.0, deadline - time.monotonic()))
    return [i.name for i in values if not i.synced]

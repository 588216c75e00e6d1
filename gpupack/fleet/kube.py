"""SIMULATION: the node agent's API calls for a fleet of agents in one process (``gpupack agent fleet``).

A node agent run alone (``node.base.kube.Kube``) reads its Node, its GPUNode, the pods
on its node and every SharingPolicy on each tick: five requests every few seconds,
about 1,000 a second at 1,250 nodes. :class:`SharedKube` is the same client with
its reads answered from shared watch caches (:class:`FleetCaches`, each a
``kube.informer.Informer``: one list and one watch per kind, whatever the number
of nodes), so the API server's load grows with what changes, not with the number
of nodes. Writes go to the API server as before, through one connection pool.

Reads and writes:

- **reads** (:meth:`SharedKube.get_node`, ``get_gpunode``, ``list_node_pods``,
  ``list_sharing_policies``, ``get_configmap`` of the ConfigMaps named when the
  caches are made) come from the caches; pods are indexed by ``spec.nodeName`` by
  an informer listener, so a read costs no scan;
- **read your writes**: the caches lag the agent's own writes by a watch event. The
  object a write returns is kept as an overlay until the cache shows any version but
  the ones before the write (``kube.own_writes.WrittenObjects``, which the controller
  uses too): an
  agent that just created its GPUNode, or wrote a reshape's journal into its status,
  reads it back at once, as it would from the API server;
- **wake-ups**: :attr:`SharedKube.wake` is told the node whose objects changed in a
  way its agent acts on (its GPUNode's spec, labels or annotations; its Node's labels,
  spec, capacity or allocatable; a pod on it), or None when a SharingPolicy changed
  (every node). The echo of an agent's own write wakes nobody: it matches what the
  write returned. :meth:`SharedKube.wait_gpunode_change` waits on the cache and
  never opens a watch of its own.

Every request the fleet makes is counted (:class:`ApiCounts`, by node, verb and
resource) by the one ``ApiClient`` all of them share (:func:`counting_api_client`).
ResourceSlices (``--backend dra`` nodes) are still read from the API server, once
every ``dra_resync_seconds`` per node.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; exercised only where it is missing
    _orjson = None  # type: ignore[assignment]

from kube import safejson
from kube.client import MERGE_PATCH, api_client, call
from kube.errors import KubeError
from kube.informer import DELETED, Informer, object_key
from kube.own_writes import WrittenObjects
from node.base.kube import PLURAL, Kube
from sharing.api.crd import GROUP, VERSION

FLEET = ""
"""The node requests made outside any agent's step are counted under (the caches' lists and watches)."""
WRITE_VERBS = ("create", "update", "patch", "delete")
READ_VERBS = ("get", "list")
Kind = tuple[str, str]
"""``(verb, resource)`` of one request: ``("patch", "gpunodes/status")``, ``("watch", "pods")``."""


def request_kind(method: str, url: str) -> Kind:
    """The verb (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``) and the
    resource (``nodes``, ``gpunodes/status``, ``events``) of one request to the API server."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if path[:1] == ["api"]:
        rest = path[2:]
    elif path[:1] == ["apis"]:
        rest = path[3:]
    else:
        return method.lower(), parts.path
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] if rest else ""
    if len(rest) >= 3:
        resource += "/" + rest[2]
    verb = method.upper()
    if verb == "GET":
        if parse_qs(parts.query).get("watch", [""])[0] in ("true", "1"):
            return "watch", resource
        return ("get" if len(rest) >= 2 else "list"), resource
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(verb, verb.lower()), resource


class ApiCounts:
    """Requests to the API server by node (the agent's step that made it, :meth:`acting_for`), verb and
    resource. Thread-safe; the fleet's worker threads each act for one node at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._counts: dict[str, Counter[Kind]] = {}

    @contextmanager
    def acting_for(self, node: str) -> Iterator[None]:
        """Count the requests this thread makes meanwhile as ``node``'s."""
        previous = getattr(self._local, "node", FLEET)
        self._local.node = node
        try:
            yield
        finally:
            self._local.node = previous

    def record(self, kind: Kind) -> None:
        node = getattr(self._local, "node", FLEET)
        with self._lock:
            self._counts.setdefault(node, Counter())[kind] += 1

    def by_node(self) -> dict[str, Counter[Kind]]:
        """A copy: node -> (verb, resource) -> requests (the fleet's own under :data:`FLEET`)."""
        with self._lock:
            return {node: Counter(counts) for node, counts in self._counts.items()}

    def total(self) -> Counter[Kind]:
        out: Counter[Kind] = Counter()
        for counts in self.by_node().values():
            out.update(counts)
        return out


def writes(counts: Mapping[Kind, int]) -> int:
    return sum(n for (verb, _), n in counts.items() if verb in WRITE_VERBS)


def reads(counts: Mapping[Kind, int]) -> int:
    """Gets and lists (not watches)."""
    return sum(n for (verb, _), n in counts.items() if verb in READ_VERBS)


class CountingApiClient(client.ApiClient):
    """An ``ApiClient`` that counts each request it sends (:class:`ApiCounts`)."""

    def __init__(self, configuration: client.Configuration, counts: ApiCounts) -> None:
        super().__init__(configuration)
        self.counts = counts

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        self.counts.record(request_kind(method, url))
        return super().call_api(method, url, *args, **kwargs)


def counting_api_client(kubeconfig: str | None, counts: ApiCounts, connections: int) -> CountingApiClient:
    """One client for the whole fleet (credentials as :func:`kube.client.api_client` finds them), with
    ``connections`` pooled connections: one per worker and per watch, so none waits for another's."""
    loaded = api_client(kubeconfig)
    configuration = loaded.configuration
    loaded.close()  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = connections
    return CountingApiClient(configuration, counts)


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a JSON object: through orjson when installed (about 20 times faster than
    ``copy.deepcopy`` on a GPUNode, which was a third of an agent's step), else ``copy.deepcopy``."""
    if _orjson is None:
        return copy.deepcopy(obj)
    copied: dict[str, Any] = _orjson.loads(_orjson.dumps(obj))
    return copied


def _json(response: Any) -> dict[str, Any]:
    """The body of a raw (``_preload_content=False``) answer: the object as the API server sent it."""
    data, _ = safejson.loads(response.data or b"{}")  # any depth: a too-deep subtree reads as a marker
    return data if isinstance(data, dict) else {}


def _trim(obj: dict[str, Any]) -> dict[str, Any]:
    """What the caches keep: the object without ``managedFields`` (nothing the agent reads)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


class FleetCaches:
    """The watch caches every agent of the fleet reads: Nodes (those ``node_selector`` selects), GPUNodes,
    bound pods, SharingPolicies, and named ConfigMaps (the XID table)."""

    def __init__(self, nodes: Informer, gpunodes: Informer, pods: Informer, policies: Informer,
                 configmaps: Mapping[tuple[str, str], Informer] | None = None) -> None:
        self.nodes, self.gpunodes, self.pods, self.policies = nodes, gpunodes, pods, policies
        self.configmaps = dict(configmaps or {})

    @classmethod
    def connect(cls, api: client.ApiClient, *, node_selector: str = "",
                configmaps: Iterable[tuple[str, str]] = ()) -> FleetCaches:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        return cls(
            Informer("nodes", partial(core.list_node, label_selector=node_selector), keep=_trim),
            Informer("gpunodes", partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL), keep=_trim),
            # Bound pods only: what the agents read (pending pods are the controller's and the scheduler's).
            Informer("pods", partial(core.list_pod_for_all_namespaces, field_selector="spec.nodeName!="), keep=_trim),
            Informer("sharingpolicies", partial(custom.list_cluster_custom_object, GROUP, VERSION, "sharingpolicies"),
                     keep=_trim),
            {(ns, name): Informer(f"configmap {ns}/{name}", partial(
                core.list_namespaced_config_map, ns, field_selector=f"metadata.name={name}"), keep=_trim)
             for ns, name in configmaps},
        )

    def all(self) -> list[Informer]:
        return [self.nodes, self.gpunodes, self.pods, self.policies, *self.configmaps.values()]

    def start(self) -> None:
        for informer in self.all():
            informer.start()

    def stop(self) -> None:
        """Stop every cache without waiting. ``Informer.stop`` closes the watch's answer, which blocks while
        its thread reads the TLS socket (until the next event or the watch's timeout): each is told on a
        thread of its own, so a fleet stopping on SIGTERM does not wait for a quiet watch."""
        for informer in self.all():
            threading.Thread(target=informer.stop, name=f"stop-{informer.name}", daemon=True).start()

    def lists(self) -> int:
        """Lists made by all the caches (the first ones, and one after each expired or failed watch)."""
        return sum(i.lists for i in self.all())


def _rv(obj: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as an integer (etcd's revision); -1 if it has none or it is not a number."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or -1)
    except (TypeError, ValueError):
        return -1


def _gpunode_trigger(obj: Mapping[str, Any]) -> object:
    """What of a GPUNode its agent acts on: not its status (which the agent writes itself)."""
    meta = obj.get("metadata") or {}
    return (meta.get("generation"), meta.get("labels"), meta.get("annotations"), obj.get("spec"),
            meta.get("deletionTimestamp"))


def _node_trigger(obj: Mapping[str, Any]) -> object:
    """What of a Node its agent acts on: labels (policies, device-plugin handshake), taints, advertised resources."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    return (meta.get("labels"), meta.get("annotations"), obj.get("spec"), status.get("capacity"),
            status.get("allocatable"))


class SharedKube(Kube):
    """``node.base.kube.Kube`` for many agents at once: reads from :class:`FleetCaches`, writes to the API server."""

    def __init__(self, api: client.ApiClient, caches: FleetCaches) -> None:
        super().__init__(api)
        self.caches = caches
        self.wake: Callable[[str | None], None] = lambda _node: None
        """Told the node whose agent should tick because something it reads changed (None: every node)."""
        self._lock = threading.Condition()
        self.written = WrittenObjects()
        """Per ``nodes`` or ``gpunodes`` and name, the object the newest write returned, until the cache has it."""
        self._seen: dict[tuple[str, str], object] = {}
        """(kind, name) -> the parts of the object an agent acts on, as last seen or written."""
        self._pods: dict[str, dict[str, dict[str, Any]]] = {}
        self._pod_node: dict[str, str] = {}
        caches.nodes.listeners.append(partial(self._changed, "nodes", _node_trigger))
        caches.gpunodes.listeners.append(partial(self._changed, "gpunodes", _gpunode_trigger))
        caches.pods.listeners.append(self._pod_changed)
        caches.policies.listeners.append(lambda _kind, _obj: self.wake(None))

    # ------------------------------------------------------------------ caches
    def _changed(self, kind: str, trigger: Callable[[Mapping[str, Any]], object], event: str,
                 obj: Mapping[str, Any]) -> None:
        key = (kind, object_key(obj))
        self.written.observe(kind, event, obj)  # before the wake-up below, so the agent reads the cache's copy
        with self._lock:
            if event == DELETED:
                self._seen.pop(key, None)
                news = True
            else:
                seen = trigger(obj)
                news = key not in self._seen or self._seen[key] != seen
                self._seen[key] = seen
            self._lock.notify_all()
        if news:
            self.wake(key[1])

    def _pod_changed(self, event: str, pod: Mapping[str, Any]) -> None:
        key = object_key(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        with self._lock:
            old = self._pod_node.pop(key, None)
            if old is not None:
                self._pods.get(old, {}).pop(key, None)
                if not self._pods.get(old):
                    self._pods.pop(old, None)
            if event != DELETED and node:
                self._pods.setdefault(node, {})[key] = dict(pod)  # a Mapping to the listener; stored as sent
                self._pod_node[key] = node
        for name in {old, node} - {None, ""}:
            self.wake(name)

    def _newest(self, kind: str, informer: Informer, name: str) -> dict[str, Any] | None:
        newest = self.written.newest(kind, name, informer.get(name))
        return _copy(newest) if newest is not None else None  # the agent's to change; the cache's never

    def _wrote(self, kind: str, obj: dict[str, Any], trigger: Callable[[Mapping[str, Any]], object]) -> None:
        name = object_key(obj)
        informer = self.caches.nodes if kind == "nodes" else self.caches.gpunodes
        self.written.wrote(kind, informer.get(name), obj)
        with self._lock:
            self._seen[(kind, name)] = trigger(obj)  # its echo from the watch is no news

    # ------------------------------------------------------------------ reads
    def get_node(self, name: str) -> dict[str, Any]:
        node = self._newest("nodes", self.caches.nodes, name)
        if node is None:
            raise KubeError(404, f'nodes "{name}" not found (fleet cache)')
        return node

    def get_gpunode(self, name: str) -> dict[str, Any] | None:
        return self._newest("gpunodes", self.caches.gpunodes, name)

    def list_node_pods(self, node_name: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.get(node_name, {}).values())

    def list_sharing_policies(self) -> list[dict[str, Any]]:
        return self.caches.policies.items()

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        informer = self.caches.configmaps.get((namespace, name))
        if informer is None:
            return super().get_configmap(namespace, name)
        return informer.get(f"{namespace}/{name}")

    def wait_gpunode_change(self, name: str, resource_version: str, timeout_s: float) -> None:
        """Wait on the cache (no watch of its own) until the GPUNode is newer than ``resource_version``."""
        try:
            since = int(resource_version)
        except ValueError:
            since = -1
        with self._lock:
            self._lock.wait_for(lambda: _rv(self.caches.gpunodes.get(name)) > since, timeout_s)

    # ------------------------------------------------------------------ writes (answers kept until cached)
    def create_gpunode(self, name: str, node_uid: str | None) -> dict[str, Any]:
        obj = super().create_gpunode(name, node_uid)
        self._wrote("gpunodes", obj, _gpunode_trigger)
        return obj

    def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        obj = super().patch_gpunode_status(name, status)
        self._wrote("gpunodes", obj, _gpunode_trigger)
        return obj

    def annotate_gpunode(self, name: str, annotations: Mapping[str, str | None]) -> None:
        obj = call(self._custom.patch_cluster_custom_object, GROUP, VERSION, PLURAL, name,
                   {"metadata": {"annotations": dict(annotations)}}, _content_type=MERGE_PATCH, idempotent=True)
        if isinstance(obj, dict):
            self._wrote("gpunodes", obj, _gpunode_trigger)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        answer = call(self._core.patch_node, name, dict(patch), _content_type=MERGE_PATCH, idempotent=True,
                      _preload_content=False)
        self._wrote("nodes", _trim(_json(answer)), _node_trigger)

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        answer = call(self._core.patch_node_status, name, dict(patch), _content_type=MERGE_PATCH, idempotent=True,
                      _preload_content=False)
        self._wrote("nodes", _trim(_json(answer)), _node_trigger)

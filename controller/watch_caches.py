"""The controller's watch caches, and a :class:`~controller.kube.Kube` that reads from them.

Without caches every cycle lists every GPUNode, Node, pod, SharingPolicy, Namespace (and,
with a DRA pool, ResourceClaim) of the cluster: at a thousand nodes that is tens
of megabytes a cycle for the API server to send and for the controller to parse.
:class:`ClusterCaches` keeps one :class:`kube.informer.Informer` per kind (a list,
then a watch), and :class:`CachedKube` answers the same ``list_*`` calls from
them, so the rest of the controller does not know where its objects come from:
the seam is :class:`~controller.kube.Kube` itself, whose reads are the cycle's
only input. Writes go to the API server as before.

What is kept of each object (``keep``): what ``controller.state.build`` and the
release code read. Nodes keep their name, ``uid``, ``resourceVersion``, labels
and allocatable (not their images, addresses or heartbeats); pods lose their
``managedFields``, and their containers keep only name and resources. GPUNodes,
SharingPolicies and ResourceClaims are kept whole (small, and read whole).

**What wakes a cycle** (:attr:`ClusterCaches.on_change`): any change of a pod,
GPUNode (except a change of its agent's heartbeat time, utilisation figures and
per-pod use histories alone, which a resync cycle or the recommender reads anyway), SharingPolicy or ResourceClaim, a
Node whose labels or allocatable changed, and a Namespace whose labels changed
(SharingPolicies' namespace rules select them).

**Read your writes.** The cache shows a write of the controller's only once the
watch brings it, and a cycle started in between would see the pod still gated
(and release it again, or hand its capacity to another pod) or a GPU's old
layout (and plan it again). :class:`CachedKube` keeps the object each write
answered with (``kube.own_writes.WrittenObjects``, the one implementation the agent
fleet uses too) and reads it instead of the cache's copy while the cache shows a
version from before the write. Guarded pod patches (``test`` ops) are built
from what is read, so they hold against the object the write produced.

**Leader only.** The caches start when this replica first leads
(``controller.operator``): a standby holds no copy of the cluster. Until a
cache has listed once, its ``list_*`` call lists directly.

**ResourceClaims** are cached only once the cycle first asks for them (a
cluster with a DRA node pool or DRA pods): a cluster without the
``resource.k8s.io`` API never lists them. Kueue's **Workloads** likewise, once a cycle first asks
(some pod carries Kueue's admission gate) and only when the API server serves them: a cluster
without Kueue gets one list call every :data:`KUEUE_RECHECK_SECONDS` while such a pod exists, no
watch and no error. A Workload wakes a cycle only when its conditions say something new.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controller.kube import Kube
from kube.informer import Informer, object_key, wait_all_synced
from kube.own_writes import WrittenObjects
from sharing.api.fields import as_map as _map

log = logging.getLogger("gpupack.controller")

KINDS = ("gpunodes", "nodes", "pods", "sharingpolicies", "namespaces", "resourceclaims", "workloads")
EAGER = ("gpunodes", "nodes", "pods", "sharingpolicies", "namespaces")
"""Started with the caches; ``resourceclaims`` and ``workloads`` on first use."""

KUEUE_RECHECK_SECONDS = 300.0
"""How long a cluster found without Kueue's Workload API is believed to have none (Kueue may be
installed later): one list call that long, not one a cycle."""


# ------------------------------------------------------------------- trimming
def keep_node(obj: dict[str, Any]) -> dict[str, Any]:
    meta, status = _map(obj.get("metadata")), _map(obj.get("status"))
    kept_meta = {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels") if k in meta}
    kept: dict[str, Any] = {"metadata": kept_meta}
    if "allocatable" in status:
        kept["status"] = {"allocatable": status["allocatable"]}
    taints = _map(obj.get("spec")).get("taints")
    if taints:  # the planner pins pods only where they tolerate them (sharing.rules.taints)
        kept["spec"] = {"taints": taints}
    return kept


def keep_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    """A Namespace's name, ``uid``, ``resourceVersion`` and labels: what SharingPolicies select."""
    meta = _map(obj.get("metadata"))
    return {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels") if k in meta}}


def _container(raw: Any) -> Any:
    c = _map(raw)
    return {k: c[k] for k in ("name", "resources") if k in c} if c else raw


def keep_pod(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    kept_spec = {k: v for k, v in spec.items() if k not in ("volumes", "containers", "initContainers")}
    for field in ("containers", "initContainers"):
        if isinstance(spec.get(field), list):
            kept_spec[field] = [_container(c) for c in spec[field]]
    kept: dict[str, Any] = {
        "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
        "spec": kept_spec,
        "status": {k: status[k] for k in ("phase", "conditions") if k in status},
    }
    for field in ("apiVersion", "kind"):
        if field in obj:
            kept[field] = obj[field]
    return kept


def _whole(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


def keep_workload(obj: dict[str, Any]) -> dict[str, Any]:
    """A Kueue Workload's identity, owners and conditions: what ``sharing.api.kueue_workload`` reads
    (not its pod sets, which repeat the pod's spec)."""
    meta, status = _map(obj.get("metadata")), _map(obj.get("status"))
    kept_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "ownerReferences") if k in meta}
    kept: dict[str, Any] = {"metadata": kept_meta}
    if "conditions" in status:
        kept["status"] = {"conditions": status["conditions"]}
    return kept


KEEP: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "gpunodes": _whole, "nodes": keep_node, "pods": keep_pod, "sharingpolicies": _whole, "resourceclaims": _whole,
    "namespaces": keep_namespace, "workloads": keep_workload,
}


# ------------------------------------------------------------ what wakes a cycle
def _gpunode_meaning(obj: Mapping[str, Any]) -> str:
    """A GPUNode without what its agent rewrites on every heartbeat."""
    status = dict(_map(obj.get("status")))
    status.pop("heartbeatTime", None)
    status.pop("usage", None)  # per-pod use histories: the recommender reads them on its own interval
    gpus = status.get("gpus")
    if isinstance(gpus, list):
        status["gpus"] = [{k: v for k, v in _map(g).items() if k != "utilization"} for g in gpus]
    meta = {k: v for k, v in _map(obj.get("metadata")).items() if k not in ("resourceVersion", "managedFields")}
    return json.dumps([meta, obj.get("spec"), status], sort_keys=True, default=str)


def _node_meaning(obj: Mapping[str, Any]) -> str:
    return json.dumps([_map(obj.get("metadata")).get("labels"), _map(obj.get("status")).get("allocatable"),
                       _map(obj.get("spec")).get("taints")], sort_keys=True, default=str)


def _namespace_meaning(obj: Mapping[str, Any]) -> str:
    return json.dumps(_map(obj.get("metadata")).get("labels"), sort_keys=True, default=str)


def _workload_meaning(obj: Mapping[str, Any]) -> str:
    """Kueue's verdict only: its conditions without their times."""
    conditions = _map(obj.get("status")).get("conditions")
    said = [[_map(c).get(k) for k in ("type", "status", "reason", "message")]
            for c in (conditions if isinstance(conditions, list) else [])]
    return json.dumps(said, sort_keys=True, default=str)


MEANING: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "gpunodes": _gpunode_meaning, "nodes": _node_meaning, "namespaces": _namespace_meaning,
    "workloads": _workload_meaning,
}
"""Kinds whose events wake a cycle only when this reading of the object changed."""


class _Waker:
    """An informer listener that calls ``wake`` on the changes that matter (see the module docstring)."""

    def __init__(self, kind: str, wake: Callable[[str], None]) -> None:
        self.kind = kind
        self.wake = wake
        self.meaning = MEANING.get(kind)
        self._seen: dict[str, int] = {}
        """Per object, the hash of its reading when it last woke a cycle (a hash: GPUNodes are kilobytes)."""

    def __call__(self, event: str, obj: Mapping[str, Any]) -> None:
        if self.meaning is None:
            self.wake(self.kind)
            return
        key = object_key(obj)
        if event == "DELETED":
            self._seen.pop(key, None)
            self.wake(self.kind)
            return
        meaning = hash(self.meaning(obj))
        if self._seen.get(key) != meaning:
            self._seen[key] = meaning
            self.wake(self.kind)


class ClusterCaches:
    """One informer per kind the controller reads, started together (claims on first use)."""

    def __init__(self, listers: Mapping[str, Callable[..., Any]], *,
                 on_change: Callable[[str], None] | None = None, watch_seconds: float = 300.0) -> None:
        self.on_change = on_change
        """Called (on an informer's thread) with the kind when a change that matters arrives."""
        self.informers = {
            kind: Informer(kind, listers[kind], keep=KEEP[kind], watch_seconds=watch_seconds)
            for kind in KINDS if kind in listers
        }
        for kind, informer in self.informers.items():
            informer.listeners.append(_Waker(kind, self._changed))
        self._lock = threading.Lock()
        self.started: set[str] = set()

    def _changed(self, kind: str) -> None:
        if self.on_change is not None:
            self.on_change(kind)

    def start(self, kinds: Sequence[str] = EAGER) -> None:
        with self._lock:
            for kind in kinds:
                if kind in self.informers and kind not in self.started:
                    self.informers[kind].start()
                    self.started.add(kind)

    def wait_synced(self, timeout_s: float, kinds: Sequence[str] = EAGER) -> list[str]:
        """Wait for the first list of each started informer of ``kinds``; those not synced in time."""
        return wait_all_synced([self.informers[k] for k in kinds if k in self.started], timeout_s)

    def synced(self, kind: str) -> bool:
        return kind in self.started and self.informers[kind].synced

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop()


# ---------------------------------------------------------------- the seam
class CachedKube(Kube):
    """:class:`Kube` whose ``list_*`` reads come from :class:`ClusterCaches` once they have listed."""

    def __init__(self, api: Any, caches: ClusterCaches | None = None) -> None:
        super().__init__(api)
        self.caches = caches or ClusterCaches(self.listers())
        self.written = WrittenObjects()
        """What the controller wrote that its caches may not show yet (read past the cache)."""
        for kind, informer in self.caches.informers.items():
            self.written.follow(kind, informer)
        self.listed_directly = 0
        """Reads answered by a direct list because the cache had not listed yet."""
        self._kueue_absent_until: float | None = None
        """Until when (``time.monotonic``) Kueue's Workload API is taken as not served."""

    def _cached(self, kind: str) -> list[dict[str, Any]] | None:
        if not self.caches.synced(kind):
            return None
        informer = self.caches.informers[kind]
        return self.written.overlay(kind, informer, informer.items())

    def _read(self, kind: str, direct: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        cached = self._cached(kind)
        if cached is not None:
            return cached
        self.listed_directly += 1
        return direct()

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return self._read("gpunodes", super().list_gpunodes)

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._read("nodes", super().list_nodes)

    def list_pods(self) -> list[dict[str, Any]]:
        return self._read("pods", super().list_pods)

    def list_policies(self) -> list[dict[str, Any]]:
        return self._read("sharingpolicies", super().list_policies)

    def list_namespaces(self) -> list[dict[str, Any]]:
        return self._read("namespaces", super().list_namespaces)

    def list_resource_claims(self) -> list[dict[str, Any]]:
        if "resourceclaims" not in self.caches.started:
            self.caches.start(("resourceclaims",))
            # The first time only: a cycle that needs the claims waits a little for their list.
            self.caches.wait_synced(10.0, ("resourceclaims",))
        return self._read("resourceclaims", super().list_resource_claims)

    def list_workloads(self) -> list[dict[str, Any]] | None:
        """Kueue's Workloads, cached once the API is found served; a cluster without it is listed
        directly again only every :data:`KUEUE_RECHECK_SECONDS` (None meanwhile)."""
        if "workloads" in self.caches.started:
            return self._read("workloads", lambda: super(CachedKube, self).list_workloads() or [])
        if self._kueue_absent_until is not None and time.monotonic() < self._kueue_absent_until:
            return None
        direct = super().list_workloads()
        if direct is None:
            self._kueue_absent_until = time.monotonic() + KUEUE_RECHECK_SECONDS
            return None
        self._kueue_absent_until = None
        self.caches.start(("workloads",))
        return direct

    # Writes: as Kube's, remembering what they produced.
    def _note(self, kind: str, key: str, answer: dict[str, Any] | None) -> dict[str, Any] | None:
        informer = self.caches.informers.get(kind)
        if informer is not None and kind in self.caches.started:
            self.written.wrote(kind, informer.get(key), answer, key=key)
        return answer

    def patch_gpunode(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        return self._note("gpunodes", name, super().patch_gpunode(name, body))

    def create_resource_claim(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        # Read until the claims cache has it: a cycle that ran before would count its devices free
        # and pin another pod's claim to them (kube-scheduler then "cannot allocate all claims").
        answer = super().create_resource_claim(namespace, body)
        return self._note("resourceclaims", object_key(answer), answer) if answer is not None else answer

    def delete_resource_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        super().delete_resource_claim(namespace, name, uid, resource_version)
        self.written.forget("resourceclaims", f"{namespace}/{name}")

    def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
        return self._note("sharingpolicies", name, super().patch_policy_status(name, status))

    def json_patch_pod(self, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        answer = super().json_patch_pod(namespace, name, ops)
        return self._note("pods", f"{namespace}/{name}", None if answer is None else keep_pod(answer))

    def patch_pod_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        answer = super().patch_pod_status(namespace, name, body)
        return self._note("pods", f"{namespace}/{name}", None if answer is None else keep_pod(answer))


__all__ = ["CachedKube", "ClusterCaches", "KEEP", "keep_node", "keep_pod", "keep_workload"]

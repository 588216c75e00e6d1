"""The scheduler extender's view of the GPU pods: per node, how many GPU pods of each priority.

The prioritize extender (``sharing.admission.priority_extender``) scores a node by whether any GPU
pod on it has a lower priority than the pod. The request path must not call the API server, so one
:class:`kube.informer.Informer` (the project's one list-then-watch) keeps every unfinished pod
of the cluster (``UNFINISHED_PODS``, as the controller lists them), reduced to its metadata
(name, namespace, ``resourceVersion``) and where it sits as a GPU pod
(``sharing.api.gpu_pod_site``, the reading the controller's planner counts; None for any other pod). Every pod is watched, not only bound ones: a gated gpupack pod pinned to a
node by its affinity counts there before it is bound.

From the informer's events (``ADDED``/``MODIFIED``/``DELETED``) an index node -> priority -> count
is kept up to date, so a call costs a few dict reads per node asked, not a pass over the pods.
An event carries only the new object, so the index remembers the site it counted per pod key.

Not part of readiness (``/readyz`` is the inventory's): until the first list has been counted
:attr:`PriorityWatch.synced` is false and the route answers 503, which kube-scheduler treats as
an extender error and ignores for that pod.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from kube.informer import DELETED, Informer, Lister, object_key
from sharing.api.gpu_pod_site import UNFINISHED_PODS, GpuPodSite, gpu_pod_site

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from webhook.settings import WebhookSettings

_SITE = "site"


def kept(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache holds of one pod: the metadata the informer needs and its :class:`GpuPodSite` (or None)."""
    metadata = obj.get("metadata") or {}
    meta = {k: metadata[k] for k in ("name", "namespace", "resourceVersion") if k in metadata}
    return {"metadata": meta, _SITE: gpu_pod_site(obj)}


def api_lister(api: ApiClient) -> Lister:
    """The list call of every namespace's unfinished pods (finished ones never count)."""
    from kubernetes import client

    return partial(client.CoreV1Api(api).list_pod_for_all_namespaces, field_selector=UNFINISHED_PODS)


class _ListedInformer(Informer):
    """An informer that says when a list's events have all been told to its listeners: the informer
    marks itself synced just before telling them, and an index read in between would miss pods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counted = threading.Event()

    def relist(self) -> None:
        super().relist()
        self.counted.set()


class PriorityWatch:
    """An informer of pods and the index node -> GPU pods per priority that the extender reads."""

    def __init__(self, lister: Lister, *, watch_seconds: float = 300.0) -> None:
        self.informer = _ListedInformer("pods", lister, keep=kept, watch_seconds=watch_seconds)
        self._lock = threading.Lock()
        self._sites: dict[str, GpuPodSite] = {}
        self._counts: dict[str, Counter[int]] = {}
        self.informer.listeners.append(self._on_event)

    @classmethod
    def from_api(cls, api: ApiClient, settings: WebhookSettings) -> PriorityWatch:
        return cls(api_lister(api), watch_seconds=settings.resync_seconds)

    @property
    def synced(self) -> bool:
        """The first list of pods is in the index."""
        return self.informer.counted.is_set()

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        key = object_key(obj)
        site = obj.get(_SITE) if kind != DELETED else None
        with self._lock:
            old = self._sites.pop(key, None)
            if old is not None:
                counts = self._counts[old.node]
                counts[old.priority] -= 1
                if counts[old.priority] <= 0:
                    del counts[old.priority]
                    if not counts:
                        del self._counts[old.node]
            if isinstance(site, GpuPodSite):
                self._sites[key] = site
                self._counts.setdefault(site.node, Counter())[site.priority] += 1

    def priorities(self, nodes: Sequence[str]) -> dict[str, frozenset[int]]:
        """Node -> the priorities of the GPU pods on it, for the nodes of ``nodes`` that hold any."""
        with self._lock:
            return {n: frozenset(c) for n in nodes if (c := self._counts.get(n))}

    def counts(self, node: str) -> dict[int, int]:
        """Priority -> GPU pods of it on ``node`` (for tests and debugging)."""
        with self._lock:
            return dict(self._counts.get(node, {}))

    def __len__(self) -> int:
        """GPU pods counted."""
        with self._lock:
            return len(self._sites)

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()


__all__ = ["PriorityWatch", "api_lister", "kept"]

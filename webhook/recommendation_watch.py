"""The webhook's view of the workloads' GPURecommendations: a watch cache of compact readings.

Right-sizing ``Initial`` sizes a new pod from its workload's recommendation
(``sharing.admission.right_sizing``), which the controller's recommender writes as one
``GPURecommendation`` per workload. The request path must not call the API server, so one
:class:`kube.informer.Informer` (the project's one list-then-watch, decoding with
``kube.safejson``) keeps every GPURecommendation of the cluster, keyed by ``namespace/name``.

What it keeps of an object is only its reading (``sharing.api.recommendation``, validated with
the typed model; an object that does not validate is left out and logged once per version, so a
bad one is never acted on): per container a name, two integers, plus the object's name, target and
generation. That is a few hundred bytes per workload whatever the object holds (its
``managedFields`` are dropped), and the CRD itself bounds an object to 32 containers, so the
cache grows with the number of workloads and nothing else.

Independent of the inventory's snapshot (``webhook.inventory_watch``): a recommendation changes as
the recommender learns (every few minutes per workload), and a change here must not publish a new
inventory snapshot nor throw away the decisions remembered for it. A lookup reads the cache under
the informer's lock, as ``Informer.get`` does.

Not part of readiness. Until the first list completes (or where the CRD or the permission is
missing) a lookup finds nothing, so pods are admitted with their own request: sizing fails open,
to what the pod asked for, and the review's message says the recommendations are not synced.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from kube.informer import Informer, Lister
from sharing.api.crd import API_VERSION, GROUP, VERSION
from sharing.api.recommendation import RecommendationReading, read_recommendation

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from webhook.settings import WebhookSettings

log = logging.getLogger("gpupack.webhook.recommendations")

PLURAL = "gpurecommendations"
_READING = "reading"


def kept(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache holds of one GPURecommendation: the metadata the informer needs (name,
    namespace, ``resourceVersion``) and the reading. Raises for an object that does not validate,
    which the informer then leaves out (``Informer.rejected``)."""
    metadata = obj.get("metadata") or {}
    # The items of a list carry no apiVersion and kind; the typed model wants them.
    reading = read_recommendation({**obj, "apiVersion": API_VERSION, "kind": "GPURecommendation"})
    meta = {k: metadata[k] for k in ("name", "namespace", "resourceVersion") if k in metadata}
    return {"metadata": meta, _READING: reading}


def api_lister(api: ApiClient) -> Lister:
    """The list call of every namespace's GPURecommendations."""
    from kubernetes import client

    return partial(client.CustomObjectsApi(api).list_cluster_custom_object, GROUP, VERSION, PLURAL)


class RecommendationWatch:
    """An informer of GPURecommendations and the lookup the admission path calls."""

    def __init__(self, lister: Lister, *, watch_seconds: float = 300.0) -> None:
        self.informer = Informer(PLURAL, lister, keep=kept, watch_seconds=watch_seconds)

    @classmethod
    def from_api(cls, api: ApiClient, settings: WebhookSettings) -> RecommendationWatch:
        return cls(api_lister(api), watch_seconds=settings.resync_seconds)

    @property
    def synced(self) -> bool:
        return self.informer.synced

    def lookup(self, namespace: str, name: str) -> RecommendationReading | None:
        """The reading of GPURecommendation ``namespace/name``, if the cache holds one
        (``sharing.admission.right_sizing.RecommendationLookup``)."""
        held = self.informer.get(f"{namespace}/{name}")
        reading = held.get(_READING) if held is not None else None
        return reading if isinstance(reading, RecommendationReading) else None

    def __len__(self) -> int:
        return len(self.informer)

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()


__all__ = ["PLURAL", "RecommendationWatch", "api_lister", "kept"]

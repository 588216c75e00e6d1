"""The controller's calls to the Kubernetes API (the kubernetes client is used nowhere else in ``controller/``).

Credentials, error translation, retries and Events come from
:class:`kube.client.KubeClient`; this module adds the calls only the controller
makes. Plain dicts in and out. Lists are read raw (``_preload_content=False``)
and parsed as JSON: at a few thousand pods the client's model classes cost more
than the planning itself. Writes are JSON merge patches of fields the
controller owns (``GPUNode.spec``, its own annotations) or, for pods, a JSON
patch guarded by a ``test`` of the fields it changes, so a concurrent writer
makes the patch fail instead of being overwritten.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, cast

from kubernetes import client

from kube import safejson
from kube.client import JSON_PATCH, MERGE_PATCH, KubeClient, call
from kube.errors import KubeError
from kube.informer import Lister
from sharing.api import kueue_workload as kueue
from sharing.api.crd import GROUP, VERSION
from sharing.api.gpu_pod_site import UNFINISHED_PODS

log = logging.getLogger("gpupack.controller.kube")

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
CLAIMS = "resourceclaims"
RECOMMENDATIONS = "gpurecommendations"


def _items(response: Any) -> list[dict[str, Any]]:
    """A list answer's objects; one nested deeper than any reader survives is left out (and logged), not the list."""
    items, left_out = safejson.list_items(response.data)
    if left_out:
        log.warning("left out of a list, nested deeper than %d levels: %s", safejson.MAX_DEPTH, ", ".join(left_out))
    return items


def _body(response: Any) -> dict[str, Any] | None:
    """The object a write answered with (None when the answer is not one)."""
    try:
        data, _ = safejson.loads(response.data)
    except (AttributeError, TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Kube(KubeClient):
    """The few calls the controller makes."""

    component = "gpupack-controller"

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self._coord = client.CoordinationV1Api(api)
        self._apps = client.AppsV1Api(api)
        self._policy = client.PolicyV1Api(api)

    # ---------------------------------------------------------------- reading
    def listers(self) -> dict[str, Lister]:
        """The list calls :class:`kube.informer.Informer` caches follow, by what they list
        (the same selections as the ``list_*`` methods below)."""
        custom, core = self._custom, self._core
        return {
            "gpunodes": partial(custom.list_cluster_custom_object, GROUP, VERSION, "gpunodes"),
            "sharingpolicies": partial(custom.list_cluster_custom_object, GROUP, VERSION, "sharingpolicies"),
            "nodes": core.list_node,
            "namespaces": core.list_namespace,
            "pods": partial(core.list_pod_for_all_namespaces, field_selector=UNFINISHED_PODS),
            "resourceclaims": partial(custom.list_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, CLAIMS),
            "workloads": partial(custom.list_cluster_custom_object, kueue.GROUP, kueue.VERSION, kueue.WORKLOADS),
        }

    def list_gpunodes(self) -> list[dict[str, Any]]:
        return _items(call(self._custom.list_cluster_custom_object, GROUP, VERSION, "gpunodes",
                           _preload_content=False, idempotent=True))

    def list_policies(self) -> list[dict[str, Any]]:
        return _items(call(self._custom.list_cluster_custom_object, GROUP, VERSION, "sharingpolicies",
                           _preload_content=False, idempotent=True))

    def list_nodes(self) -> list[dict[str, Any]]:
        return _items(call(self._core.list_node, _preload_content=False, idempotent=True))

    def list_namespaces(self) -> list[dict[str, Any]]:
        """Every Namespace: their labels are what SharingPolicies' namespace rules select."""
        return _items(call(self._core.list_namespace, _preload_content=False, idempotent=True))

    def list_pods(self) -> list[dict[str, Any]]:
        """Pods not yet finished (the API server filters by phase)."""
        return _items(call(self._core.list_pod_for_all_namespaces, field_selector=UNFINISHED_PODS,
                           _preload_content=False, idempotent=True))

    def list_pod_disruption_budgets(self) -> list[dict[str, Any]]:
        """Every PodDisruptionBudget: read when a cycle plans a preemption (``controller.planning.budgets``)."""
        return _items(call(self._policy.list_pod_disruption_budget_for_all_namespaces, _preload_content=False,
                           idempotent=True))

    def list_resource_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim (the DRA pool's usage, ``controller.state.dra_usage``)."""
        return _items(call(self._custom.list_cluster_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, CLAIMS,
                           _preload_content=False, idempotent=True))

    def list_workloads(self) -> list[dict[str, Any]] | None:
        """Every Kueue Workload (``sharing.api.kueue_workload``); None when the API server does not serve
        them (Kueue is not installed: not an error)."""
        try:
            return _items(call(self._custom.list_cluster_custom_object, kueue.GROUP, kueue.VERSION, kueue.WORKLOADS,
                               _preload_content=False, idempotent=True))
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            out: Any = call(self._custom.get_namespaced_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, namespace,
                            CLAIMS, name, _preload_content=False, idempotent=True)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise
        claim, _ = safejson.loads(out.data)  # a too-deep subtree reads as a marker the typed readers refuse
        return cast(dict[str, Any], claim)

    # ---------------------------------------------------------------- writing
    def create_resource_claim(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Not retried: a lost answer would read as a conflict, which the caller resolves by reading
        the claim back (``controller.writes.dra_claims.existing_pin``). The claim as created (None when the
        answer is not one)."""
        return _body(call(self._custom.create_namespaced_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, namespace,
                          CLAIMS, dict(body), _preload_content=False))

    def delete_resource_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete the claim only if it is still that object at that version (preconditions): a claim
        kube-scheduler allocated in between is left alone (KubeError, conflict). Gone already: done."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        try:
            call(self._custom.delete_namespaced_custom_object, RESOURCE_GROUP, RESOURCE_VERSION, namespace, CLAIMS,
                 name, body=body, _preload_content=False)
        except KubeError as exc:
            if not exc.not_found:
                raise

    # Writes answer with the object as the API server holds it afterwards (None when the answer
    # is not one), so a cache that has not seen the write yet can be read past
    # (``controller.watch_caches``).
    def patch_gpunode(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        return _body(call(self._custom.patch_cluster_custom_object, GROUP, VERSION, "gpunodes", name, dict(body),
                          _content_type=MERGE_PATCH, _preload_content=False, idempotent=True))

    def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patch a SharingPolicy's status subresource."""
        return _body(call(self._custom.patch_cluster_custom_object_status, GROUP, VERSION, "sharingpolicies", name,
                          {"status": dict(status)}, _content_type=MERGE_PATCH, _preload_content=False,
                          idempotent=True))

    def json_patch_pod(self, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """A guarded JSON patch: not retried, since a lost answer would read as a failed ``test``."""
        return _body(call(self._core.patch_namespaced_pod, name, namespace, [dict(o) for o in ops],
                          _content_type=JSON_PATCH, _preload_content=False))

    def patch_pod_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """A strategic-merge patch of the pod's ``status`` subresource (conditions merge by type, so
        kube-scheduler's own stay as they are)."""
        return _body(call(self._core.patch_namespaced_pod_status, name, namespace, dict(body),
                          _content_type=STRATEGIC_MERGE_PATCH, _preload_content=False, idempotent=True))

    def evict_pod(self, namespace: str, name: str) -> None:
        """The Eviction API (honours PodDisruptionBudgets: 429 while one forbids it)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        call(self._core.create_namespaced_pod_eviction, name, namespace, body, _preload_content=False)

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Deployment (None when it is gone): ``Recreate`` moves its only replica by a rollout."""
        try:
            out: Any = call(self._apps.read_namespaced_deployment, name, namespace, _preload_content=False,
                            idempotent=True)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise
        deployment, _ = safejson.loads(out.data)
        return cast(dict[str, Any], deployment)

    def patch_deployment(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """A merge patch (``controller.planning.right_size_rollouts.rollout_patch``: the template's
        ``right-sizing.gpupack.io/resized-at``, guarded by resourceVersion). Not retried: a lost answer would read
        as a conflict."""
        call(self._apps.patch_namespaced_deployment, name, namespace, dict(body), _content_type=MERGE_PATCH,
             _preload_content=False)

    def delete_pod(self, namespace: str, name: str, uid: str, resource_version: str | None) -> bool:
        """Delete the pod only if it is still that object at that version (preconditions): a pod
        released or changed in between is left alone (KubeError, conflict); ``resource_version``
        None: any version of that object (a preemption's victim). The pod's own grace period
        applies. False: gone already (a watch cache that has not seen the delete yet lists it once more)."""
        preconditions = {"uid": uid} if resource_version is None else {"uid": uid, "resourceVersion": resource_version}
        body = {"preconditions": preconditions}
        try:
            call(self._core.delete_namespaced_pod, name, namespace, body=body, _preload_content=False)
        except KubeError as exc:
            if not exc.not_found:
                raise
            return False
        return True

    # ------------------------------------------------------- recommendations
    def list_recommendations(self) -> list[dict[str, Any]]:
        """Every GPURecommendation: read once when the recommender first runs (its checkpoints), and by
        the ``Recreate`` updater each cycle while some namespace is in ``Recreate`` (not cached)."""
        return _items(call(self._custom.list_cluster_custom_object, GROUP, VERSION, RECOMMENDATIONS,
                           _preload_content=False, idempotent=True))

    def create_recommendation(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Not retried: a lost answer would read as a conflict, which the caller treats as existing."""
        return _body(call(self._custom.create_namespaced_custom_object, GROUP, VERSION, namespace,
                          RECOMMENDATIONS, dict(body), _preload_content=False))

    def patch_recommendation_status(self, namespace: str, name: str,
                                    status: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patch a GPURecommendation's status subresource (lists, as the whole status, replaced)."""
        return _body(call(self._custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
                          RECOMMENDATIONS, name, {"status": dict(status)}, _content_type=MERGE_PATCH,
                          _preload_content=False, idempotent=True))

    # ------------------------------------------------------------------ lease
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease: Any = call(self._coord.read_namespaced_lease, name, namespace,
                              _preload_content=False, idempotent=True)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise
        return cast(dict[str, Any], json.loads(lease.data))

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        out: Any = call(self._coord.create_namespaced_lease, namespace, dict(body), _preload_content=False)
        return cast(dict[str, Any], json.loads(out.data))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Compare-and-swap: ``body.metadata.resourceVersion`` must be current (409 otherwise)."""
        out: Any = call(self._coord.replace_namespaced_lease, name, namespace, dict(body), _preload_content=False)
        return cast(dict[str, Any], json.loads(out.data))

"""The node agent's calls to the Kubernetes API (everything else in ``node/`` is pure or NVML).

Credentials, error translation, retries and Events come from
:class:`kube.client.KubeClient`; this module adds the calls only the agent
makes. Plain dicts in and out (the wire form), so the callers and their tests
never see the client library's model classes. Every call that changes something
is a JSON merge patch of fields the agent owns, or a read-modify-write guarded
by ``resourceVersion`` (ConfigMaps, ResourceSlices), so concurrent writers cannot
lose each other's changes.

ResourceSlices (``resource.k8s.io/v1``, the ``dra`` backend) go through the
client's ``ResourceV1Api`` with plain JSON bodies, read back raw
(``_preload_content=False``): the object as the API server stores it, with no
model class in between that could drop a field the client does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from kube import safejson
from kube.client import MERGE_PATCH, KubeClient, KubeConfigError, as_kube_error, call
from kube.errors import KubeError
from sharing.api.crd import GROUP, VERSION

PLURAL = "gpunodes"

__all__ = ["Kube", "KubeConfigError"]


def _json(response: Any) -> dict[str, Any]:
    """The body of a raw (``_preload_content=False``) answer."""
    data, _ = safejson.loads(response.data or b"{}")  # any depth: a too-deep subtree reads as a marker
    return data if isinstance(data, dict) else {}


def get_gpunode(custom: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    """The GPUNode ``name`` as the API server holds it; None when there is none. Also the DRA
    plugin's read of its node's faults (``node.draplugin.gpunode_source``)."""
    try:
        return cast(dict[str, Any], call(custom.get_cluster_custom_object, GROUP, VERSION, PLURAL, name,
                                         idempotent=True))
    except KubeError as exc:
        if exc.not_found:
            return None
        raise


class Kube(KubeClient):
    component = "gpupack-node-agent"

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(api)
        self._resource = client.ResourceV1Api(api)

    # ------------------------------------------------------------------ GPUNode
    def get_gpunode(self, name: str) -> dict[str, Any] | None:
        return get_gpunode(self._custom, name)

    def create_gpunode(self, name: str, node_uid: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpupack-node-agent"}}
        if node_uid:
            # Owned by the Node: deleting the Node garbage-collects its GPUNode.
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": meta, "spec": {}}
        return cast(dict[str, Any], call(self._custom.create_cluster_custom_object, GROUP, VERSION, PLURAL, body))

    def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], call(
            self._custom.patch_cluster_custom_object_status, GROUP, VERSION, PLURAL, name,
            {"status": dict(status)}, _content_type=MERGE_PATCH, idempotent=True))

    def wait_gpunode_change(self, name: str, resource_version: str, timeout_s: float) -> None:
        """Block until the GPUNode changes after ``resource_version`` or ``timeout_s`` passes."""
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for _ in stream.stream(  # type: ignore[no-untyped-call]
                self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                field_selector=f"metadata.name={name}", resource_version=resource_version,
                timeout_seconds=max(1, int(timeout_s)), _request_timeout=timeout_s + 5,
            ):
                break
        except ApiException as exc:
            if exc.status != 410:  # expired resourceVersion: the caller re-reads anyway
                raise as_kube_error(exc) from None
        except TransportError as exc:
            # No answer at all: the API server is down. Raising lets the caller back off; returning
            # would send it straight back here (an agent once spun 160 times a second this way).
            raise as_kube_error(exc) from None
        finally:
            stream.stop()  # type: ignore[no-untyped-call]

    def annotate_gpunode(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge ``annotations`` into the GPUNode's (None removes one)."""
        call(self._custom.patch_cluster_custom_object, GROUP, VERSION, PLURAL, name,
             {"metadata": {"annotations": dict(annotations)}}, _content_type=MERGE_PATCH, idempotent=True)

    def list_sharing_policies(self) -> list[dict[str, Any]]:
        listing = cast(dict[str, Any], call(self._custom.list_cluster_custom_object, GROUP, VERSION,
                                            "sharingpolicies", idempotent=True))
        return list(listing.get("items") or [])

    # --------------------------------------------------------------------- Node
    def get_node(self, name: str) -> dict[str, Any]:
        return self.to_dict(call(self._core.read_node, name, idempotent=True))

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        call(self._core.patch_node, name, dict(patch), _content_type=MERGE_PATCH, idempotent=True)

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        call(self._core.patch_node_status, name, dict(patch), _content_type=MERGE_PATCH, idempotent=True)

    # --------------------------------------------------------------------- Pods
    def list_node_pods(self, node_name: str) -> list[dict[str, Any]]:
        pods = call(self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}",
                    idempotent=True)
        return [self.to_dict(p) for p in pods.items]

    def delete_node_pods(self, namespace: str, label_selector: str, node_name: str) -> int:
        """Delete the pods matching ``label_selector`` on ``node_name`` (their DaemonSet recreates them)."""
        pods = call(self._core.list_namespaced_pod, namespace, label_selector=label_selector,
                    field_selector=f"spec.nodeName={node_name}", idempotent=True)
        for pod in pods.items:
            if pod.metadata is not None and pod.metadata.name:
                try:
                    call(self._core.delete_namespaced_pod, pod.metadata.name, namespace, idempotent=True)
                except KubeError as exc:
                    if not exc.not_found:  # already gone is what we wanted
                        raise
        return len(pods.items)

    # ----------------------------------------------------------- ResourceSlices
    def list_resource_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        """The ResourceSlices of ``driver`` whose ``spec.nodeName`` is ``node_name``, as stored."""
        response = call(self._resource.list_resource_slice,
                        field_selector=f"spec.nodeName={node_name},spec.driver={driver}",
                        _preload_content=False, idempotent=True)
        return [i for i in _json(response).get("items") or [] if isinstance(i, dict)]

    def create_resource_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create one slice (409 if the name is taken); the stored object."""
        return _json(call(self._resource.create_resource_slice, cast(Any, dict(body)), _preload_content=False))

    def replace_resource_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace one slice; ``body``'s ``metadata.resourceVersion`` guards it (409 if it changed meanwhile).
        Not retried here: a lost answer to a write that landed would come back as a false conflict."""
        return _json(call(self._resource.replace_resource_slice, name, cast(Any, dict(body)), _preload_content=False))

    def patch_resource_slice(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch of one slice (put ``metadata.resourceVersion`` in ``patch`` to guard it)."""
        return _json(call(self._resource.patch_resource_slice, name, dict(patch), _content_type=MERGE_PATCH,
                          _preload_content=False))

    def delete_resource_slice(self, name: str) -> None:
        """Delete one slice; one already gone is not an error."""
        try:
            call(self._resource.delete_resource_slice, name, _preload_content=False, idempotent=True)
        except KubeError as exc:
            if not exc.not_found:
                raise

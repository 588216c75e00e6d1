"""The controller's ONE door to the Kubernetes API (the kubernetes client is used nowhere else).

Plain dicts in and out. Lists are read raw (``_preload_content=False``) and
parsed as JSON: at a few thousand pods the client's model classes cost more
than the planning itself. Writes are JSON merge patches of fields the
controller owns (``GPUNode.spec``, its own annotations) or, for pods, a JSON
patch guarded by a ``test`` of the fields it changes, so a concurrent writer
makes the patch fail instead of being overwritten.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kube.errors import from_api_exception
from sharing.crd import GROUP, VERSION

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
EVENT_NAMESPACE = "default"


class Kube:
    """Typed-enough wrapper over the few calls the controller makes."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._coord = client.CoordinationV1Api(api)

    @classmethod
    def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster config inside a pod, else ``kubeconfig`` (or ``$KUBECONFIG``)."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cls(client.ApiClient(cfg))
        return cls(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    # ---------------------------------------------------------------- reading
    def _items(self, response: Any) -> list[dict[str, Any]]:
        data = json.loads(response.data)
        return [i for i in data.get("items") or [] if isinstance(i, dict)]

    def list_gpunodes(self) -> list[dict[str, Any]]:
        try:
            return self._items(self._custom.list_cluster_custom_object(GROUP, VERSION, "gpunodes", _preload_content=False))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def list_policies(self) -> list[dict[str, Any]]:
        try:
            return self._items(self._custom.list_cluster_custom_object(GROUP, VERSION, "sharingpolicies", _preload_content=False))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def list_nodes(self) -> list[dict[str, Any]]:
        try:
            return self._items(self._core.list_node(_preload_content=False))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def list_pods(self) -> list[dict[str, Any]]:
        """Pods not yet finished (the API server filters by phase)."""
        try:
            return self._items(self._core.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    # ---------------------------------------------------------------- writing
    def patch_gpunode(self, name: str, body: Mapping[str, Any]) -> None:
        try:
            self._custom.patch_cluster_custom_object(
                GROUP, VERSION, "gpunodes", name, dict(body), _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def patch_policy_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a SharingPolicy's status subresource."""
        try:
            self._custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "sharingpolicies", name, {"status": dict(status)},
                _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def json_patch_pod(self, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]) -> None:
        try:
            self._core.patch_namespaced_pod(
                name, namespace, [dict(o) for o in ops], _content_type=JSON_PATCH, _preload_content=False)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def merge_patch_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        try:
            self._core.patch_namespaced_pod(
                name, namespace, dict(body), _content_type=MERGE_PATCH, _preload_content=False)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def event(self, involved: Mapping[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        """A core/v1 Event about ``involved`` (kind, name, namespace, uid); failures are ignored by callers."""
        now = dt.datetime.now(dt.timezone.utc)
        namespace = str(involved.get("namespace") or EVENT_NAMESPACE)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{involved.get('name', 'gpupack')}.", namespace=namespace),
            involved_object=client.V1ObjectReference(**{k: v for k, v in involved.items() if k in (
                "kind", "name", "namespace", "uid", "api_version")}),
            reason=reason, message=message[:1024], type=type_, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component="gpupack-controller"),
        )
        try:
            self._core.create_namespaced_event(namespace, body)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    # ------------------------------------------------------------------ lease
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease: Any = self._coord.read_namespaced_lease(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise from_api_exception(exc) from None
        return cast(dict[str, Any], json.loads(lease.data))

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            out: Any = self._coord.create_namespaced_lease(namespace, dict(body), _preload_content=False)  # type: ignore[arg-type]
        except ApiException as exc:
            raise from_api_exception(exc) from None
        return cast(dict[str, Any], json.loads(out.data))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Compare-and-swap: ``body.metadata.resourceVersion`` must be current (409 otherwise)."""
        try:
            out: Any = self._coord.replace_namespaced_lease(name, namespace, dict(body), _preload_content=False)  # type: ignore[arg-type]
        except ApiException as exc:
            raise from_api_exception(exc) from None
        return cast(dict[str, Any], json.loads(out.data))

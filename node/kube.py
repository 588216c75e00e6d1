"""The node agent's ONE door to the Kubernetes API (everything else is pure or NVML).

Plain dicts in and out (the wire form), so the callers and their tests never see
the client library's model classes. Every call that changes something is a JSON
merge patch of fields the agent owns, or a read-modify-write guarded by
``resourceVersion`` (ConfigMaps), so concurrent writers cannot lose each other's
changes. ``KubeError`` carries the HTTP status; ``conflict``/``not_found`` say which.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from kube.errors import from_api_exception
from sharing.crd import GROUP, VERSION

PLURAL = "gpunodes"
MERGE_PATCH = "application/merge-patch+json"
EVENT_NAMESPACE = "default"  # events about cluster-scoped objects live here


class KubeConfigError(Exception):
    """No usable kubeconfig or in-cluster credentials."""


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    @classmethod
    def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster config inside a pod, else ``kubeconfig`` (or ``$KUBECONFIG``)."""
        try:
            if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                return cls(client.ApiClient(cfg))
            return cls(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise KubeConfigError(f"cannot load Kubernetes credentials from {where}: {exc}") from None

    def _dict(self, obj: Any) -> dict[str, Any]:
        data = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ GPUNode
    def get_gpunode(self, name: str) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], self._custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise from_api_exception(exc) from None

    def create_gpunode(self, name: str, node_uid: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpupack-node-agent"}}
        if node_uid:
            # Owned by the Node: deleting the Node garbage-collects its GPUNode.
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNode", "metadata": meta, "spec": {}}
        try:
            return cast(dict[str, Any], self._custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], self._custom.patch_cluster_custom_object_status(
                GROUP, VERSION, PLURAL, name, {"status": dict(status)}, _content_type=MERGE_PATCH))
        except ApiException as exc:
            raise from_api_exception(exc) from None

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
                raise from_api_exception(exc) from None
        except Exception:  # noqa: BLE001 - a dropped watch just ends the wait early
            pass
        finally:
            stream.stop()  # type: ignore[no-untyped-call]

    def list_sharing_policies(self) -> list[dict[str, Any]]:
        try:
            listing = cast(dict[str, Any], self._custom.list_cluster_custom_object(GROUP, VERSION, "sharingpolicies"))
        except ApiException as exc:
            raise from_api_exception(exc) from None
        return list(listing.get("items") or [])

    # --------------------------------------------------------------------- Node
    def get_node(self, name: str) -> dict[str, Any]:
        try:
            return self._dict(self._core.read_node(name))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        try:
            self._core.patch_node(name, dict(patch), _content_type=MERGE_PATCH)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        try:
            self._core.patch_node_status(name, dict(patch), _content_type=MERGE_PATCH)
        except ApiException as exc:
            raise from_api_exception(exc) from None

    # --------------------------------------------------------------------- Pods
    def list_node_pods(self, node_name: str) -> list[dict[str, Any]]:
        try:
            pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
        except ApiException as exc:
            raise from_api_exception(exc) from None
        return [self._dict(p) for p in pods.items]

    def delete_node_pods(self, namespace: str, label_selector: str, node_name: str) -> int:
        """Delete the pods matching ``label_selector`` on ``node_name`` (their DaemonSet recreates them)."""
        try:
            pods = self._core.list_namespaced_pod(
                namespace, label_selector=label_selector, field_selector=f"spec.nodeName={node_name}")
            for pod in pods.items:
                if pod.metadata is not None and pod.metadata.name:
                    self._core.delete_namespaced_pod(pod.metadata.name, namespace)
        except ApiException as exc:
            raise from_api_exception(exc) from None
        return len(pods.items)

    # --------------------------------------------------------------- ConfigMaps
    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._dict(self._core.read_namespaced_config_map(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise from_api_exception(exc) from None

    def write_configmap(self, namespace: str, name: str, data: Mapping[str, str], resource_version: str | None) -> None:
        """Create (``resource_version`` None) or replace guarded by ``resource_version`` (409 on a race)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}
        try:
            if resource_version is None:
                self._core.create_namespaced_config_map(namespace, cast(Any, body))
            else:
                self._core.replace_namespaced_config_map(name, namespace, cast(Any, body))
        except ApiException as exc:
            raise from_api_exception(exc) from None

    # ------------------------------------------------------------------- Events
    def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str, component: str) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved.get('name', 'gpupack')}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": dict(involved), "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": component}, "reportingComponent": component,
            "reportingInstance": component, "firstTimestamp": now.isoformat(), "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        try:
            self._core.create_namespaced_event(EVENT_NAMESPACE, cast(Any, body))
        except ApiException as exc:
            raise from_api_exception(exc) from None

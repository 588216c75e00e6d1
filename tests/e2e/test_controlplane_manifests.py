"""Every manifest in manifests/ applies with server-side apply on the real API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from gpupack.devcluster.apply import MANIFESTS, apply_objects, gpupack_manifests, load_manifests

# Kinds of third-party operators gpupack integrates with; their CRDs are not
# installed in the test control plane, so their objects are only parsed.
# (monitoring.coreos.com: the Prometheus Operator's, for the optional alert rules in
# manifests/prometheus-rules.)
THIRD_PARTY_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}
# Component configuration files (kustomize, KubeSchedulerConfiguration, ...) are
# read by tools and binaries, never sent to the API server.
CONFIG_FILE_SUFFIX = ".config.k8s.io"
# Namespaces owned by operators gpupack integrates with (the GPU Operator's);
# created here as they exist in a cluster that runs that operator.
THIRD_PARTY_NAMESPACES = {"gpu-operator"}


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def test_gpupack_manifests_apply_and_reapply_idempotently(admin_client: Any) -> None:
    wanted = gpupack_manifests()
    first = apply_objects(admin_client, wanted, field_manager="gpupack-e2e")
    assert sorted(map(_key, first)) == sorted(map(_key, wanted))
    # Applying the same intent again changes nothing. CRDs have a generation
    # (bumped by spec changes only; their status is written by the API server
    # after the first apply); other objects here only a resourceVersion.
    again = apply_objects(admin_client, wanted, field_manager="gpupack-e2e")

    def version(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return str(meta.get("generation") or meta["resourceVersion"])

    assert {_key(o): version(o) for o in again} == {_key(o): version(o) for o in first}
    crds = client.ApiextensionsV1Api(admin_client)
    for obj in wanted:
        if obj["kind"] == "CustomResourceDefinition":
            status = crds.read_custom_resource_definition(obj["metadata"]["name"]).status
            assert {c.type: c.status for c in status.conditions}["Established"] == "True"


def _group(obj: dict[str, Any]) -> str:
    return obj["apiVersion"].rsplit("/", 1)[0] if "/" in obj["apiVersion"] else ""


def test_every_manifest_applies_server_side_dry_run(
    admin_client: Any, gpupack_installed: list[dict[str, Any]]
) -> None:
    """Other components' manifests (webhook, agent, controller) too, without persisting them:
    a dry-run still runs defaulting, schema validation and admission."""
    # Helm chart templates are not YAML until rendered (the controller's install
    # test renders and applies the chart).
    files = [p for p in sorted(Path(MANIFESTS).rglob("*.yaml"))
             if p.name != "kustomization.yaml" and "helm" not in p.relative_to(MANIFESTS).parts]
    objects = [o for f in files for o in load_manifests(f)
               if not _group(o).endswith(CONFIG_FILE_SUFFIX)]
    namespaces = {o["metadata"]["namespace"] for o in objects if o["metadata"].get("namespace")}
    foreign = namespaces - {"gpupack-system"}
    assert foreign <= THIRD_PARTY_NAMESPACES, f"manifests use unknown namespaces: {foreign}"
    core = client.CoreV1Api(admin_client)
    existing = {n.metadata.name for n in core.list_namespace().items}
    for name in foreign - existing:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    dyn = DynamicClient(admin_client)
    applied, unserved = [], set()
    for obj in objects:
        group = _group(obj)
        try:
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        except ResourceNotFoundError:
            unserved.add(group)
            continue
        result = dyn.server_side_apply(resource, body=obj, field_manager="gpupack-e2e",
                                       force_conflicts=True, dry_run="All")
        assert result.metadata.name == obj["metadata"]["name"]
        applied.append(obj)
    assert unserved <= THIRD_PARTY_GROUPS, f"manifests use APIs this cluster lacks: {unserved}"
    assert len(applied) >= len(gpupack_manifests())

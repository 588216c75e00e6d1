"""Server-side apply of manifests (files, directories or dicts), as ``kubectl apply --server-side``.

Objects are applied in dependency order: Namespaces, then CustomResourceDefinitions
(waiting until each is Established and refreshing API discovery, so custom
resources in the same batch can follow), then everything else.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from gpupack.devcluster.errors import StartFailed

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
FIELD_MANAGER = "gpupack"
Manifest = dict[str, Any]

_FIRST = {"Namespace": 0, "CustomResourceDefinition": 1}


def load_manifests(*paths: Path | str) -> list[Manifest]:
    """Every YAML document under ``paths`` (files, or directories searched recursively; a directory's
    ``kustomization.yaml`` files are kustomize's, not cluster objects, and are left out)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*.yaml") if p.is_file() and p.name != "kustomization.yaml")
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no manifest file or directory at {path}")
    docs: list[Manifest] = []
    for file in files:
        for doc in yaml.safe_load_all(file.read_text(encoding="utf-8")):
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                raise ValueError(f"{file}: a document without apiVersion/kind: {str(doc)[:80]}")
            docs.append(doc)
    return docs


_WEBHOOK_CONFIGS = {"mutating": ("mutating.yaml", "/mutate"), "validating": ("validating.yaml", "/validate")}


def local_webhook_config(kind: Literal["mutating", "validating"], url: str, ca_bundle: str,
                         name: str | None = None) -> Manifest:
    """The shipped webhook configuration of ``kind`` (``manifests/webhook``) for a webhook served
    outside the cluster: every hook calls ``url`` plus the kind's path and trusts ``ca_bundle``
    (base64) itself, where a cluster has cert-manager inject it; renamed ``name`` if given."""
    file, path = _WEBHOOK_CONFIGS[kind]
    config: Manifest = yaml.safe_load((MANIFESTS / "webhook" / file).read_text())
    config["metadata"].pop("annotations", None)  # cert-manager's injection request: the bundle is set here
    if name is not None:
        config["metadata"]["name"] = name
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
    return config


def gpupack_manifests() -> list[Manifest]:
    """gpupack's own cluster objects: namespace, CRDs and RBAC."""
    return load_manifests(MANIFESTS / "namespace", MANIFESTS / "crds", MANIFESTS / "rbac")


NODE_RESTRICTION_POLICY = MANIFESTS / "agent" / "node-restriction-policy.yaml"


def node_isolation_manifests() -> list[Manifest]:
    """The node agent's admission policies (its own Node, GPUNode, device-plugin entry, pods and
    ResourceSlices only). Every local stack that runs agents installs them, each agent with a token bound
    to a pod on its node (``ControlPlane.node_agent_kubeconfig``), so every run exercises them."""
    return load_manifests(NODE_RESTRICTION_POLICY)


def _resource(dyn: DynamicClient, obj: Manifest) -> Any:
    try:
        return dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    except ResourceNotFoundError:
        dyn.resources.invalidate_cache()  # a CRD may have just been established
        return dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])


def wait_established(dyn: DynamicClient, name: str, timeout_s: float = 30.0) -> None:
    """Wait until CRD ``name`` reports condition Established=True."""
    crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    deadline = time.monotonic() + timeout_s
    conditions: list[Any] = []
    while time.monotonic() < deadline:
        status = crds.get(name=name).to_dict().get("status") or {}
        conditions = status.get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise StartFailed(
        f"CRD {name} not Established after {timeout_s:.0f}s (conditions: {conditions})",
        "check the CRD's conditions (NamesAccepted) and the kube-apiserver log",
    )


def apply_objects(
    api_client: Any,
    objects: Iterable[Manifest],
    field_manager: str = FIELD_MANAGER,
    force: bool = True,
) -> list[Manifest]:
    """Server-side apply ``objects``; returns what the API server stored, in apply order."""
    dyn = DynamicClient(api_client)  # type: ignore[no-untyped-call]
    ordered = sorted(objects, key=lambda o: _FIRST.get(o["kind"], 2))
    applied: list[Manifest] = []
    crds_pending: list[str] = []
    for obj in ordered:
        if crds_pending and obj["kind"] != "CustomResourceDefinition":
            for name in crds_pending:
                wait_established(dyn, name)
            crds_pending.clear()
            dyn.resources.invalidate_cache()
        result = dyn.server_side_apply(  # type: ignore[no-untyped-call]
            _resource(dyn, obj), body=obj, field_manager=field_manager, force_conflicts=force
        )
        applied.append(result.to_dict())
        if obj["kind"] == "CustomResourceDefinition":
            crds_pending.append(obj["metadata"]["name"])
    for name in crds_pending:
        wait_established(dyn, name)
    return applied


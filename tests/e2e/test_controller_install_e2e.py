"""Install and uninstall gpupack from ``manifests/kustomization.yaml`` on the real control plane.

The kustomizations of the base install only list resources (the test fails if one
grows patches or generators this renderer does not apply, or names a file outside
its directory, which kustomize's load restrictor refuses), so rendering is reading
them in order; the real kustomize (``tools/kustomize/build.sh``) must render the same
objects, and renders the overlays (``manifests/hardened``, the agent's operator mode). cert-manager's
Issuer/Certificate are left out: this control plane has no cert-manager.
Uninstall removes the admission webhook configurations first, then the
components, and leaves GPUNodes, SharingPolicies and workload pods alone.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from gpupack.devcluster.apply import apply_objects, gpupack_manifests

ROOT = Path(__file__).resolve().parents[2]
CERT_MANAGER = {"Issuer", "Certificate"}


def render(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - {"apiVersion", "kind", "resources"}
    assert not unsupported, f"{directory}: renderer does not apply {sorted(unsupported)}"
    out: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        if path.is_dir():
            out += render(path)
        else:
            assert directory.resolve() in path.parents, f"{directory}: kustomize refuses files outside it: {entry}"
            out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def _kustomize(kustomize: Path, directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(kustomize), "build", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _keys(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects)


def test_render_lists_every_component_once_as_kustomize_does(kustomize: Path) -> None:
    objects = render(ROOT / "manifests")
    keys = [(o["kind"], (o.get("metadata") or {}).get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "an object is listed twice"
    kinds = {(k, n) for k, _, n in keys}
    for wanted in [("Deployment", "gpupack-controller"), ("Deployment", "gpupack-webhook"),
                   ("DaemonSet", "gpupack-node-agent"), ("MutatingWebhookConfiguration", "gpupack"),
                   ("CustomResourceDefinition", "gpunodes.gpupack.io")]:
        assert wanted in kinds
    real = _kustomize(kustomize, ROOT / "manifests")  # the real kustomize (tools/kustomize/build.sh)
    assert _keys(real) == _keys(objects)


def test_the_overlays_render_with_kustomize(kustomize: Path) -> None:
    base = _keys(_kustomize(kustomize, ROOT / "manifests"))
    hardened = _kustomize(kustomize, ROOT / "manifests" / "hardened")
    assert _keys(hardened) == [k for k in base if k != ("ClusterRoleBinding", "gpupack-node-agent-pods")]
    operator = _kustomize(kustomize, ROOT / "manifests" / "agent-operator-mode")
    agent = next(o for o in operator if o["kind"] == "DaemonSet")
    security = agent["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert security["privileged"] is False and security["runAsUser"] == 65532


def _gpu_operator_namespace(admin_client: Any) -> None:
    """gpupack installs next to the GPU Operator: its namespace exists (the agent's Role lives there)."""
    try:
        client.CoreV1Api(admin_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="gpu-operator")))
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def test_install_applies_and_uninstall_keeps_gpus_and_workloads(admin_client: Any, namespace: str) -> None:
    objects = [o for o in render(ROOT / "manifests") if o["kind"] not in CERT_MANAGER]
    _gpu_operator_namespace(admin_client)
    apply_objects(admin_client, objects, field_manager="gpupack-install-e2e")
    apps = client.AppsV1Api(admin_client)
    assert apps.read_namespaced_deployment("gpupack-controller", "gpupack-system").spec.replicas == 2
    assert apps.read_namespaced_daemon_set("gpupack-node-agent", "gpupack-system")
    # State the uninstall must keep: a GPUNode with a layout, and a workload pod.
    custom, core = client.CustomObjectsApi(admin_client), client.CoreV1Api(admin_client)
    name = f"install-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", {
        "apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": name},
        "spec": {"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "3g.40gb"}]}]}})
    workload: Any = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "workload", "labels": {"gpupack.io/skip": "true"}},
                     "spec": {"containers": [{"name": "c", "image": "example.com/app:1"}]}}
    core.create_namespaced_pod(namespace, workload)
    # Uninstall, in the documented order: admission first, then the components.
    dyn = DynamicClient(admin_client)
    order = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Deployment", "DaemonSet", "Service",
             "PodDisruptionBudget", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"]
    for kind in order:
        for obj in (o for o in objects if o["kind"] == kind):
            api = dyn.resources.get(api_version=obj["apiVersion"], kind=kind)
            meta = obj["metadata"]
            api.delete(name=meta["name"], namespace=meta.get("namespace"))
    with pytest.raises(client.ApiException):
        apps.read_namespaced_deployment("gpupack-controller", "gpupack-system")
    kept = custom.get_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", name)
    assert kept["spec"]["gpus"][0]["layout"] == [{"profile": "3g.40gb"}]
    assert core.read_namespaced_pod("workload", namespace).metadata.name == "workload"
    custom.delete_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", name)
    # Leave the shared control plane as later modules expect it: the uninstall also removed the
    # admission policies of manifests/rbac that the session's gpupack_installed put there.
    apply_objects(admin_client, [o for o in gpupack_manifests() if o["kind"] in order], field_manager="gpupack-e2e")


def test_helm_rendering_applies_with_values(admin_client: Any, helm: Path) -> None:
    """The chart's output with values set (real helm, tools/helm/build.sh) is accepted by the shared control
    plane next to everything else the tests installed (test_helm_chart.py installs it with helm itself)."""
    out = subprocess.run(
        [str(helm), "template", "gpupack", str(ROOT / "manifests" / "helm" / "gpupack"), "--namespace", "gpupack-system",
         "--kube-version", "1.37.2", "--set", "controller.replicas=3", "--set", "webhook.certManager=false",
         "--set", "controller.batchSeconds=1.5"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert not [o for o in objects if o["kind"] in CERT_MANAGER]  # certManager=false drops them
    _gpu_operator_namespace(admin_client)
    dyn = DynamicClient(admin_client)

    def api(obj: dict[str, Any]) -> Any:
        return dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    def exists(obj: dict[str, Any]) -> bool:
        try:
            api(obj).get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
        except NotFoundError:
            return False
        return True

    # What this test adds, it removes: the admission policies and the Service would change
    # what later tests on the shared control plane see.
    added = [o for o in objects if not exists(o)]
    try:
        apply_objects(admin_client, objects, field_manager="gpupack-helm-e2e")
        deployment = client.AppsV1Api(admin_client).read_namespaced_deployment("gpupack-controller", "gpupack-system")
        assert deployment.spec.replicas == 3
        env = {e.name: e.value for e in deployment.spec.template.spec.containers[0].env}
        assert env["GPUPACK_CONTROLLER_BATCH_SECONDS"] == "1.5"
    finally:
        for obj in reversed(added):
            api(obj).delete(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))

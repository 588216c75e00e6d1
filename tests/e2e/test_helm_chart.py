"""The Helm chart, with real Helm (tools/helm/build.sh) on a real control plane.

``helm lint``; ``helm template`` against the kustomize objects; ``helm install``,
``helm upgrade`` (changed values take effect, a switched-off object goes) and
``helm uninstall`` (nothing left but what docs/controller.md says stays: the CRDs,
with every GPUNode and SharingPolicy, and the namespace Helm created). The install
runs on a control plane of its own: the shared one already holds gpupack's objects,
which Helm would refuse to adopt. No kubelets run here, so the workloads' pods are
not started; what is checked is what the API server accepted and keeps.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from gpupack.devcluster.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "gpupack"
NS = "gpupack-system"
INSTALL = ["--namespace", NS, "--create-namespace", "--set", "createNamespace=false", "--set", "webhook.certManager=false"]


def _helm(helm: Path, *args: str, kubeconfig: Path | None = None, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=180, env=env)


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _spaced(value: Any) -> Any:
    """``value`` with every run of whitespace in its strings made one space: kustomize re-writes
    folded YAML scalars (the policies' CEL) with extra line breaks, which CEL ignores."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [_spaced(v) for v in value]
    if isinstance(value, dict):
        return {k: _spaced(v) for k, v in value.items()}
    return value


def test_helm_lint_is_clean(helm: Path, tmp_path: Path) -> None:
    for values in ([], ["--set", "webhook.certManager=false", "--set", "agent.podReadsByAuthorizer=true"],
                   ["--set", "prometheusRules.enabled=true", "--set", "prometheusRules.labels.release=kps"],
                   ["--set", "controller.evictOnGpuFault=true", "--set", "agent.unhealthyTaintEffect=NoExecute"],
                   ["--set", "dra.enabled=true", "--set", "agent.enabled=false",
                    "--set", "dra.shareMode=time-slicing"]):
        out = _helm(helm, "lint", "--strict", str(CHART), *values, home=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 chart(s) failed" in out.stdout


def _kustomize(kustomize: Path, directory: Path) -> list[dict[str, Any]]:
    """The real kustomize's objects (tools/kustomize/build.sh)."""
    built = subprocess.run([str(kustomize), "build", str(directory)], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    return _objects(built.stdout)


def _with_component(kustomize: Path, tmp_path: Path, component: str, *,
                    kind: str = "components") -> list[dict[str, Any]]:
    """The default install with ``manifests/<component>``, as an admin's own kustomization lists it: a kustomize
    Component under ``components``, or a kustomization of its own under ``resources`` (kustomize wants relative
    paths; directories may be anywhere)."""
    directory = tmp_path / f"kustomization-{uuid.uuid4().hex[:6]}"
    directory.mkdir()
    lists: dict[str, list[str]] = {"resources": [os.path.relpath(ROOT / "manifests", directory)]}
    lists.setdefault(kind, []).append(os.path.relpath(ROOT / "manifests" / component, directory))
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **lists}))
    return _kustomize(kustomize, directory)


def _controller_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    controller = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupack-controller")
    return {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}


def _assert_same_objects(objects: list[dict[str, Any]], source_objects: list[dict[str, Any]]) -> None:
    """Helm's ``objects`` are kustomize's ``source_objects`` (CRDs aside: the chart's crds/ are not
    templates): the same names, and the same content where no value applies (permissions and
    admission policies)."""
    expected = sorted((o["kind"], o["metadata"]["name"]) for o in source_objects
                      if o["kind"] != "CustomResourceDefinition")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == expected
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in source_objects}
    compared = 0
    for obj in objects:
        source = by_key[(obj["kind"], obj["metadata"]["name"])]
        fields = {"ClusterRole": ("rules",), "Role": ("rules",), "ClusterRoleBinding": ("roleRef", "subjects"),
                  "RoleBinding": ("roleRef", "subjects"), "ValidatingAdmissionPolicy": ("spec",),
                  "ValidatingAdmissionPolicyBinding": ("spec",)}.get(obj["kind"], ())
        for field in fields:
            assert _spaced(obj.get(field)) == _spaced(source.get(field)), (obj["kind"], obj["metadata"]["name"], field)
            compared += 1
    assert compared > 10


def test_helm_template_renders_the_same_objects_as_kustomize(helm: Path, kustomize: Path, tmp_path: Path) -> None:
    out = _helm(helm, "template", "gpupack", str(CHART), "--namespace", NS, "--kube-version", "1.37.2", home=tmp_path)
    assert out.returncode == 0, out.stderr
    objects = _objects(out.stdout)
    _assert_same_objects(objects, _kustomize(kustomize, ROOT / "manifests"))
    env = _controller_env(objects)
    assert env["GPUPACK_CONTROLLER_MIG_MODE_CHANGES"] == "false" and env["GPUPACK_CONTROLLER_BATCH_SECONDS"] == "0.5"
    assert env["GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT"] == "false"
    agent = next(o for o in objects if o["kind"] == "DaemonSet")
    agent_env = {e["name"]: e for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert agent_env["GPUPACK_AGENT_UNHEALTHY_TAINT_EFFECT"]["value"] == "NoSchedule"
    assert agent_env["GPUPACK_AGENT_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_eviction_opt_in_renders_as_the_kustomize_component(helm: Path, kustomize: Path, tmp_path: Path) -> None:
    """controller.evictOnGpuFault=true is manifests/gpu-fault-evictions: the same RBAC (and nothing
    more) and the same setting; off, neither the grant nor the setting, as in kustomize's default build."""
    base = ["template", "gpupack", str(CHART), "--namespace", NS, "--kube-version", "1.37.2"]
    on = _helm(helm, *base, "--set", "controller.evictOnGpuFault=true", home=tmp_path)
    assert on.returncode == 0, on.stderr
    objects = _objects(on.stdout)
    source_objects = _with_component(kustomize, tmp_path, "gpu-fault-evictions")
    _assert_same_objects(objects, source_objects)
    evictions = [("ClusterRole", "gpupack-controller-evictions"), ("ClusterRoleBinding", "gpupack-controller-evictions")]
    default = _kustomize(kustomize, ROOT / "manifests")
    added = sorted(set((o["kind"], o["metadata"]["name"]) for o in source_objects)
                   - set((o["kind"], o["metadata"]["name"]) for o in default))
    assert added == evictions
    assert _controller_env(objects)["GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT"] == "true"
    assert _controller_env(source_objects)["GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT"] == "true"
    assert _controller_env(default)["GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT"] == "false"
    off = _objects(_helm(helm, *base, home=tmp_path).stdout)
    assert not [o for o in off if (o["kind"], o["metadata"]["name"]) in evictions]
    # The Component adds to the hardened install as well (that is why it is not an overlay).
    hardened = tmp_path / "hardened"
    hardened.mkdir()
    (hardened / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(ROOT / "manifests" / "hardened", hardened)],
        "components": [os.path.relpath(ROOT / "manifests" / "gpu-fault-evictions", hardened)]}))
    both = _kustomize(kustomize, hardened)
    keys = {(o["kind"], o["metadata"]["name"]) for o in both}
    assert set(evictions) <= keys and ("ClusterRoleBinding", "gpupack-node-agent-pods") not in keys
    assert _controller_env(both)["GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT"] == "true"


def test_recreate_grant_renders_as_the_kustomize_component(helm: Path, kustomize: Path, tmp_path: Path) -> None:
    """controller.rightSizingRecreate=true is manifests/right-sizing-recreate: the same RBAC and policy on
    Deployment writes, and nothing more; off, none of it, as in kustomize's default build."""
    base = ["template", "gpupack", str(CHART), "--namespace", NS, "--kube-version", "1.37.2"]
    on = _helm(helm, *base, "--set", "controller.rightSizingRecreate=true", home=tmp_path)
    assert on.returncode == 0, on.stderr
    objects = _objects(on.stdout)
    source_objects = _with_component(kustomize, tmp_path, "right-sizing-recreate")
    _assert_same_objects(objects, source_objects)
    grant = [("ClusterRole", "gpupack-controller-right-sizing-recreate"),
             ("ClusterRoleBinding", "gpupack-controller-right-sizing-recreate"),
             ("ValidatingAdmissionPolicy", "gpupack-controller-deployment-writes"),
             ("ValidatingAdmissionPolicyBinding", "gpupack-controller-deployment-writes")]
    default = _kustomize(kustomize, ROOT / "manifests")
    added = sorted(set((o["kind"], o["metadata"]["name"]) for o in source_objects)
                   - set((o["kind"], o["metadata"]["name"]) for o in default))
    assert added == sorted(grant)
    off = _objects(_helm(helm, *base, home=tmp_path).stdout)
    assert not [o for o in off if (o["kind"], o["metadata"]["name"]) in grant]


def test_dra_pool_renders_only_when_enabled_and_as_kustomize_builds_it(helm: Path, kustomize: Path,
                                                                      tmp_path: Path) -> None:
    """dra.enabled=true is manifests/agent-dra on top of the default install: the same objects (the plugin's
    RBAC compared field by field) and values reaching its containers; off, none of them, while the DeviceClasses
    are in both default builds. A DRA-only install (agent.enabled=false) keeps the node agent's own-node
    policies, which confine the DRA agent's ResourceSlice writes."""
    base = ["template", "gpupack", str(CHART), "--namespace", NS, "--kube-version", "1.37.2"]
    on = _helm(helm, *base, "--set", "dra.enabled=true", "--set", "dra.shareMode=time-slicing",
               "--set", "agent.idleSeconds=120", home=tmp_path)
    assert on.returncode == 0, on.stderr
    objects = _objects(on.stdout)
    source_objects = _with_component(kustomize, tmp_path, "agent-dra", kind="resources")
    _assert_same_objects(objects, source_objects)
    default = _kustomize(kustomize, ROOT / "manifests")
    added = sorted(set((o["kind"], o["metadata"]["name"]) for o in source_objects)
                   - set((o["kind"], o["metadata"]["name"]) for o in default))
    pool = [("ClusterRole", "gpupack-dra-plugin"), ("ClusterRoleBinding", "gpupack-dra-plugin"),
            ("DaemonSet", "gpupack-node-agent-dra")]
    assert added == pool
    daemonset = next(o for o in objects
                     if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "gpupack-node-agent-dra")
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}
    assert containers["agent"]["args"] == ["agent", "run", "--backend", "dra"]
    env = {name: {e["name"]: e.get("value") for e in c["env"]} for name, c in containers.items()}
    assert env["agent"]["GPUPACK_AGENT_IDLE_SECONDS"] == "120"
    assert env["dra-plugin"]["GPUPACK_DRA_SHARE_MODE"] == "time-slicing"
    off = _objects(_helm(helm, *base, home=tmp_path).stdout)
    assert not [o for o in off if (o["kind"], o["metadata"]["name"]) in pool]
    classes = sorted(o["metadata"]["name"] for o in off if o["kind"] == "DeviceClass")
    assert classes == sorted(o["metadata"]["name"] for o in default if o["kind"] == "DeviceClass") and len(classes) == 3
    only = _objects(_helm(helm, *base, "--set", "dra.enabled=true", "--set", "agent.enabled=false",
                          home=tmp_path).stdout)
    keys = {(o["kind"], o["metadata"]["name"]) for o in only}
    assert ("DaemonSet", "gpupack-node-agent") not in keys and set(pool) <= keys
    assert ("ValidatingAdmissionPolicy", "gpupack-node-agent-own-slices") in keys
    assert ("ValidatingAdmissionPolicyBinding", "gpupack-node-agent-own-slices") in keys


def test_alert_rules_render_only_when_enabled_and_as_kustomize_builds_them(helm: Path, kustomize: Path,
                                                                         tmp_path: Path) -> None:
    """The optional PrometheusRule (manifests/prometheus-rules): off by default, as in kustomize's default
    build; on, the same rules (Prometheus's {{ $labels }} templates kept, not evaluated by Helm)."""
    base = ["template", "gpupack", str(CHART), "--namespace", NS, "--kube-version", "1.37.2"]
    off = _helm(helm, *base, home=tmp_path)
    assert off.returncode == 0, off.stderr
    assert not [o for o in _objects(off.stdout) if o["kind"] == "PrometheusRule"]
    on = _helm(helm, *base, "--set", "prometheusRules.enabled=true", "--set", "prometheusRules.labels.release=kps",
               home=tmp_path)
    assert on.returncode == 0, on.stderr
    (rule,) = [o for o in _objects(on.stdout) if o["kind"] == "PrometheusRule"]
    (source,) = _kustomize(kustomize, ROOT / "manifests" / "prometheus-rules")
    assert rule["spec"] == source["spec"] and rule["metadata"]["name"] == source["metadata"]["name"]
    assert rule["metadata"]["labels"] == {**source["metadata"]["labels"], "release": "kps"}
    assert "{{ $labels.gpu }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]
    default = subprocess.run([str(kustomize), "build", str(ROOT / "manifests")], capture_output=True, text=True,
                             timeout=120)
    assert default.returncode == 0 and "PrometheusRule" not in default.stdout


def _documented_overlay() -> str:
    """The kustomize overlay docs/webhook.md gives for apiServerCIDR, as written there."""
    text = (ROOT / "docs" / "webhook.md").read_text()
    after = text.split("<!-- apiServerCIDR overlay -->", 1)[1]
    return after.split("```yaml\n", 1)[1].split("```", 1)[0]


def _webhook_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "gpupack-webhook")


def test_api_server_cidr_restricts_the_webhook_policy_in_helm_and_in_the_documented_overlay(
        helm: Path, kustomize: Path, tmp_path: Path) -> None:
    """With apiServerCIDR set, the webhook's port admits that CIDR and nothing else; the default admits any source."""
    cidr = "10.0.0.0/24"  # the value the documented overlay carries
    base = ["template", "gpupack", str(CHART), "--namespace", NS, "--kube-version", "1.37.2"]
    out = _helm(helm, *base, "--set", f"webhook.apiServerCIDR={cidr}", home=tmp_path)
    assert out.returncode == 0, out.stderr
    policy = _webhook_policy(_objects(out.stdout))
    assert policy["spec"]["ingress"] == [{"from": [{"ipBlock": {"cidr": cidr}}],
                                          "ports": [{"protocol": "TCP", "port": 8443}]}]
    assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": cidr}}]
    default = _webhook_policy(_objects(_helm(helm, *base, home=tmp_path).stdout))
    assert default["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    text = _documented_overlay().replace("../gpupack/manifests", os.path.relpath(ROOT / "manifests", overlay))
    (overlay / "kustomization.yaml").write_text(text)
    built = _webhook_policy(_kustomize(kustomize, overlay))
    assert built["spec"] == policy["spec"]


@pytest.fixture(scope="module")
def plane(private_control_plane: ControlPlane) -> ControlPlane:
    return private_control_plane


def test_install_upgrade_uninstall(helm: Path, plane: ControlPlane, tmp_path: Path) -> None:
    admin = plane.admin_client()
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="gpu-operator")))
    kube = plane.kubeconfig

    out = _helm(helm, "install", "gpupack", str(CHART), *INSTALL, kubeconfig=kube, home=tmp_path)
    assert out.returncode == 0, out.stderr
    rendered = _objects(_helm(helm, "get", "manifest", "gpupack", "--namespace", NS, kubeconfig=kube,
                              home=tmp_path).stdout)
    dyn = DynamicClient(admin)

    def exists(obj: dict[str, Any]) -> bool:
        api = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        try:
            api.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
        except NotFoundError:
            return False
        return True

    assert rendered and all(exists(o) for o in rendered), [o["metadata"]["name"] for o in rendered if not exists(o)]
    kinds = {o["kind"] for o in rendered}
    assert {"Deployment", "DaemonSet", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
            "DeviceClass"} <= kinds
    crds = client.ApiextensionsV1Api(admin)
    assert crds.read_custom_resource_definition("gpunodes.gpupack.io").spec.group == "gpupack.io"
    assert apps.read_namespaced_deployment("gpupack-controller", NS).spec.replicas == 2
    pods_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": "gpupack-node-agent-pods"}}
    assert exists(pods_binding)
    evictions_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                         "metadata": {"name": "gpupack-controller-evictions"}}
    assert not exists(evictions_binding)
    # The API server serves resource.k8s.io/v1, so Helm's capabilities install the DeviceClasses.
    assert exists({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpupack-mig"}})
    dra_pool = {"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "gpupack-node-agent-dra", "namespace": NS}}
    assert not exists(dra_pool)

    # Upgrade: changed values reach the objects; a value that switches an object off removes it.
    out = _helm(helm, "upgrade", "gpupack", str(CHART), *INSTALL[:2], "--reuse-values",
                "--set", "controller.batchSeconds=2", "--set", "webhook.replicas=3",
                "--set", "agent.podReadsByAuthorizer=true", "--set", "controller.evictOnGpuFault=true",
                "--set", "dra.enabled=true", "--set", "webhook.apiServerCIDR=127.0.0.1/32", kubeconfig=kube,
                home=tmp_path)
    assert out.returncode == 0, out.stderr
    # The restricted NetworkPolicy is accepted (enforcing it needs a CNI, which this control plane has not).
    webhook_policy = client.NetworkingV1Api(admin).read_namespaced_network_policy("gpupack-webhook", NS)
    assert [peer.ip_block.cidr for rule in webhook_policy.spec.ingress for peer in rule._from] == ["127.0.0.1/32"]
    assert exists(dra_pool)
    controller = apps.read_namespaced_deployment("gpupack-controller", NS)
    env = {e.name: e.value for e in controller.spec.template.spec.containers[0].env}
    assert env["GPUPACK_CONTROLLER_BATCH_SECONDS"] == "2"
    assert env["GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT"] == "true" and exists(evictions_binding)
    assert apps.read_namespaced_deployment("gpupack-webhook", NS).spec.replicas == 3
    assert not exists(pods_binding)
    history = _helm(helm, "history", "gpupack", "--namespace", NS, "-o", "yaml", kubeconfig=kube, home=tmp_path)
    assert [r["revision"] for r in yaml.safe_load(history.stdout)] == [1, 2]

    # Data that must survive an uninstall.
    custom = client.CustomObjectsApi(admin)
    custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", {
        "apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "kept"},
        "spec": {"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "3g.40gb"}]}]}})
    out = _helm(helm, "uninstall", "gpupack", "--namespace", NS, "--wait", kubeconfig=kube, home=tmp_path)
    assert out.returncode == 0, out.stderr
    left = [(o["kind"], o["metadata"]["name"]) for o in rendered if exists(o)]
    assert left == [], f"left behind after helm uninstall: {left}"
    assert not exists(evictions_binding) and not exists(dra_pool)  # switched on by the upgrade, gone with the release
    assert crds.read_custom_resource_definition("gpunodes.gpupack.io")  # crds/ stay, by Helm's design
    assert custom.get_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", "kept")["spec"]["gpus"][0]["layout"] \
        == [{"profile": "3g.40gb"}]
    assert core.read_namespace(NS).metadata.name == NS  # --create-namespace's namespace is not the release's
    admin.close()

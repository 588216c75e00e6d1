"""The controller's and the node agent's manifests: consistent with the code, the RBAC and the MIG catalog.

The RBAC checks here read the YAML; tests/e2e/test_controlplane_rbac.py asks a real
API server's authorizer, and tests/e2e/test_helm_chart.py compares with the real
kustomize's builds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.settings import ENV_PREFIX, ControllerSettings
from mig.catalog import all_models
from node.health.monitor import TAINT_EFFECTS
from node.health.xids import XID_TABLE_CONFIGMAP
from node.base.settings import AgentSettings
from sharing.api.keys import CAPACITY_GATE, RESIZED_AT_ANNOTATION, UNHEALTHY_TAINT

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
EVICTIONS = MANIFESTS / "gpu-fault-evictions"
EVICT_ENV = f"{ENV_PREFIX}EVICT_ON_GPU_FAULT"
AGENT_ENV = "GPUPACK_AGENT_"
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _base_install(directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    """The objects of ``directory``'s kustomization (resources only, as the base install's are)."""
    kustomization = _docs(directory / "kustomization.yaml")[0]
    assert set(kustomization) <= {"apiVersion", "kind", "resources"}, directory
    out: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = directory / entry
        out += _base_install(path) if path.is_dir() else _docs(path)
    return out


def _container(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (workload,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _bound_roles(objects: list[dict[str, Any]], sa: str) -> list[dict[str, Any]]:
    """The Roles and ClusterRoles bound to ServiceAccount gpupack-system/``sa`` in ``objects``."""
    refs = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
            for b in objects if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and {"kind": "ServiceAccount", "name": sa, "namespace": "gpupack-system"} in b["subjects"]}
    return [o for o in objects if o["kind"] in ("Role", "ClusterRole")
            and (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) in refs]


def _grants_eviction(rule: dict[str, Any]) -> bool:
    return bool({"", "*"} & set(rule.get("apiGroups", []))) and bool(
        {"pods/eviction", "pods/*", "*"} & set(rule.get("resources", [])))


def test_scheduler_config_weights_every_gpu_resource_of_the_catalog() -> None:
    config = yaml.safe_load((ROOT / "manifests/scheduler/kube-scheduler-config.yaml").read_text())
    (profile,) = config["profiles"]
    fit = next(p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit")
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    listed = {r["name"] for r in strategy["resources"]}
    catalog = {p.resource_name for m in all_models() for p in m.profiles}
    assert catalog | {"nvidia.com/gpu", "nvidia.com/gpu.shared"} <= listed
    assert {"name": "NodeResourcesBalancedAllocation"} in profile["plugins"]["score"]["disabled"]


def test_deployment_env_names_are_real_settings() -> None:
    deployment = yaml.safe_load((ROOT / "manifests/controller/deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    fields = {f.upper() for f in ControllerSettings.__dataclass_fields__}
    for env in container["env"]:
        assert env["name"].startswith(ENV_PREFIX) and env["name"][len(ENV_PREFIX):] in fields, env["name"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpupack-controller"


def test_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    from prometheus_client import generate_latest

    from controller.metrics import ControllerMetrics

    from node.metrics import AgentMetrics
    from webhook.metrics import Metrics as WebhookMetrics

    metrics = ControllerMetrics()
    exposed = "\n".join(
        generate_latest(registry).decode()
        for registry in (metrics.registry, AgentMetrics().registry, WebhookMetrics().registry)
    )
    # Labelled metrics only show up once a child exists: list their names from the collectors.
    for registry in (metrics.registry, AgentMetrics().registry, WebhookMetrics().registry):
        exposed += "\n" + "\n".join(m.name for m in registry.collect())
    dashboard = json.loads((ROOT / "manifests/grafana/gpupack-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    import re

    for expr in exprs:
        for name in re.findall(r"gpupack_[a-z_]+", expr):
            base = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
            assert base in exposed or name in exposed, f"dashboard uses {name}, which no component exports"


# --------------------------------------------------- evictions from failed GPUs (opt-in)

def test_the_default_install_grants_no_eviction_and_leaves_it_off() -> None:
    """Invariant 4: without the opt-in the controller needs, and has, no pods/eviction."""
    objects = _base_install()
    rules = [r for o in objects if o["kind"] in ("Role", "ClusterRole") for r in o.get("rules", [])]
    assert rules and not [r for r in rules if _grants_eviction(r)]
    env = {e["name"]: e.get("value") for e in _container(objects, "Deployment", "gpupack-controller")["env"]}
    assert env[EVICT_ENV] == "false"
    assert ControllerSettings.from_env({EVICT_ENV: env[EVICT_ENV]}).evict_on_gpu_fault is False
    assert "gpu-fault-evictions" not in MANIFESTS.joinpath("kustomization.yaml").read_text()


def test_the_eviction_component_grants_exactly_eviction_and_turns_it_on() -> None:
    (kustomization,) = _docs(EVICTIONS / "kustomization.yaml")
    assert kustomization["kind"] == "Component" and kustomization["resources"] == ["rbac.yaml"]
    objects = _docs(EVICTIONS / "rbac.yaml")
    assert {o["kind"] for o in objects} == {"ClusterRole", "ClusterRoleBinding"}
    (role,) = _bound_roles(objects, "gpupack-controller")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
    assert len(objects) == 2  # nothing bound to anyone else
    (patch,) = kustomization["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "gpupack-controller"}
    body = yaml.safe_load(patch["patch"])
    assert body["metadata"]["name"] == "gpupack-controller"
    (container,) = body["spec"]["template"]["spec"]["containers"]
    base = _container(_docs(MANIFESTS / "controller" / "deployment.yaml"), "Deployment", "gpupack-controller")
    assert container["name"] == base["name"]  # strategic merge: containers by name, env by name
    assert container["env"] == [{"name": EVICT_ENV, "value": "true"}]
    assert EVICT_ENV in {e["name"] for e in base["env"]}
    assert ControllerSettings.from_env({EVICT_ENV: "true"}).evict_on_gpu_fault is True


def test_the_recreate_component_grants_exactly_eviction_and_reading_recommendations() -> None:
    """Right-sizing's Recreate mode (docs/right-sizing.md): the namespaces' modes are the switch, this
    component the grant; the default install has neither (the test above)."""
    component = MANIFESTS / "right-sizing-recreate"
    (kustomization,) = _docs(component / "kustomization.yaml")
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == ["rbac.yaml", "deployment-policy.yaml"]
    assert "patches" not in kustomization  # no setting to turn on
    objects = _docs(component / "rbac.yaml")
    assert {o["kind"] for o in objects} == {"ClusterRole", "ClusterRoleBinding"} and len(objects) == 2
    (role,) = _bound_roles(objects, "gpupack-controller")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                             {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch"]}]
    assert "right-sizing-recreate" not in MANIFESTS.joinpath("kustomization.yaml").read_text()
    # The Deployment patch is confined to the rollout's annotation (tests/e2e/test_recreate_e2e.py enforces it).
    policy, binding = _docs(component / "deployment-policy.yaml")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["operations"], rule["resources"]) == (["apps"], ["UPDATE"], ["deployments"])
    assert "gpupack-controller" in policy["spec"]["matchConditions"][0]["expression"]
    assert all(RESIZED_AT_ANNOTATION in v["message"] or "labels" in v["message"] for v in policy["spec"]["validations"])


# ------------------------------------------------------------------------ node agent

@pytest.fixture(scope="module")
def agent() -> dict[str, Any]:
    return _container(_docs(MANIFESTS / "agent" / "daemonset.yaml"), "DaemonSet", "gpupack-node-agent")


def test_agent_env_names_are_real_settings(agent: dict[str, Any]) -> None:
    fields = {f.upper() for f in AgentSettings.__dataclass_fields__}
    names = [e["name"] for e in agent["env"] if e["name"].startswith(AGENT_ENV)]
    assert names and all(n[len(AGENT_ENV):] in fields for n in names), names
    env = {e["name"]: e for e in agent["env"]}
    # The XID table is read from the namespace the agent runs in, where its Role is.
    assert env[f"{AGENT_ENV}NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    effect = env[f"{AGENT_ENV}UNHEALTHY_TAINT_EFFECT"]["value"]
    assert effect in TAINT_EFFECTS and effect == AgentSettings().unhealthy_taint_effect


def test_agent_tolerates_its_own_taint_whatever_the_effect() -> None:
    """Else a NoExecute taint evicts the agent, and a NoSchedule one keeps a restarted agent off the
    node: either way nothing is left to see the reset and lift the taint."""
    (daemonset,) = _docs(MANIFESTS / "agent" / "daemonset.yaml")
    tolerations = daemonset["spec"]["template"]["spec"]["tolerations"]
    assert {"key": UNHEALTHY_TAINT, "operator": "Exists"} in tolerations


def test_agent_reads_only_the_xid_table_configmap_in_its_namespace() -> None:
    objects = [o for o in _base_install() if o["kind"] in RBAC_KINDS]
    roles = _bound_roles(objects, "gpupack-node-agent")
    namespace = AgentSettings().namespace
    in_own = [(r["metadata"]["name"], rule) for r in roles for rule in r["rules"]
              if r["kind"] == "ClusterRole" or r["metadata"]["namespace"] == namespace]
    configmaps = [(name, rule) for name, rule in in_own if {"configmaps", "*"} & set(rule["resources"])]
    assert configmaps == [("gpupack-node-agent-xid-table", {
        "apiGroups": [""], "resources": ["configmaps"], "resourceNames": [XID_TABLE_CONFIGMAP], "verbs": ["get"]})]
    (role,) = [r for r in roles if r["metadata"]["name"] == "gpupack-node-agent-xid-table"]
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == namespace


def test_the_controller_deletes_only_pods_still_gated_on_capacity() -> None:
    """Issue 33, item 5: the controller may delete a pod (an auto pod stranded in its recorded mode,
    for its owner to re-create), and the shipped policy confines that to pods still gated, which
    never ran. RBAC alone would let a stolen controller token delete any running pod."""
    objects = _base_install()
    roles = _bound_roles(objects, "gpupack-controller")
    deletes = [r for role in roles for r in role["rules"]
               if "" in r.get("apiGroups", []) and "pods" in r.get("resources", []) and "delete" in r.get("verbs", [])]
    assert deletes, "the controller cannot delete a stranded pod"
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {o["spec"]["policyName"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    policy = policies["gpupack-controller-pod-deletes"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["operations"], rule["resources"]) == (["DELETE"], ["pods"])
    assert "gpupack-controller" in policy["spec"]["matchConditions"][0]["expression"]
    assert any(CAPACITY_GATE in v["expression"] and "oldObject" in v["expression"]
               for v in policy["spec"]["validations"])
    assert bindings["gpupack-controller-pod-deletes"]["spec"]["validationActions"] == ["Deny"]


def test_the_controller_reads_kueues_workloads_and_writes_none() -> None:
    """Issue 36: the HeldByKueue message is Kueue's own verdict, read from the pod's Workload; the
    controller may read Workloads and nothing of Kueue's more."""
    roles = _bound_roles(_base_install(), "gpupack-controller")
    kueue = [r for role in roles for r in role["rules"] if "kueue.x-k8s.io" in r.get("apiGroups", [])]
    assert kueue == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]}]

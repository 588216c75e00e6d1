"""The DRA backend's install: every GPU node runs the agent of its backend and only that one, the DRA
pool's DaemonSet (node agent ``--backend dra`` + kubelet plugin) is wired as the code reads its settings,
its RBAC and the controller's, the validating webhook's claim rules, and the default install's DeviceClasses.

These read the YAML; tests/e2e/test_dra_install.py runs the DaemonSets under the real DaemonSet controller
and the webhook's matchCondition on the real API server, tests/e2e/test_controlplane_rbac.py asks the real
authorizer, and tests/e2e/test_helm_chart.py renders the chart with real Helm."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from controller.state.pods import _terms
from controller.state.snapshot import Pod
from gpupack import cli_agent, cli_draplugin
from node.draplugin.settings import PluginSettings
from node.base.settings import AgentSettings
from sharing.api.backend import node_backend
from sharing.dra import wire
from sharing.api.keys import BACKEND_LABEL, UNHEALTHY_TAINT
from tests.unit.test_controller_manifests import _base_install, _bound_roles, _docs

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
AGENT_DRA = MANIFESTS / "agent-dra"
DAEMONSETS = {"device-plugin": MANIFESTS / "agent" / "daemonset.yaml", "dra": AGENT_DRA / "daemonset.yaml"}
NODE = "gpu-node-7"


def _daemonset(backend: str) -> dict[str, Any]:
    (daemonset,) = _docs(DAEMONSETS[backend])
    assert daemonset["kind"] == "DaemonSet"
    return daemonset


def _pod_spec(backend: str) -> dict[str, Any]:
    return dict(_daemonset(backend)["spec"]["template"]["spec"])


def _containers(backend: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod_spec(backend)["containers"]}


def _literal_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# ----------------------------------------------------------------- which nodes


def _admits(backend: str, labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's required node affinity allows a node with ``labels`` (the controller's
    reading of node affinity, ``controller.state.snapshot.Pod.admits``)."""
    pod = Pod(namespace="gpupack-system", name=backend, mode="whole", created=datetime.now(timezone.utc),
              terms=_terms(_pod_spec(backend)))
    assert pod.terms, f"the {backend} DaemonSet has no required node affinity"
    return pod.admits(labels)


GPU = {"nvidia.com/gpu.present": "true"}
SWITCH = "nvidia.com/gpu.deploy.gpupack-node-agent"


@pytest.mark.parametrize(("labels", "runs"), [
    pytest.param(GPU, {"device-plugin"}, id="gpu-node-unlabelled"),
    pytest.param({**GPU, BACKEND_LABEL: "device-plugin"}, {"device-plugin"}, id="gpu-node-device-plugin"),
    pytest.param({**GPU, BACKEND_LABEL: "dra"}, {"dra"}, id="gpu-node-dra"),
    # A value that names no backend is the default's (sharing.api.backend.node_backend): the device plugin's.
    pytest.param({**GPU, BACKEND_LABEL: "nvidia-dra"}, {"device-plugin"}, id="gpu-node-unknown-backend"),
    pytest.param({BACKEND_LABEL: "dra"}, set(), id="cpu-node-labelled-dra"),
    pytest.param({}, set(), id="cpu-node"),
    pytest.param({**GPU, BACKEND_LABEL: "dra", SWITCH: "false"}, set(), id="dra-node-agent-switched-off"),
    pytest.param({**GPU, SWITCH: "paused-for-mig-change"}, set(), id="device-plugin-node-agent-paused"),
])
def test_every_gpu_node_runs_the_agent_of_its_backend_and_only_that(labels: dict[str, str], runs: set[str]) -> None:
    """A GPU is owned by one backend, never both: the two DaemonSets split the GPU nodes exactly as
    ``sharing.api.backend.node_backend`` reads the label."""
    assert {backend for backend in DAEMONSETS if _admits(backend, labels)} == runs
    if runs:
        assert runs == {node_backend(labels)}


def test_the_dra_pool_tolerates_what_the_device_plugin_agent_tolerates() -> None:
    """The same taints (its own gpupack.io/gpu-unhealthy among them: it must see the GPUs come back)."""
    tolerations = _pod_spec("dra")["tolerations"]
    assert tolerations == _pod_spec("device-plugin")["tolerations"]
    assert {"key": UNHEALTHY_TAINT, "operator": "Exists"} in tolerations


# ---------------------------------------------------------- the two containers


def test_the_agent_container_runs_the_dra_backend_with_real_settings() -> None:
    agent = _containers("dra")["agent"]
    parser = argparse.ArgumentParser()
    cli_agent.register(parser.add_subparsers())
    args = parser.parse_args([*agent["args"], "--node", NODE])
    assert args.backend == "dra"
    env = _literal_env(agent)
    fields = {f.upper() for f in AgentSettings.__dataclass_fields__}
    names = [e["name"] for e in agent["env"] if e["name"].startswith("GPUPACK_AGENT_")]
    assert names and all(n.removeprefix("GPUPACK_AGENT_") in fields for n in names), names
    settings = AgentSettings.from_env(env, backend=args.backend, node_name=NODE)  # validates: dra needs direct
    assert settings.backend == "dra" and settings.mode == "direct" and settings.pause_device_plugin is False
    by_name = {e["name"]: e for e in agent["env"]}
    assert by_name["GPUPACK_AGENT_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "GPUPACK_AGENT_DEVICE_PLUGIN_NAMESPACE" not in by_name  # no device plugin to configure


def _plugin_settings() -> tuple[PluginSettings, dict[str, Any]]:
    plugin = _containers("dra")["dra-plugin"]
    env = {e["name"]: e for e in plugin["env"]}
    # The kubelet expands $(NODE_NAME) from the container's env, which the downward API fills.
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    argv = [NODE if a == "$(NODE_NAME)" else a for a in plugin["args"]]
    parser = argparse.ArgumentParser()
    cli_draplugin.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.dra_plugin_command == "serve" and args.node == NODE
    fields = {f.upper() for f in PluginSettings.__dataclass_fields__}
    names = [n for n in env if n.startswith("GPUPACK_DRA_")]
    assert names and all(n.removeprefix("GPUPACK_DRA_") in fields for n in names), names
    settings = PluginSettings.from_env(_literal_env(plugin), node_name=args.node)
    settings.validate()
    return settings, plugin


def test_the_plugin_container_mounts_every_host_path_it_uses_at_the_same_path() -> None:
    """The kubelet finds the registration socket, dials the DRA socket and the runtime reads the CDI spec on
    the host, and the journal must outlive the container: each under a hostPath mounted at its host path."""
    settings, plugin = _plugin_settings()
    volumes = {v["name"]: v for v in _pod_spec("dra")["volumes"]}
    host_mounts = {Path(m["mountPath"]): Path(volumes[m["name"]]["hostPath"]["path"])
                   for m in plugin["volumeMounts"] if "hostPath" in volumes[m["name"]]}
    assert all(mount == host for mount, host in host_mounts.items()), host_mounts
    assert not [m for m in plugin["volumeMounts"] if m.get("readOnly")]  # it writes sockets, journal, specs
    for path in (settings.registration_socket.parent, settings.plugin_socket.parent, Path(settings.cdi_dir),
                 settings.claims_dir):
        assert any(path == mount or mount in path.parents for mount in host_mounts), f"{path} is not on the host"


def test_the_plugin_has_the_privileges_nvml_mig_management_needs() -> None:
    _settings, plugin = _plugin_settings()
    spec = _pod_spec("dra")
    assert plugin["securityContext"]["privileged"] is True and plugin["securityContext"]["runAsUser"] == 0
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    assert _literal_env(plugin)["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_both_containers_are_the_identity_the_own_slices_policy_confines() -> None:
    """A pod has one ServiceAccount: the agent's, which gpupack-node-agent-own-slices restricts to its own
    node's ResourceSlices (a new identity would escape the policy)."""
    sa = _pod_spec("dra")["serviceAccountName"]
    assert sa == _pod_spec("device-plugin")["serviceAccountName"]
    (policy,) = [o for o in _base_install() if o["kind"] == "ValidatingAdmissionPolicy"
                 and o["metadata"]["name"] == "gpupack-node-agent-own-slices"]
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'system:serviceaccount:gpupack-system:{sa}'" in condition["expression"]
    assert [o for o in _base_install() if o["kind"] == "ValidatingAdmissionPolicyBinding"
            and o["spec"]["policyName"] == "gpupack-node-agent-own-slices"]


# ----------------------------------------------------------------------- RBAC


def _grants(roles: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {verb for role in roles for rule in role["rules"]
            if group in rule["apiGroups"] and resource in rule["resources"] for verb in rule["verbs"]}


def test_the_plugin_may_read_claims_and_only_in_the_opt_in_component() -> None:
    sa = _pod_spec("dra")["serviceAccountName"]
    opt_in = _docs(AGENT_DRA / "rbac.yaml")
    (role,) = _bound_roles(opt_in, sa)
    assert role["rules"] == [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}]
    base = _bound_roles([o for o in _base_install() if o["kind"].endswith(("Role", "RoleBinding"))], sa)
    assert _grants(base, "resource.k8s.io", "resourceclaims") == set()  # not without a DRA pool
    assert _grants(base, "resource.k8s.io", "resourceslices") >= {"list", "watch", "create", "update", "delete"}


def test_the_controller_creates_claims_and_reads_slices_but_never_writes_them() -> None:
    roles = _bound_roles([o for o in _base_install() if o["kind"].endswith(("Role", "RoleBinding"))],
                         "gpupack-controller")
    assert _grants(roles, "resource.k8s.io", "resourceclaims") == {"create", "get", "list", "watch", "delete"}
    assert _grants(roles, "resource.k8s.io", "resourceslices") == {"list", "watch"}


# -------------------------------------------------------------------- webhook


def _validating() -> dict[str, dict[str, Any]]:
    (config,) = _docs(MANIFESTS / "webhook" / "validating.yaml")
    return {hook["name"]: hook for hook in config["webhooks"]}


def test_the_validating_webhook_checks_claims_and_templates_like_policies() -> None:
    hooks = _validating()
    policies = hooks["sharingpolicies.gpupack.io"]
    (claims,) = [h for h in hooks.values() if any("resource.k8s.io" in r["apiGroups"] for r in h["rules"])]
    (rule,) = claims["rules"]
    assert rule["apiVersions"] == ["v1"] and set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert set(rule["resources"]) == {"resourceclaims", "resourceclaimtemplates"}
    assert claims["clientConfig"] == policies["clientConfig"]
    assert claims["clientConfig"]["service"]["path"] == "/validate"
    assert claims["failurePolicy"] == policies["failurePolicy"]


def test_only_claims_naming_gpupacks_device_classes_reach_the_webhook() -> None:
    """The matchCondition lists exactly the shipped DeviceClasses (tests/e2e/test_dra_install.py evaluates the
    conditions on the real API server)."""
    hooks = _validating()
    (claims,) = [h for h in hooks.values() if "resourceclaims" in h["rules"][0]["resources"]]
    conditions = {c["name"]: c["expression"] for c in claims["matchConditions"]}
    assert set(conditions) == {"names-a-gpupack-device-class", "creates-or-changes-the-spec"}
    expression = conditions["names-a-gpupack-device-class"]
    classes = [c["metadata"]["name"] for c in wire.device_classes()]
    listed = "[" + ", ".join(f"'{c}'" for c in classes) + "]"
    assert expression.count(listed) == 2  # exactly's class and a firstAvailable alternative's
    assert "'gpupack-" not in expression.replace(listed, "")


# ---------------------------------------------------------------- kustomize


def test_the_default_install_has_the_device_classes_and_not_the_dra_pool() -> None:
    objects = _base_install()
    assert [o for o in objects if o["kind"] == "DeviceClass"] == wire.device_classes()
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"] == ["gpupack-node-agent"]
    (hardened,) = _docs(MANIFESTS / "hardened" / "kustomization.yaml")
    assert "../dra" in hardened["resources"] and "../agent-dra" not in hardened["resources"]


def test_the_dra_pool_component_lists_every_manifest_of_its_directory() -> None:
    (kustomization,) = _docs(AGENT_DRA / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization["resources"]) == {p.name for p in AGENT_DRA.glob("*.yaml")} - {"kustomization.yaml"}
    assert {o["kind"] for o in _base_install(AGENT_DRA)} == {"DaemonSet", "ClusterRole", "ClusterRoleBinding"}

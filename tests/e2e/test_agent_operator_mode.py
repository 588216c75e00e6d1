"""GPU Operator mode against the real control plane, with the test playing mig-manager.

The agent (``gpupack-node-agent`` ServiceAccount, plus the Role from
manifests/agent/rbac-gpu-operator.yaml) asks for its mig-parted config in its
GPUNode status; the controller (``gpupack-controller`` ServiceAccount, its cycle
run here in a thread) publishes it into the existing ConfigMap without disturbing
other entries; the agent then points ``nvidia.com/mig.config`` at it, waits for
``nvidia.com/mig.config.state``, and writes the device plugin's sharing config
under its node's key. The agent's own token cannot write mig-manager's ConfigMap.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from controller.kube import Kube as ControllerKube
from controller.reconcile import Controller
from controller.settings import ControllerSettings
from mig.migparted import layout_for, parse_config
from node.nvml.simulated import SimulatedNvml
from node.base.settings import AgentSettings
from tests.e2e.test_agent_e2e import RunningAgent, _condition, _gpunode, _wait
from tests.e2e.waiting import repeating

RBAC = Path(__file__).resolve().parents[2] / "manifests" / "agent" / "rbac-gpu-operator.yaml"
OTHER = "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n"


@pytest.fixture
def operator_namespace(admin_client: Any, apply_manifests: Callable[..., list[dict[str, Any]]]) -> str:
    core = client.CoreV1Api(admin_client)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="gpu-operator")))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    apply_manifests(RBAC)
    try:
        core.create_namespaced_config_map("gpu-operator", client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="default-mig-parted-config"), data={"config.yaml": OTHER}))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    return "gpu-operator"


@pytest.fixture
def controller_cycles(operator_namespace: str, sa_kubeconfig: Callable[[str], Path]) -> Iterator[None]:
    """The controller's cycle, every 0.3 s, as its ServiceAccount (scoped to no pods: it only publishes here)."""
    kube = ControllerKube.connect(str(sa_kubeconfig("gpupack-controller")))
    settings = ControllerSettings(namespaces=f"none-{uuid.uuid4().hex[:6]}",
                                  metrics_port=0, mig_parted_namespace=operator_namespace)
    controller = Controller(kube, settings)
    try:
        with repeating(controller.cycle, 0.3):
            yield
    finally:
        kube.close()


def test_the_agents_token_cannot_write_mig_managers_config(
    operator_namespace: str, sa_client: Callable[[str], Any],
) -> None:
    """A node agent could otherwise rewrite any node's entry, and mig-manager would recreate its GPUs' instances."""
    agent = client.CoreV1Api(sa_client("gpupack-node-agent"))
    cm: Any = agent.read_namespaced_config_map("default-mig-parted-config", operator_namespace)  # reading is allowed
    cm.data = {"config.yaml": OTHER.replace("all-disabled", "gpupack-someone-else-g1")}
    with pytest.raises(client.ApiException) as denied:
        agent.replace_namespaced_config_map("default-mig-parted-config", operator_namespace, cm)
    assert denied.value.status == 403
    with pytest.raises(client.ApiException) as denied:
        agent.patch_namespaced_config_map("default-mig-parted-config", operator_namespace, {"data": {"x": "y"}})
    assert denied.value.status == 403


def test_operator_mode_handshake(
    admin_client: Any, operator_namespace: str, agent_kubeconfig: Callable[[str], Path], tmp_path: Path,
    controller_cycles: None,
) -> None:
    core = client.CoreV1Api(admin_client)
    node = f"op-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    settings = AgentSettings(node_name=node, mode="operator", simulate="A100-80GB:2", poll_seconds=0.5,
                             min_patch_seconds=0.2, idle_seconds=0.5, metrics_port=0)
    running = RunningAgent(agent_kubeconfig(node), settings)  # a token bound to a pod on its node
    try:
        _wait("status", lambda: (_gpunode(admin_client, node).get("status") or {}).get("gpus"))
        client.CustomObjectsApi(admin_client).patch_cluster_custom_object(
            "gpupack.io", "v1alpha1", "gpunodes", node, {"spec": {
                "sharing": {"mode": "time-slicing", "replicas": 4},
                "gpus": [{"index": 1, "migEnabled": True, "migConfig": "all-balanced"}]}})
        meta: Any = _wait("nvidia.com/mig.config set", lambda: (m := core.read_node(node).metadata)
                          and (m.labels or {}).get("nvidia.com/mig.config") and m)
        name = meta.labels["nvidia.com/mig.config"]
        cm: Any = core.read_namespaced_config_map("default-mig-parted-config", "gpu-operator")
        config = parse_config(cm.data["config.yaml"])
        assert "all-disabled" in config.mig_configs  # other entries survive the read-modify-write
        entries = config.mig_configs[name]
        assert [e.devices for e in entries] == [(0,), (1,)]
        assert entries[0].mig_devices == {}  # GPU 0 not in the spec: its current (empty) layout
        _wait("LayoutApplied=Reconfiguring", lambda: _condition(
            _gpunode(admin_client, node), "LayoutApplied").get("reason") == "Reconfiguring")

        # Play mig-manager: apply the entry for GPU 1 on the (simulated) hardware, report success.
        sim = running.agent.backend
        assert isinstance(sim, SimulatedNvml)
        from mig.geometry import fits

        placed = fits(sim.model, layout_for(entries, sim.model, 1) or [])
        assert placed is not None
        for inst in placed:
            sim.create_gpu_instance(1, sim.model.profile(inst.profile).profile_id, inst.placement)
        core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}})
        obj = _wait("LayoutApplied=True", lambda: (o := _gpunode(admin_client, node))
                    and _condition(o, "LayoutApplied").get("status") == "True" and o)
        assert obj["status"]["reconfiguration"]["phase"] == "Succeeded"
        assert sorted(i["profile"] for i in obj["status"]["gpus"][1]["instances"]) == sorted(
            ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"])

        # The device plugin's sharing config for this node, selected by label.
        dp: Any = core.read_namespaced_config_map("gpupack-device-plugin-config", "gpu-operator")
        node_meta: Any = core.read_node(node).metadata
        key = node_meta.labels["nvidia.com/device-plugin.config"]
        doc = yaml.safe_load(dp.data[key])
        assert doc["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    finally:
        running.stop()

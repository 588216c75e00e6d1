"""The demo's stack runs with node isolation on (issue 33, item 8, third bullet).

Its agents used to share one ServiceAccount token bound to no pod, so applying the shipped
manifests/agent/node-restriction-policy.yaml would have refused all of them, and nothing in a demo
or e2e run exercised the policy. Now the stack installs the policy and gives each agent a token bound
to a stand-in pod on its node; every GPUNode is still reported by its agent (``Stack.start`` waits
for that), and an agent's token is refused on another node's objects.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpupack.demo.stack import DemoNode, Stack
from kube.errors import KubeError
from node.base.kube import Kube

POLICIES = ("gpupack-node-agent-own-node", "gpupack-node-agent-own-resources", "gpupack-node-agent-own-slices",
            "gpupack-node-agent-own-events")
NODES = (DemoNode("iso-a", "H100-80GB", 1), DemoNode("iso-b", "A100-80GB", 1, sharing="mps", replicas=2))


@pytest.fixture(scope="module")
def stack(control_plane: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A demo stack of two small nodes (``control_plane`` only for the built binaries)."""
    running = Stack(tmp_path_factory.mktemp("demo-isolation"), nodes=NODES)
    try:
        running.start(lambda line: None)
        yield running
    finally:
        running.stop()


def test_the_demo_installs_the_node_restriction_policies(stack: Stack) -> None:
    registration = client.AdmissionregistrationV1Api(stack.admin)
    for name in POLICIES:
        policy: Any = registration.read_validating_admission_policy(name)
        assert policy.spec.match_conditions[0].expression.endswith(":gpupack-node-agent'")
        binding: Any = registration.read_validating_admission_policy_binding(name)
        assert binding.spec.validation_actions == ["Deny"]


def test_each_demo_agent_has_its_own_pod_bound_token_confined_to_its_node(stack: Stack) -> None:
    paths = {node.name: stack.agent_kubeconfig(node.name) for node in NODES}
    assert len(set(paths.values())) == len(NODES)  # one credential per agent, none shared
    agent = Kube.connect(paths["iso-a"])
    probe = {"metadata": {"labels": {"gpupack.io/probe": "1"}}}
    deadline = time.monotonic() + 30
    denied: KubeError | None = None
    while denied is None and time.monotonic() < deadline:  # the API server's policy cache syncs first
        try:
            agent.patch_node("iso-b", probe)
            time.sleep(0.5)
        except KubeError as exc:
            denied = exc
    assert denied is not None, "a demo agent could label another node"
    assert denied.status in (403, 422) and "only change its own Node" in str(denied), denied
    custom = client.CustomObjectsApi(agent.api)
    with pytest.raises(client.ApiException) as status_write:
        custom.patch_cluster_custom_object_status("gpupack.io", "v1alpha1", "gpunodes", "iso-b",
                                                  {"status": {"gpus": []}})
    assert status_write.value.status in (403, 422) and "only change its own" in str(status_write.value.body)
    agent.patch_node("iso-a", probe)  # its own node: allowed
    # The stand-in pods the tokens are bound to are on their nodes, of the agent's ServiceAccount.
    pods: Any = client.CoreV1Api(stack.admin).list_namespaced_pod("gpupack-system")
    stand_ins = {p.spec.node_name: p.spec.service_account_name for p in pods.items
                 if p.metadata.name.startswith("gpupack-node-agent-")}
    assert stand_ins == {"iso-a": "gpupack-node-agent", "iso-b": "gpupack-node-agent"}


def test_no_demo_agent_write_is_refused_by_the_policies(stack: Stack) -> None:
    """Isolation on must not cost the agents anything they do on their own node: none of their writes
    (GPUNode status, Node labels and status, Events) was refused by an admission policy."""
    logs = {node.name: (stack.workdir / "logs" / f"agent-{node.name}.log") for node in NODES}
    assert all(path.exists() for path in logs.values()), logs
    refused = {name: [line for line in path.read_text(errors="replace").splitlines() if "denied request" in line]
               for name, path in logs.items()}
    assert refused == {node.name: [] for node in NODES}

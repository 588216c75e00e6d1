"""The node agent's own-node admission policy (manifests/agent/node-restriction-policy.yaml).

RBAC cannot limit a DaemonSet to its own Node; the policy does, using the node
name that pod-bound ServiceAccount tokens carry. The shipped policy is applied
with its ServiceAccount name swapped for a test-only one (same ClusterRole), so
the other e2e tests' agent identity is untouched.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from gpupack.devcluster.apply import load_manifests
from gpupack.devcluster.controlplane import ControlPlane
from gpupack.devcluster.kubeconfig import kubeconfig_dict, write_kubeconfig
from kube.errors import KubeError
from node.base.kube import Kube
from sharing.dra import names, wire
from sharing.dra.gpu_devices import shared_gpu
from sharing.dra.slices import node_slices
from sharing.api.keys import HOSTNAME_LABEL, UNHEALTHY_TAINT, per_node_name

POLICY = Path(__file__).resolve().parents[2] / "manifests" / "agent" / "node-restriction-policy.yaml"


def _new_node(core: client.CoreV1Api) -> str:
    name = f"vap-{uuid.uuid4().hex[:6]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    return name


def _token(core: client.CoreV1Api, sa: str, bound: client.V1BoundObjectReference | None) -> str:
    response: Any = core.create_namespaced_service_account_token(sa, "gpupack-system", client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=bound)))
    return str(response.status.token)


def _agent_on(control_plane: ControlPlane, core: client.CoreV1Api, sa: str, node: str, tmp_path: Path) -> Kube:
    """The client of an agent pod of ServiceAccount ``sa`` on ``node``, with a token bound to that pod
    (so the API server knows its node, as it does for the DaemonSet's pods)."""
    pod: Any = core.create_namespaced_pod("gpupack-system", client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"agent-{node}"),
        spec=client.V1PodSpec(node_name=node, service_account_name=sa,
                              containers=[client.V1Container(name="agent", image="registry.k8s.io/pause:3.10")])))
    token = _token(core, sa, client.V1BoundObjectReference(
        api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid))
    path = write_kubeconfig(tmp_path / "agent.kubeconfig", kubeconfig_dict(
        control_plane.server, control_plane.ca.cert_pem, f"system:serviceaccount:gpupack-system:{sa}", token=token))
    return Kube.connect(str(path))


def _test_agent(admin_client: Any, apply_manifests: Callable[..., list[dict[str, Any]]], prefix: str,
                *manifests: Path, roles: tuple[str, ...] = ("gpupack-node-agent",)) -> str:
    """A new ServiceAccount bound to the node agent's ClusterRoles ``roles``, with the shipped ``manifests``
    applied under new names and naming it instead of ``gpupack-node-agent``; its name."""
    core = client.CoreV1Api(admin_client)
    sa = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account("gpupack-system", client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=sa)))
    for role in roles:
        client.RbacAuthorizationV1Api(admin_client).create_cluster_role_binding(client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name=f"{sa}-{role}"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace="gpupack-system")]))
    suffix = f"-{sa}"
    docs = [d for d in load_manifests(*manifests) if d["kind"] != "ConfigMap"]
    for doc in docs:
        doc["metadata"]["name"] += suffix
        if doc["kind"] == "ValidatingAdmissionPolicy":
            doc["spec"]["matchConditions"][0]["expression"] = (
                f"request.userInfo.username == 'system:serviceaccount:gpupack-system:{sa}'")
        elif doc["kind"] == "ValidatingAdmissionPolicyBinding":
            doc["spec"]["policyName"] += suffix
        elif doc["kind"] == "RoleBinding":
            doc["roleRef"]["name"] += suffix
            doc["subjects"][0]["name"] = sa
    apply_manifests(*docs)
    return sa


def test_agent_may_change_only_its_own_node(
    control_plane: ControlPlane, admin_client: Any, gpupack_installed: list[dict[str, Any]],
    apply_manifests: Callable[..., list[dict[str, Any]]], tmp_path: Path,
) -> None:
    core = client.CoreV1Api(admin_client)
    sa = _test_agent(admin_client, apply_manifests, "agent-vap", POLICY)

    own, other = _new_node(core), _new_node(core)
    kube = _agent_on(control_plane, core, sa, own, tmp_path)
    label = {"metadata": {"labels": {"gpupack.io/probe": "1"}}}

    # The policy becomes active once the API server's policy cache syncs: wait for the first denial.
    deadline = time.monotonic() + 30
    denied: KubeError | None = None
    while time.monotonic() < deadline and denied is None:
        try:
            kube.patch_node(other, label)
            time.sleep(0.5)
        except KubeError as exc:
            denied = exc
    assert denied is not None, "the agent could label another node"
    assert denied.status in (403, 422) and "only change its own Node" in str(denied)

    kube.patch_node(own, label)  # its own node: allowed
    # The same for the taint it puts on a node whose GPUs all failed (spec.taints: a Node patch too).
    taint = {"spec": {"taints": [{"key": UNHEALTHY_TAINT, "value": "all-gpus", "effect": "NoSchedule"}]}}
    kube.patch_node(own, taint)
    assert [t["key"] for t in kube.get_node(own)["spec"]["taints"]] == [UNHEALTHY_TAINT]
    with pytest.raises(KubeError, match="only change its own Node"):
        kube.patch_node(other, taint)
    assert not kube.get_node(other).get("spec", {}).get("taints")
    kube.create_gpunode(own, None)
    with pytest.raises(KubeError, match="only change its own"):
        kube.create_gpunode(other, None)
    # A token not bound to a pod (no node name) may change nothing.
    unbound = _token(core, sa, None)
    path2 = write_kubeconfig(tmp_path / "unbound.kubeconfig", kubeconfig_dict(
        control_plane.server, control_plane.ca.cert_pem, "unbound", token=unbound))
    with pytest.raises(KubeError, match="only change its own"):
        Kube.connect(str(path2)).patch_node(own, label)


def test_agent_may_touch_only_its_own_nodes_entries_in_the_gpu_operator_namespace(
    control_plane: ControlPlane, admin_client: Any, gpupack_installed: list[dict[str, Any]],
    apply_manifests: Callable[..., list[dict[str, Any]]], tmp_path: Path,
) -> None:
    """An agent used to delete another node's device-plugin pod and set another node's sharing entry."""
    core = client.CoreV1Api(admin_client)
    operator_ns = "gpu-operator"
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=operator_ns)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    sa = _test_agent(admin_client, apply_manifests, "agent-op", POLICY, POLICY.parent / "rbac-gpu-operator.yaml")

    own, other = _new_node(core), _new_node(core)
    config = "gpupack-device-plugin-config"
    try:
        core.create_namespaced_config_map(operator_ns, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=config), data={f"gpupack-{other}": "version: v1\n"}))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_namespaced_config_map(config, operator_ns, {"data": {f"gpupack-{other}": "version: v1\n"}})
    plugin_pods = {}
    for node in (own, other):
        plugin_pods[node] = core.create_namespaced_pod(operator_ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"plugin-{node}", labels={"app": f"plugin-{sa}"}),
            spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="p", image="x")]))).metadata.name
    agent = client.CoreV1Api(_agent_on(control_plane, core, sa, own, tmp_path).api)

    attempts = iter(range(1, 1000))

    def other_entry_refused() -> bool:
        # A new value each time: until the API server's policy cache has the policy, a write may land,
        # and repeating the same value would then be no change at all (which the policy allows).
        value = f"replicas: {100 + next(attempts)}\n"
        try:
            agent.patch_namespaced_config_map(config, operator_ns, {"data": {f"gpupack-{other}": value}})
        except client.ApiException as exc:
            return exc.status in (403, 422) and "only change its own node's entry" in str(exc.body)
        return False

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not other_entry_refused():
        time.sleep(0.5)
    assert other_entry_refused(), "the agent could rewrite another node's device-plugin entry"
    agent.patch_namespaced_config_map(config, operator_ns, {"data": {f"gpupack-{own}": "version: v1\n"}})
    with pytest.raises(client.ApiException, match="only change its own node's entry"):  # nor remove it
        agent.patch_namespaced_config_map(config, operator_ns, {"data": {f"gpupack-{other}": None}})
    with pytest.raises(client.ApiException, match="only delete pods on its own node"):
        agent.delete_namespaced_pod(plugin_pods[other], operator_ns)
    agent.delete_namespaced_pod(plugin_pods[own], operator_ns)  # its own node's device plugin: allowed

    # A node name over 42 characters has a shortened, hashed entry (node.base.operator_mode): still its own.
    long_node = f"vap-{uuid.uuid4().hex}-{'n' * 24}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=long_node)))
    long_agent = client.CoreV1Api(_agent_on(control_plane, core, sa, long_node, tmp_path).api)
    key = per_node_name(long_node)
    assert len(long_node) > 42 and len(key) == 50
    long_agent.patch_namespaced_config_map(config, operator_ns, {"data": {key: "version: v1\n"}})
    with pytest.raises(client.ApiException, match="only change its own node's entry"):
        long_agent.patch_namespaced_config_map(config, operator_ns, {"data": {f"gpupack-{other}": "replicas: 3\n"}})


def _slice(node: str) -> dict[str, Any]:
    """The one ResourceSlice of a node with one shared GPU, as the agent would publish it."""
    (item,) = node_slices(node, [shared_gpu(0, f"GPU-{node}", "NVIDIA-H100-80GB-HBM3", 80 * 2**30, "mps")])
    return dict(wire.slice_json(item))



def _delete_slices(admin: Kube, *nodes: str) -> None:
    """Every slice of gpupack's driver on ``nodes``, deleted as the admin (a test's clean-up)."""
    for node in nodes:
        for item in admin.list_resource_slices(node, names.DRIVER):
            admin.delete_resource_slice(item["metadata"]["name"])

def test_agent_may_publish_only_its_own_nodes_resource_slices(
    control_plane: ControlPlane, admin_client: Any, gpupack_installed: list[dict[str, Any]],
    apply_manifests: Callable[..., list[dict[str, Any]]], tmp_path: Path,
) -> None:
    """manifests/rbac/node-agent-dra.yaml lets the agent write ResourceSlices (cluster-scoped); the
    policy gpupack-node-agent-own-slices keeps it to gpupack's driver on its own node."""
    core = client.CoreV1Api(admin_client)
    sa = _test_agent(admin_client, apply_manifests, "agent-dra", POLICY,
                     roles=("gpupack-node-agent", "gpupack-node-agent-dra"))
    own, other = _new_node(core), _new_node(core)
    admin = Kube(admin_client)
    theirs = admin.create_resource_slice(_slice(other))  # another node's agent published this
    agent = _agent_on(control_plane, core, sa, own, tmp_path)
    raw = client.ResourceV1Api(agent.api)
    try:
        attempts = iter(range(1, 1000))

        def other_node_refused() -> KubeError | None:
            # A new name each time: until the API server's policy cache has the policy, a create may land.
            body = _slice(other)
            body["metadata"]["name"] = f"{other}-probe-{next(attempts)}"
            try:
                agent.create_resource_slice(body)
            except KubeError as exc:
                return exc
            admin.delete_resource_slice(body["metadata"]["name"])
            return None

        deadline = time.monotonic() + 30
        denied = other_node_refused()
        while denied is None and time.monotonic() < deadline:
            time.sleep(0.5)
            denied = other_node_refused()
        assert denied is not None, "the agent could publish a slice for another node"
        assert denied.status == 403 and "only publish ResourceSlices of driver gpu.gpupack.io for its own node" in str(
            denied), denied

        # Its own node's slice: created (201), updated, re-stamped at a new generation, deleted.
        mine = _slice(own)
        created: Any = raw.create_resource_slice(cast(Any, mine), _preload_content=False)
        assert created.status == 201
        stored = agent.list_resource_slices(own, names.DRIVER)
        assert [s["metadata"]["name"] for s in stored] == [mine["metadata"]["name"]]
        mine["metadata"]["resourceVersion"] = stored[0]["metadata"]["resourceVersion"]
        mine["spec"]["pool"]["generation"] = 2
        replaced = agent.replace_resource_slice(mine["metadata"]["name"], mine)
        agent.patch_resource_slice(mine["metadata"]["name"], {
            "metadata": {"resourceVersion": replaced["metadata"]["resourceVersion"]},
            "spec": {"pool": {"generation": 3}}})

        # Another driver's slice on its own node, or any write to another node's slice: refused.
        foreign = _slice(own)
        foreign["metadata"]["name"] = f"{own}-gpu.example.com-000"
        foreign["spec"]["driver"] = "gpu.example.com"
        with pytest.raises(KubeError, match="for its own node") as refused:
            agent.create_resource_slice(foreign)
        assert refused.value.status == 403
        with pytest.raises(KubeError, match="for its own node"):
            agent.patch_resource_slice(theirs["metadata"]["name"], {"spec": {"pool": {"generation": 9}}})
        with pytest.raises(KubeError, match="for its own node"):
            agent.delete_resource_slice(theirs["metadata"]["name"])
        assert admin.list_resource_slices(other, names.DRIVER)[0]["spec"]["pool"]["generation"] == 1
        agent.delete_resource_slice(mine["metadata"]["name"])
        assert agent.list_resource_slices(own, names.DRIVER) == []

        # A token not bound to a pod (no node name) may publish nothing, not even for a node it names.
        unbound = _token(core, sa, None)
        path = write_kubeconfig(tmp_path / "unbound-dra.kubeconfig", kubeconfig_dict(
            control_plane.server, control_plane.ca.cert_pem, "unbound", token=unbound))
        with pytest.raises(KubeError, match="for its own node"):
            Kube.connect(str(path)).create_resource_slice(_slice(own))
    finally:
        _delete_slices(admin, own, other)


def test_agent_may_not_publish_its_slices_in_another_nodes_pool(
    control_plane: ControlPlane, admin_client: Any, gpupack_installed: list[dict[str, Any]],
    apply_manifests: Callable[..., list[dict[str, Any]]], tmp_path: Path,
) -> None:
    """Issue 33, item 4: the policy checked only spec.nodeName, so h100-b's token published a slice with
    ``nodeName: h100-b`` and ``pool.name: a100-a`` copying a100-a's devices; kube-scheduler then allocated
    a100-a's devices to pods running on h100-b. An agent's slices name its own node's pool only."""
    core = client.CoreV1Api(admin_client)
    sa = _test_agent(admin_client, apply_manifests, "agent-pool", POLICY,
                     roles=("gpupack-node-agent", "gpupack-node-agent-dra"))
    own, other = _new_node(core), _new_node(core)
    admin = Kube(admin_client)
    agent = _agent_on(control_plane, core, sa, own, tmp_path)
    attempts = iter(range(1, 1000))

    def forged(name_node: str, pool: str) -> dict[str, Any]:
        """A slice on ``name_node`` (its nodeName) whose pool is ``pool``, with ``pool``'s device names."""
        body = _slice(pool)
        body["metadata"]["name"] = f"{name_node}-pool-probe-{next(attempts)}"
        body["spec"]["nodeName"] = name_node
        return body

    def refused(body: dict[str, Any]) -> KubeError | None:
        try:
            agent.create_resource_slice(body)
        except KubeError as exc:
            return exc
        admin.delete_resource_slice(body["metadata"]["name"])
        return None

    try:
        # Wait for the policy to be active (a plain other-node slice refused), then try the forgery.
        deadline = time.monotonic() + 30
        while refused(forged(other, other)) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        denied = refused(forged(own, other))
        assert denied is not None, "the agent published a slice of its own node in another node's pool"
        assert denied.status == 403 and "in its own pool" in str(denied), denied

        # Its own slice cannot be moved into another pool either (the API server keeps pool.name immutable).
        mine = agent.create_resource_slice(_slice(own))
        name = mine["metadata"]["name"]
        with pytest.raises(KubeError) as moved:
            agent.patch_resource_slice(name, {"spec": {"pool": {"name": other}}})
        assert moved.value.status in (403, 422)
        assert admin.list_resource_slices(own, names.DRIVER)[0]["spec"]["pool"]["name"] == own

        # A slice on its node that already names another pool (written by someone else) it may not
        # update, but it may delete it: that only withdraws the forgery from its own node.
        stray = forged(own, other)
        admin.create_resource_slice(stray)
        with pytest.raises(KubeError, match="in its own pool"):
            agent.patch_resource_slice(stray["metadata"]["name"], {"spec": {"pool": {"generation": 7}}})
        agent.delete_resource_slice(stray["metadata"]["name"])
        assert [s["metadata"]["name"] for s in admin.list_resource_slices(own, names.DRIVER)] == [name]
    finally:
        _delete_slices(admin, own, other)


def test_agent_records_events_only_about_its_own_node_and_keeps_its_hostname_label(
    control_plane: ControlPlane, admin_client: Any, gpupack_installed: list[dict[str, Any]],
    apply_manifests: Callable[..., list[dict[str, Any]]], tmp_path: Path,
) -> None:
    """Siblings of issue 33, item 4 (fields that name a node on every object an agent writes): the agent's
    RBAC lets it create and patch Events in any namespace about anything, and patch its own Node's labels,
    kubernetes.io/hostname (which the controller pins pods by) among them."""
    core = client.CoreV1Api(admin_client)
    sa = _test_agent(admin_client, apply_manifests, "agent-ev", POLICY)
    own, other = _new_node(core), _new_node(core)
    kube = _agent_on(control_plane, core, sa, own, tmp_path)
    gpunode = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode"}

    def refused(involved: dict[str, Any]) -> KubeError | None:
        try:
            kube.event(involved, "Warning", "Probe", "an agent's word about someone else")
        except KubeError as exc:
            return exc
        return None

    deadline = time.monotonic() + 30
    denied = refused({**gpunode, "name": other})
    while denied is None and time.monotonic() < deadline:  # until the API server's policy cache has it
        time.sleep(0.5)
        denied = refused({**gpunode, "name": other})
    assert denied is not None, "the agent recorded an Event on another node's GPUNode"
    assert denied.status == 403 and "only record Events about its own node" in str(denied), denied
    kube.event({**gpunode, "name": own}, "Normal", "Probe", "about itself")  # allowed
    kube.event({"apiVersion": "v1", "kind": "Node", "name": own}, "Normal", "Probe", "about itself")
    assert refused({"apiVersion": "v1", "kind": "Node", "name": other}) is not None
    # A pod's Event (the agent tells a pod on its node its GPU failed) must name the agent's node as its source.
    pod = {"apiVersion": "v1", "kind": "Pod", "name": "tenant-pod", "namespace": "default"}
    assert refused(pod) is not None
    kube.event(pod, "Warning", "GpuFailed", "from its own node", host=own)
    with pytest.raises(KubeError, match="only record Events about its own node"):
        kube.event(pod, "Warning", "GpuFailed", "in another node's name", host=other)

    # events.k8s.io: regarding (and related) must be its own node too (MicroTime wants the microseconds);
    # a patch of another's Event is refused.
    events = client.EventsV1Api(kube.api)
    body: dict[str, Any] = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                            "metadata": {"generateName": "probe-", "namespace": "default"},
                            "eventTime": dt.datetime(2026, 12, 4, 12, 0, 0, 123456, tzinfo=dt.timezone.utc), "reportingController": "gpupack.io/agent",
                            "reportingInstance": own, "action": "Probe", "reason": "Probe", "type": "Normal",
                            "regarding": {"apiVersion": "v1", "kind": "Node", "name": own}}
    events.create_namespaced_event("default", cast(Any, body))
    with pytest.raises(client.ApiException, match="only record Events about its own node"):
        events.create_namespaced_event("default", cast(Any, {
            **body, "related": {"apiVersion": "v1", "kind": "Node", "name": other}}))
    with pytest.raises(client.ApiException, match="only record Events about its own node"):
        events.create_namespaced_event("default", cast(Any, {
            **body, "regarding": {"apiVersion": "v1", "kind": "Node", "name": other}}))
    theirs: Any = core.create_namespaced_event("default", cast(Any, {
        "metadata": {"generateName": "theirs-", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": other}, "reason": "Real", "message": "m",
        "type": "Normal"}))
    with pytest.raises(client.ApiException, match="only record Events about its own node"):
        client.CoreV1Api(kube.api).patch_namespaced_event(theirs.metadata.name, "default", {
            "involvedObject": {"kind": "Node", "name": own}, "message": "rewritten"})

    # Its own Node's labels it may set, but not kubernetes.io/hostname (nor add it where absent).
    kube.patch_node(own, {"metadata": {"labels": {"gpupack.io/probe": "1"}}})
    with pytest.raises(KubeError, match="may not change the kubernetes.io/hostname label") as renamed:
        kube.patch_node(own, {"metadata": {"labels": {HOSTNAME_LABEL: other}}})
    assert renamed.value.status == 403
    core.patch_node(own, {"metadata": {"labels": {HOSTNAME_LABEL: own}}})
    with pytest.raises(KubeError, match="may not change the kubernetes.io/hostname label"):
        kube.patch_node(own, {"metadata": {"labels": {HOSTNAME_LABEL: other}}})
    with pytest.raises(KubeError, match="may not change the kubernetes.io/hostname label"):
        kube.patch_node(own, {"metadata": {"labels": {HOSTNAME_LABEL: None}}})
    kube.patch_node(own, {"metadata": {"labels": {HOSTNAME_LABEL: own}}})  # unchanged: allowed
    assert core.read_node(own).metadata.labels[HOSTNAME_LABEL] == own

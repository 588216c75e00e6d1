"""Each gpupack component's ServiceAccount can do exactly what its RBAC grants (invariant 4).

``EXPECTED`` is the specification, written independently of the YAML. Every
RBAC object in manifests/ (manifests/rbac/ plus what components add in their
own folders, e.g. manifests/agent/) is applied, then the API server's
authorizer is asked (SubjectAccessReview) about every verb on every resource
in ``MATRIX`` and must answer exactly as the table says. A few real requests
made *as* each ServiceAccount then check 200 vs 403 end to end.

Opt-in components (``OPT_IN``: RBAC only some installs choose) are left out of
that install and checked on their own: what each adds, and nothing more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from gpupack.devcluster.apply import MANIFESTS, apply_objects, load_manifests
from gpupack.devcluster.clients import api_client
from sharing.api import crd

NS = "gpupack-system"
OPERATOR_NS = "gpu-operator"  # the GPU Operator's namespace, where the agent has a Role
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
XID_TABLE = "gpupack-xid-table"  # node/health/xids.py XID_TABLE_CONFIGMAP, read by every agent
# manifests/<dir>: components an admin adds on purpose, not part of the default install.
OPT_IN = ("gpu-fault-evictions", "agent-dra", "right-sizing-recreate")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
READ = {"get", "list", "watch"}
WRITE = {"create", "update", "patch"}

# (api group, resource, subresource, namespace or None for cluster scope / all
# namespaces, resource name or "" for any)
MATRIX: tuple[tuple[str, str, str, str | None, str], ...] = tuple((*row, "") for row in (
    ("gpupack.io", "gpunodes", "", None),
    ("gpupack.io", "gpunodes", "status", None),
    ("gpupack.io", "sharingpolicies", "", None),
    ("gpupack.io", "sharingpolicies", "status", None),
    ("gpupack.io", "gpurecommendations", "", "default"),
    ("gpupack.io", "gpurecommendations", "status", "default"),
    ("", "pods", "", "default"),
    ("", "pods", "eviction", "default"),
    ("", "pods", "status", "default"),
    ("", "nodes", "", None),
    ("", "nodes", "status", None),
    ("", "namespaces", "", None),
    ("", "events", "", "default"),
    ("events.k8s.io", "events", "", "default"),
    ("", "configmaps", "", NS),
    ("", "configmaps", "", "default"),
    ("coordination.k8s.io", "leases", "", NS),
    ("coordination.k8s.io", "leases", "", "kube-system"),
    ("", "secrets", "", NS),
    ("", "serviceaccounts", "token", NS),
    ("apiextensions.k8s.io", "customresourcedefinitions", "", None),
    ("apps", "deployments", "", NS),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", None),
    ("rbac.authorization.k8s.io", "clusterroles", "", None),
    ("", "configmaps", "", OPERATOR_NS),
    ("", "pods", "", OPERATOR_NS),
    ("resource.k8s.io", "resourceslices", "", None),
    ("resource.k8s.io", "resourceclaims", "", "default"),
    ("resource.k8s.io", "resourceclaims", "status", "default"),
    ("resource.k8s.io", "resourceclaimtemplates", "", "default"),
    ("resource.k8s.io", "deviceclasses", "", None),
    ("policy", "poddisruptionbudgets", "", "default"),
)) + (
    ("", "configmaps", "", OPERATOR_NS, "gpupack-device-plugin-config"),
    ("", "configmaps", "", OPERATOR_NS, "default-mig-parted-config"),
    ("", "configmaps", "", OPERATOR_NS, "some-other-config"),
    ("", "configmaps", "", NS, XID_TABLE),
    ("", "configmaps", "", NS, "some-other-config"),
)

Key = tuple[str, str, str, str | None, str]
EVENTS: dict[Key, set[str]] = {("", "events", "", "default", ""): {"create", "patch"},
                               ("events.k8s.io", "events", "", "default", ""): {"create", "patch"}}

EXPECTED: dict[str, dict[Key, set[str]]] = {
    "gpupack-webhook": {
        ("gpupack.io", "gpunodes", "", None, ""): READ,
        ("gpupack.io", "sharingpolicies", "", None, ""): READ,
        ("gpupack.io", "gpurecommendations", "", "default", ""): READ,  # the Initial mode sizes pods from them
        ("", "nodes", "", None, ""): READ,
        ("", "namespaces", "", None, ""): READ,
        # the scheduler extender's pod watch (docs/priority.md, "kube-scheduler's pods"): no get
        ("", "pods", "", "default", ""): {"list", "watch"},
        ("", "pods", "", OPERATOR_NS, ""): {"list", "watch"},  # cluster-wide: every namespace's
    },
    "gpupack-controller": {
        ("gpupack.io", "gpunodes", "", None, ""): READ | WRITE,
        ("gpupack.io", "sharingpolicies", "", None, ""): READ | {"patch"},
        ("gpupack.io", "sharingpolicies", "status", None, ""): {"get", "update", "patch"},
        # The recommender: one object per workload, created once, then only its status written.
        ("gpupack.io", "gpurecommendations", "", "default", ""): {"get", "list", "create"},
        ("gpupack.io", "gpurecommendations", "status", "default", ""): {"patch"},
        # delete: stranded auto pods, for their owners to re-create, and preempted gpupack pods (a policy)
        ("", "pods", "", "default", ""): READ | {"update", "patch", "delete"},
        # preemption prefers victims no budget protects (docs/priority.md): read, never written
        ("policy", "poddisruptionbudgets", "", "default", ""): {"list"},
        ("", "pods", "", OPERATOR_NS, ""): READ | {"update", "patch", "delete"},  # cluster-wide; fields: a policy
        ("", "pods", "status", "default", ""): {"patch"},  # the gpupack.io/Placement condition
        ("", "nodes", "", None, ""): READ,
        ("", "namespaces", "", None, ""): READ,
        ("coordination.k8s.io", "leases", "", NS, ""): READ | WRITE,
        ("apiextensions.k8s.io", "customresourcedefinitions", "", None, ""): READ,
        **EVENTS,
        # manifests/agent/rbac-gpu-operator.yaml: the only gpupack writer of mig-manager's config.
        ("", "configmaps", "", OPERATOR_NS, "default-mig-parted-config"): {"get", "update"},
        # DRA node pools: the claims of DRA pods (created once placed, deleted with their pod; not their
        # status, not templates), and the published ResourceSlices, read only.
        ("resource.k8s.io", "resourceclaims", "", "default", ""): {"create", "get", "list", "watch", "delete"},
        ("resource.k8s.io", "resourceslices", "", None, ""): READ - {"get"},
    },
    "gpupack-node-agent": {
        ("gpupack.io", "gpunodes", "", None, ""): READ | {"create"},
        ("gpupack.io", "gpunodes", "status", None, ""): {"get", "update", "patch"},
        ("", "nodes", "", None, ""): READ | {"patch"},
        ("", "nodes", "status", None, ""): {"get", "patch"},
        # manifests/rbac/node-agent-pods.yaml: list only (manifests/hardened replaces it by
        # gpupack's authorizer, which confines it to the agent's own node).
        ("", "pods", "", "default", ""): {"list"},
        **EVENTS,
        # manifests/agent/rbac-policies.yaml: enforces the policies selecting its node.
        ("gpupack.io", "sharingpolicies", "", None, ""): READ,
        # manifests/agent/rbac-gpu-operator.yaml: its entry of the device plugin's ConfigMap,
        # mig-manager's config read-only (the controller publishes what it asks for), and
        # the device-plugin pods it restarts.
        ("", "configmaps", "", OPERATOR_NS, "gpupack-device-plugin-config"): {"get", "update", "patch"},
        ("", "configmaps", "", OPERATOR_NS, "default-mig-parted-config"): {"get"},
        ("", "pods", "", OPERATOR_NS, ""): {"list", "delete"},  # list: cluster-wide
        # manifests/rbac/node-agent-xid-table.yaml: the admin's XID table, by name, read only.
        ("", "configmaps", "", NS, XID_TABLE): {"get"},
        # manifests/rbac/node-agent-dra.yaml: its node's ResourceSlices on a DRA node pool (cluster-scoped;
        # the own-node policy in manifests/agent/node-restriction-policy.yaml narrows the writes), no
        # deletecollection, and nothing of claims or DeviceClasses.
        ("resource.k8s.io", "resourceslices", "", None, ""): READ | WRITE | {"delete"},
    },
}
# No pods/eviction for the controller above: only the opt-in grants it (and only that). The DRA node
# pool's kubelet plugin reads the claims it prepares (it runs as gpupack-node-agent), nothing else.
OPT_IN_EXPECTED: dict[str, dict[Key, set[str]]] = {
    "gpu-fault-evictions": {("", "pods", "eviction", "default", ""): {"create"}},
    "agent-dra": {("resource.k8s.io", "resourceclaims", "", "default", ""): {"get"}},
    # Right-sizing's Recreate: evictions, and Deployment reads and patches (a one-replica rollout; the
    # component's ValidatingAdmissionPolicy confines the patch to one template annotation).
    "right-sizing-recreate": {("", "pods", "eviction", "default", ""): {"create"},
                              ("apps", "deployments", "", NS, ""): {"get", "patch"}},
}
OPT_IN_SUBJECTS = {"gpu-fault-evictions": "gpupack-controller", "agent-dra": "gpupack-node-agent",
                   "right-sizing-recreate": "gpupack-controller"}


def _allowed(admin: Any, sa: str, key: Key, verb: str) -> bool:
    group, resource, sub, namespace, name = key
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{NS}:{sa}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            group=group, resource=resource, subresource=sub or None, verb=verb,
            namespace=namespace, name=name or None),
    ))
    result = client.AuthorizationV1Api(admin).create_subject_access_review(review)
    return bool(result.status.allowed)


@pytest.fixture(scope="module")
def all_rbac(admin_client: Any, gpupack_installed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every RBAC object of the project (Helm chart templates aside: they are not YAML yet; the
    opt-in components aside: ``test_each_opt_in_grants_exactly_its_table``)."""
    files = [p for p in sorted(Path(MANIFESTS).rglob("*.yaml"))
             if not {"helm", *OPT_IN} & set(p.relative_to(MANIFESTS).parts)]
    rbac = [o for f in files for o in load_manifests(f) if o["kind"] in RBAC_KINDS]
    core = client.CoreV1Api(admin_client)
    if OPERATOR_NS not in {n.metadata.name for n in core.list_namespace().items}:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=OPERATOR_NS)))
    return apply_objects(admin_client, rbac, field_manager="gpupack-e2e")


def _differences(admin: Any, sa: str, expected: dict[Key, set[str]] | None = None) -> list[str]:
    wrong = []
    for key in MATRIX:
        granted = (EXPECTED[sa] if expected is None else expected).get(key, set())
        for verb in VERBS:
            if _allowed(admin, sa, key, verb) != (verb in granted):
                where = "/".join(filter(None, key[:3])) + (f"/{key[4]}" if key[4] else "")
                wrong.append(f"{verb} {where} ns={key[3]}: "
                             f"{'allowed' if verb not in granted else 'denied'}")
    return wrong


@pytest.mark.parametrize("sa", sorted(EXPECTED))
def test_authorizer_grants_exactly_the_table(
    admin_client: Any, all_rbac: list[dict[str, Any]], sa: str
) -> None:
    # The authorizer reads RBAC through informers: allow it a moment to catch up.
    deadline = time.monotonic() + 10
    while (wrong := _differences(admin_client, sa)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not wrong, f"{sa} RBAC differs from the spec:\n" + "\n".join(wrong)


@pytest.mark.parametrize("component", OPT_IN)
def test_each_opt_in_grants_exactly_its_table(admin_client: Any, component: str) -> None:
    """The component's RBAC, applied under new names for a test-only account (so the shared control
    plane's ServiceAccounts keep the default install's grants), adds exactly its table."""
    sa = f"opt-in-{uuid.uuid4().hex[:6]}"
    objects = [o for o in load_manifests(Path(MANIFESTS) / component) if o["kind"] in RBAC_KINDS]
    assert objects
    for obj in objects:
        obj["metadata"]["name"] += f"-{sa}"
        if "roleRef" in obj:
            obj["roleRef"]["name"] += f"-{sa}"
            assert [s["name"] for s in obj["subjects"]] == [OPT_IN_SUBJECTS[component]]
            obj["subjects"] = [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
    apply_objects(admin_client, objects, field_manager="gpupack-e2e")
    try:
        deadline = time.monotonic() + 10
        while (wrong := _differences(admin_client, sa, OPT_IN_EXPECTED[component])) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not wrong, f"{component} grants differ from the spec:\n" + "\n".join(wrong)
    finally:  # leave the shared control plane's RBAC as found
        dyn = DynamicClient(admin_client)  # type: ignore[no-untyped-call]
        for obj in objects:
            api = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            meta = obj["metadata"]
            _status_of(lambda: api.delete(name=meta["name"], namespace=meta.get("namespace")))


def _status_of(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_real_requests_as_each_service_account(
    admin_client: Any, sa_client: Any, gpupack_installed: list[dict[str, Any]],
    agent_kubeconfig: Callable[[str], Path],
) -> None:
    name = f"rbac-{uuid.uuid4().hex[:8]}"
    gpunode = crd.to_wire(crd.GPUNode(metadata=crd.ObjectMeta(name=name)))
    objs = {sa: client.CustomObjectsApi(sa_client(sa)) for sa in EXPECTED}
    core = {sa: client.CoreV1Api(sa_client(sa)) for sa in EXPECTED}
    # Node isolation is on (gpupack_installed): the agent acts from a pod on the node its GPUNode names.
    client.CoreV1Api(admin_client).create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    agent = api_client(agent_kubeconfig(name))
    objs["gpupack-node-agent"], core["gpupack-node-agent"] = client.CustomObjectsApi(agent), client.CoreV1Api(agent)
    try:
        _exercise(objs, core, name, gpunode)
        stored = client.CustomObjectsApi(admin_client).get_cluster_custom_object(
            crd.GROUP, crd.VERSION, "gpunodes", name)
    finally:  # leave the shared inventory as found
        _status_of(lambda: client.CustomObjectsApi(admin_client).delete_cluster_custom_object(
            crd.GROUP, crd.VERSION, "gpunodes", name))
        _status_of(lambda: client.CoreV1Api(admin_client).delete_node(name))
        agent.close()
    assert stored["spec"]["sharing"] == SPEC_PATCH["spec"]["sharing"]
    assert stored["status"]["product"] == STATUS_PATCH["status"]["product"]


STATUS_PATCH = {"status": {"product": "NVIDIA-A100-SXM4-80GB"}}
SPEC_PATCH = {"spec": {"sharing": {"mode": "mps", "replicas": 2}}}


def _exercise(objs: dict[str, Any], core: dict[str, Any], name: str,
              gpunode: dict[str, Any]) -> None:
    args = (crd.GROUP, crd.VERSION, "gpunodes")
    status_patch, spec_patch = STATUS_PATCH, SPEC_PATCH

    # The node agent creates its GPUNode and reports status, but cannot set the spec.
    assert _status_of(lambda: objs["gpupack-node-agent"].create_cluster_custom_object(
        *args, gpunode)) == 200
    assert _status_of(lambda: objs["gpupack-node-agent"].patch_cluster_custom_object_status(
        *args, name, status_patch)) == 200
    assert _status_of(lambda: objs["gpupack-node-agent"].patch_cluster_custom_object(
        *args, name, spec_patch)) == 403
    # The controller sets the spec but cannot write status or delete.
    assert _status_of(lambda: objs["gpupack-controller"].patch_cluster_custom_object(
        *args, name, spec_patch)) == 200
    assert _status_of(lambda: objs["gpupack-controller"].patch_cluster_custom_object_status(
        *args, name, status_patch)) == 403
    assert _status_of(lambda: objs["gpupack-controller"].delete_cluster_custom_object(
        *args, name)) == 403
    # The webhook only reads.
    assert _status_of(lambda: objs["gpupack-webhook"].get_cluster_custom_object(
        *args, name)) == 200
    assert _status_of(lambda: objs["gpupack-webhook"].patch_cluster_custom_object(
        *args, name, spec_patch)) == 403
    # Nobody reads Secrets.
    for sa in EXPECTED:
        assert _status_of(lambda: core[sa].list_namespaced_secret(NS)) == 403, sa
    # The agent reads the XID table by name (404 while the admin has none: the built-in table),
    # and no other ConfigMap of gpupack's namespace.
    assert _status_of(lambda: core["gpupack-node-agent"].read_namespaced_config_map(XID_TABLE, NS)) in (200, 404)
    assert _status_of(lambda: core["gpupack-node-agent"].read_namespaced_config_map("kube-root-ca.crt", NS)) == 403
    assert _status_of(lambda: core["gpupack-node-agent"].list_namespaced_config_map(NS)) == 403
    # The node agent reads (and, on a DRA node pool, writes) ResourceSlices, the controller reads them,
    # the webhook not at all.
    resource = {sa: client.ResourceV1Api(core[sa].api_client) for sa in EXPECTED}
    for sa in EXPECTED:
        listed = _status_of(lambda: resource[sa].list_resource_slice(_preload_content=False))
        assert listed == (403 if sa == "gpupack-webhook" else 200), sa
    # The default install's controller evicts nothing (manifests/gpu-fault-evictions is the opt-in).
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="any-pod", namespace="default"))
    assert _status_of(lambda: core["gpupack-controller"].create_namespaced_pod_eviction(
        "any-pod", "default", eviction)) == 403

"""manifests/hardened on a real kube-apiserver: a node agent reads only its own node's pods.

kube-apiserver is started with the shipped ``manifests/hardened/authorization-config.yaml``
(its kubeconfig path pointed at a real ``gpupack webhook serve`` over TLS), gpupack's
RBAC is applied with the binding the hardened overlay deletes deleted, and a node
agent's token bound to a pod on one node lists pods. Its own node's list and watch
are allowed by gpupack's authorizer (the agent's own client call included); every
pod of the cluster or another node's pods are refused by the API server itself
(403), and its own while the webhook is down too (500, the authorizer's error). This test starts its own control plane: the
authorization configuration is a kube-apiserver flag.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpupack.devcluster.apply import apply_objects, gpupack_manifests, node_isolation_manifests
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.kubeconfig import kubeconfig_dict, write_kubeconfig
from gpupack.devcluster.process import free_port
from node.base.kube import Kube as AgentKube
from webhook.certs import make_self_signed

ROOT = Path(__file__).resolve().parents[2]
HARDENED = ROOT / "manifests" / "hardened"
AGENT = "gpupack-node-agent"


def _wait(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - not there yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Hardened:
    def __init__(self, plane: ControlPlane, webhook: list[str], tmp: Path) -> None:
        self.plane, self.webhook_argv, self.tmp = plane, webhook, tmp
        self.admin = plane.admin_client()
        self.core = client.CoreV1Api(self.admin)
        self.webhook: subprocess.Popen[bytes] | None = None

    def start_webhook(self) -> None:
        log = (self.tmp / "webhook.log").open("ab")
        self.webhook = subprocess.Popen(self.webhook_argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def stop_webhook(self) -> None:
        if self.webhook is not None:
            self.webhook.terminate()
            self.webhook.wait(10)
            self.webhook = None

    def agent_on(self, node: str) -> Any:
        """An ApiClient of a node agent pod on ``node`` (token bound to the pod, so it carries the node)."""
        pod: Any = self.core.create_namespaced_pod("gpupack-system", client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"agent-{node}"),
            spec=client.V1PodSpec(node_name=node, service_account_name=AGENT,
                                  containers=[client.V1Container(name="agent", image="registry.k8s.io/pause:3.10")])))
        token: Any = self.core.create_namespaced_service_account_token(AGENT, "gpupack-system",
                                                                      client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600, bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid))))
        path = write_kubeconfig(self.tmp / f"agent-{node}.kubeconfig", kubeconfig_dict(
            self.plane.server, self.plane.ca.cert_pem, f"system:serviceaccount:gpupack-system:{AGENT}",
            token=token.status.token))
        return AgentKube.connect(str(path))


@pytest.fixture(scope="module")
def hardened(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hardened]:
    # ``control_plane`` only for its binaries (built once per session) and the ordering of e2e setup.
    tmp = tmp_path_factory.mktemp("hardened")
    ca, cert, key = make_self_signed(["127.0.0.1", "localhost"])
    (tmp / "tls.crt").write_bytes(cert)
    (tmp / "tls.key").write_bytes(key)
    port = free_port()
    (tmp / "authorizer.kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gpupack",
        "clusters": [{"name": "gpupack", "cluster": {"server": f"https://127.0.0.1:{port}/authorize",
                                                     "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": "kube-apiserver", "user": {}}],
        "contexts": [{"name": "gpupack", "context": {"cluster": "gpupack", "user": "kube-apiserver"}}]}))
    config = yaml.safe_load((HARDENED / "authorization-config.yaml").read_text())
    for authorizer in config["authorizers"]:
        if authorizer["type"] == "Webhook":
            authorizer["webhook"]["connectionInfo"]["kubeConfigFile"] = str(tmp / "authorizer.kubeconfig")
    (tmp / "authorization-config.yaml").write_text(yaml.safe_dump(config))
    plane = ControlPlane(control_plane.binaries, ControlPlaneConfig(
        scheduler=False, authorization_config=tmp / "authorization-config.yaml")).start()
    h = Hardened(plane, [sys.executable, "-m", "gpupack", "webhook", "serve", "--tls-cert", str(tmp / "tls.crt"),
                         "--tls-key", str(tmp / "tls.key"), "--host", "127.0.0.1", "--port", str(port),
                         "--inventory", str(ROOT / "examples" / "inventory.yaml"), "--log-level", "warning"], tmp)
    try:
        apply_objects(h.admin, gpupack_manifests() + node_isolation_manifests(), field_manager="hardened-e2e")
        # What the overlay's patches delete.
        overlay = yaml.safe_load((HARDENED / "kustomization.yaml").read_text())
        deleted = [yaml.safe_load(p["patch"]) for p in overlay["patches"]]
        assert [(d["kind"], d["metadata"]["name"]) for d in deleted] == [("ClusterRoleBinding", "gpupack-node-agent-pods")]
        client.RbacAuthorizationV1Api(h.admin).delete_cluster_role_binding("gpupack-node-agent-pods")
        h.start_webhook()
        yield h
    finally:
        h.stop_webhook()
        h.admin.close()
        plane.stop()


def _node(h: Hardened) -> str:
    name = f"hard-{uuid.uuid4().hex[:6]}"
    h.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    return name


def _status(call: Any) -> int:
    try:
        call()
    except client.ApiException as exc:
        return int(exc.status)
    return 200


def test_an_agent_reads_only_its_own_nodes_pods(hardened: Hardened) -> None:
    mine, other = _node(hardened), _node(hardened)
    agent = hardened.agent_on(mine)
    hardened.agent_on(other)  # a pod on the other node, to be hidden
    core = client.CoreV1Api(agent.api)
    own = f"spec.nodeName={mine}"
    _wait("gpupack's authorizer to answer", lambda: _status(
        lambda: core.list_pod_for_all_namespaces(field_selector=own)) == 200)
    pods = agent.list_node_pods(mine)  # the agent's own call, as every tick makes it
    assert [p["metadata"]["name"] for p in pods] == [f"agent-{mine}"]
    assert _status(lambda: core.list_namespaced_pod("gpupack-system", field_selector=own)) == 200
    assert _status(lambda: core.list_pod_for_all_namespaces(field_selector=own, watch=True, timeout_seconds=1,
                                                           _preload_content=False).release_conn()) == 200
    # Refused by kube-apiserver itself: no RBAC grant, no opinion from gpupack.
    assert _status(lambda: core.list_pod_for_all_namespaces()) == 403
    assert _status(lambda: core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={other}")) == 403
    assert _status(lambda: core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName!={other}")) == 403
    assert _status(lambda: core.read_namespaced_pod(f"agent-{other}", "gpupack-system")) == 403
    # The cluster admin is not affected.
    assert _status(lambda: client.CoreV1Api(hardened.admin).list_pod_for_all_namespaces()) == 200


def test_with_the_webhook_down_the_agent_reads_nothing(hardened: Hardened) -> None:
    node = _node(hardened)
    agent = hardened.agent_on(node)
    core = client.CoreV1Api(agent.api)
    own = f"spec.nodeName={node}"
    _wait("gpupack's authorizer to answer", lambda: _status(
        lambda: core.list_pod_for_all_namespaces(field_selector=own)) == 200)
    hardened.stop_webhook()
    try:
        # kube-apiserver caches an allow for authorizedTTL (30 s); a new selector is a new question.
        other = f"spec.nodeName={node},metadata.namespace=gpupack-system"
        # Refused: kube-apiserver answers 500 (the authorizer's error) while it cannot reach gpupack.
        assert _wait("a refusal", lambda: _status(lambda: core.list_pod_for_all_namespaces(field_selector=other))
                     in (403, 500))
    finally:
        hardened.start_webhook()
    _wait("reads again", lambda: _status(lambda: core.list_pod_for_all_namespaces(field_selector=other)) == 200)

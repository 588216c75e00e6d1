"""Kubernetes API clients for the local control plane (the one place here that imports them).

ServiceAccount identities are real: the admin asks the TokenRequest API for a
short-lived token of ``system:serviceaccount:<namespace>:<name>``, so a client
built from it is authorized by exactly the RBAC bound to that ServiceAccount.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config

TOKEN_SECONDS = 3600


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A fresh ApiClient for ``kubeconfig`` (not the process-wide default)."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def request_token(
    admin: client.ApiClient, namespace: str, name: str, seconds: int = TOKEN_SECONDS,
    pod: tuple[str, str] | None = None,
) -> str:
    """A token of ServiceAccount ``namespace/name`` (which must exist); with ``pod`` (name, uid) bound
    to that Pod of the ServiceAccount: it dies with the pod, and when the pod is bound to a node the
    API server records the node's name in it (user extra ``authentication.kubernetes.io/node-name``)."""
    bound = None if pod is None else client.V1BoundObjectReference(
        api_version="v1", kind="Pod", name=pod[0], uid=pod[1])
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds, bound_object_ref=bound)
    )
    response = client.CoreV1Api(admin).create_namespaced_service_account_token(
        name, namespace, request
    )
    if response.status is None or not response.status.token:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
    token: str = response.status.token
    return token


PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
"""The image of a node's stand-in pod: no kubelet runs it, the image is never pulled."""


def node_pod(admin: client.ApiClient, namespace: str, service_account: str, node: str) -> tuple[str, str]:
    """(name, uid) of the Pod ``<service_account>-<node>`` of ``service_account`` bound to ``node``, created if
    absent: the stand-in for a DaemonSet's pod on that node, so a token bound to it carries the node's name.
    An existing pod of that name on another node or of another ServiceAccount is refused (ValueError)."""
    core = client.CoreV1Api(admin)
    name = f"{service_account}-{node}"
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/name": service_account}),
        spec=client.V1PodSpec(node_name=node, service_account_name=service_account,
                              automount_service_account_token=False,
                              containers=[client.V1Container(name="stand-in", image=PAUSE_IMAGE)]))
    try:
        made = core.create_namespaced_pod(namespace, pod)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        made = core.read_namespaced_pod(name, namespace)
        if made.spec is None or made.spec.node_name != node or made.spec.service_account_name != service_account:
            raise ValueError(f"pod {namespace}/{name} exists but is not {service_account}'s on node {node}") from None
    if made.metadata is None or not made.metadata.name or not made.metadata.uid:
        raise RuntimeError(f"pod {namespace}/{name} came back without a name or uid")
    return made.metadata.name, made.metadata.uid

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
    admin: client.ApiClient, namespace: str, name: str, seconds: int = TOKEN_SECONDS
) -> str:
    """A bound token of ServiceAccount ``namespace/name`` (which must exist)."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
    )
    response = client.CoreV1Api(admin).create_namespaced_service_account_token(
        name, namespace, request
    )
    if response.status is None or not response.status.token:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
    token: str = response.status.token
    return token

"""A hostile tenant for the e2e tests: a namespaced ServiceAccount with only the verbs a test grants it.

The adversarial tests (forged records, claims and annotations) act with the tenant's own token, so
the API server's authorizers and admission policies judge it as they would judge a real team's
workload. One helper makes that account, instead of each test file spelling the same three
objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

TENANT = "tenant"


def tenant_client(admin: Any, namespace: str, sa_kubeconfig: Callable[..., Path], role: str,
                  rules: Sequence[dict[str, Any]], *, edit: bool = False) -> Any:
    """An ApiClient acting as ServiceAccount ``tenant`` of ``namespace``, allowed ``rules`` there through
    Role ``role`` and, with ``edit``, the built-in ClusterRole ``edit`` too (the usual rights of a team).
    The caller closes it."""
    from gpupack.devcluster.clients import api_client

    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    subject = [{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]
    core.create_namespaced_service_account(namespace, {"metadata": {"name": TENANT}})
    rbac.create_namespaced_role(namespace, {"metadata": {"name": role}, "rules": list(rules)})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"{TENANT}-{role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": subject})
    if edit:
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"{TENANT}-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": subject})
    return api_client(sa_kubeconfig(TENANT, namespace))

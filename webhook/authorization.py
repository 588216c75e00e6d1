"""``POST /authorize``: kube-apiserver's authorization webhook for a node agent's pod reads.

A node agent lists the pods on its own node (field selector ``spec.nodeName=<node>``)
to map devices to pods. RBAC grants a list by verb, not by selector, so the grant in
``manifests/rbac/node-agent-pods.yaml`` lets an agent's token list every pod of the
cluster. Since Kubernetes 1.34 the authorizers see a request's field selector
(``AuthorizeWithSelectors``): with ``manifests/hardened`` that grant goes, and
kube-apiserver asks this endpoint instead (a ``Webhook`` authorizer in its
``--authorization-config``), which allows exactly one thing: a list or watch of pods
by the node agents' ServiceAccount whose field selector requires ``spec.nodeName`` to
be the node its token is bound to (the ``authentication.kubernetes.io/node-name``
extra). Every other request gets no opinion (the next authorizer decides).

Every answer is a ``SubjectAccessReview`` with HTTP 200, whatever the input; a body
that is not one is answered ``allowed: false`` with an ``evaluationError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharing.api.keys import NODE_NAME_EXTRA

API_VERSION = "authorization.k8s.io/v1"
NODE_NAME_FIELD = "spec.nodeName"
READ_VERBS = frozenset({"list", "watch"})


def review_access(review: Any, node_agent_user: str) -> dict[str, Any]:
    """The ``SubjectAccessReview`` answering ``review`` (a decoded request body)."""
    if not isinstance(review, Mapping) or review.get("kind") != "SubjectAccessReview" \
            or review.get("apiVersion") != API_VERSION or not isinstance(review.get("spec"), Mapping):
        return _answer(False, "", error=f"expected a {API_VERSION} SubjectAccessReview with a spec")
    allowed, reason = decide(review["spec"], node_agent_user)
    return _answer(allowed, reason)


def decide(spec: Mapping[str, Any], node_agent_user: str) -> tuple[bool, str]:
    """(allowed, reason). Not allowed means no opinion: gpupack never denies outright."""
    if spec.get("user") != node_agent_user:
        return False, f"gpupack decides only for {node_agent_user}"
    attrs = spec.get("resourceAttributes")
    if not isinstance(attrs, Mapping) or attrs.get("group", "") != "" or attrs.get("resource") != "pods" \
            or attrs.get("subresource", "") != "" or attrs.get("verb") not in READ_VERBS:
        return False, "gpupack allows node agents only to list and watch pods"
    node = _bound_node(spec.get("extra"))
    if node is None:
        return False, f"the token is not bound to a node (no {NODE_NAME_EXTRA} extra)"
    selected = _selected_nodes(attrs.get("fieldSelector"))
    if selected != {node}:
        wanted = f"{NODE_NAME_FIELD}={node}"
        return False, f"a node agent may list only its own node's pods (field selector {wanted})"
    return True, f"the pods of node {node}, which the token is bound to"


def _bound_node(extra: Any) -> str | None:
    values = extra.get(NODE_NAME_EXTRA) if isinstance(extra, Mapping) else None
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str) and values[0]:
        return values[0]
    return None


def _selected_nodes(selector: Any) -> set[str] | None:
    """The node names a field selector confines ``spec.nodeName`` to (None: not confined).

    kube-apiserver sends parsed ``requirements``; a client's review may carry a
    ``rawSelector`` instead. Requirements are ANDed, so one that confines the node
    is enough; any other requirements only narrow the list further."""
    if not isinstance(selector, Mapping):
        return None
    requirements = selector.get("requirements")
    if isinstance(requirements, list):
        for requirement in requirements:
            if isinstance(requirement, Mapping) and requirement.get("key") == NODE_NAME_FIELD \
                    and requirement.get("operator") == "In":
                values = requirement.get("values")
                if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
                    return set(values)
        return None
    raw = selector.get("rawSelector")
    if isinstance(raw, str):
        for term in raw.split(","):
            key, sep, value = term.strip().replace("==", "=").partition("=")
            if sep and key == NODE_NAME_FIELD and value:
                return {value}
    return None


def _answer(allowed: bool, reason: str, error: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    if error:
        status["evaluationError"] = error
    return {"apiVersion": API_VERSION, "kind": "SubjectAccessReview", "status": status}

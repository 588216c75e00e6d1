"""RFC 6902 JSON Patch for a decided pod.

:func:`build_patch` turns a :class:`~sharing.admission.decision.PodDecision` into the
operations the API server applies to the pod: rewrite each deciding
container's ``limits``/``requests`` (drop ``gpupack.io/*``, add the device
plugin's resource), add MPS env vars, AND the decision's node affinity into
every existing required term, add the ``gpupack.io/capacity`` scheduling gate,
and record the decision in the ``gpupack.io/allocation`` annotation (and, for a pod
sized from its workload's recommendation, the original request in
``gpupack.io/right-sized-from``).

On the DRA node pool (``PodDecision.backend == "dra"``) the device plugin's
resource and the MPS env are not added: the pod instead references its
ResourceClaim in ``spec.resourceClaims`` as ``gpupack`` and each deciding
container names its request of that claim in ``resources.claims``
(docs/dra-pods.md); affinity, gate and annotation are as on the device
plugin's pool.

Each operation targets the smallest path that exists, so nothing else in the
pod is touched, and works whether annotations/env/affinity are absent or
present. Keys with ``/`` or ``~`` are escaped (``~1``, ``~0``) as RFC 6901 says.

:func:`apply_patch` is a small applier for the operations built here (add,
replace, remove), used by the CLI's dry run and by the tests to check that a
patched pod keeps every field it had.
"""

from __future__ import annotations

import copy
from typing import Any

from sharing.api.allocation import has_capacity_gate
from sharing.api.backend import POD_CLAIM
from sharing.admission.decision import PodDecision, Term
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE, OWN_PREFIX, RIGHT_SIZED_ANNOTATION
from sharing.api.right_sized import RightSizedFrom

Operation = dict[str, Any]


def escape(token: str) -> str:
    """One RFC 6901 reference token: ``~`` -> ``~0`` then ``/`` -> ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _map(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _resources_ops(container: dict[str, Any], base: str, resource: str | None) -> list[Operation]:
    """Drop the ``gpupack.io/*`` requests and limits (no node advertises them) and ask for
    ``resource`` instead (None: nothing instead, a claim serves the container)."""
    ops: list[Operation] = []
    resources = _map(container.get("resources")) or {}
    for field in ("limits", "requests"):
        current = _map(resources.get(field))
        if current is None:
            continue  # absent requests default to limits for extended resources
        updated = {k: v for k, v in current.items() if not k.startswith(OWN_PREFIX)}
        if resource is not None:
            updated[resource] = "1"
        elif updated == current:
            continue
        ops.append({"op": "replace", "path": f"{base}/resources/{field}", "value": updated})
    return ops


def _env_ops(container: dict[str, Any], base: str, env: tuple[tuple[str, str], ...]) -> list[Operation]:
    if not env:
        return []
    current = container.get("env")
    if not isinstance(current, list):
        return [{"op": "add", "path": f"{base}/env", "value": [{"name": k, "value": v} for k, v in env]}]
    ops: list[Operation] = []
    positions = {e.get("name"): i for i, e in enumerate(current) if isinstance(e, dict)}
    for name, value in env:
        at = positions.get(name)
        if at is None:
            ops.append({"op": "add", "path": f"{base}/env/-", "value": {"name": name, "value": value}})
        elif current[at] != {"name": name, "value": value}:
            ops.append({"op": "replace", "path": f"{base}/env/{at}", "value": {"name": name, "value": value}})
    return ops


def _append_ops(owner: dict[str, Any], path: str, field: str, entry: dict[str, str]) -> list[Operation]:
    """Add ``entry`` to the list ``owner[field]`` at ``path``, creating the list when absent."""
    current = owner.get(field)
    if not isinstance(current, list):
        return [{"op": "add", "path": f"{path}/{field}", "value": [entry]}]
    if entry in current:
        return []
    return [{"op": "add", "path": f"{path}/{field}/-", "value": entry}]


def _claim_ops(container: dict[str, Any], base: str, request: str) -> list[Operation]:
    """The container uses ``request`` of the pod's claim ``gpupack``."""
    resources = _map(container.get("resources"))
    if resources is None:
        return [{"op": "add", "path": f"{base}/resources", "value": {"claims": [{"name": POD_CLAIM, "request": request}]}}]
    return _append_ops(resources, f"{base}/resources", "claims", {"name": POD_CLAIM, "request": request})


def _pod_claim_ops(spec: dict[str, Any], claim: str | None) -> list[Operation]:
    if not claim:
        raise ValueError("a DRA decision names the ResourceClaim its pod references (PodDecision.claim)")
    return _append_ops(spec, "/spec", "resourceClaims", {"name": POD_CLAIM, "resourceClaimName": claim})


def merge_terms(existing: list[Any], ours: tuple[Term, ...]) -> list[dict[str, Any]]:
    """AND our terms into the pod's required terms: (u1 or u2) and (o1 or o2)
    becomes u1&o1, u1&o2, u2&o1, u2&o2, the only form nodeSelectorTerms can say."""
    user_terms = [t for t in existing if isinstance(t, dict)] or [{}]
    merged: list[dict[str, Any]] = []
    for user in user_terms:
        for term in ours:
            out = copy.deepcopy(user)
            expressions = list(out.get("matchExpressions") or [])
            for expr in term:
                as_dict = expr.to_dict()
                if as_dict not in expressions:
                    expressions.append(as_dict)
            out["matchExpressions"] = expressions
            merged.append(out)
    return merged


def _affinity_ops(spec: dict[str, Any], terms: tuple[Term, ...]) -> list[Operation]:
    if not terms:
        return []
    affinity = copy.deepcopy(_map(spec.get("affinity")) or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    if not isinstance(node_affinity, dict):
        node_affinity = affinity["nodeAffinity"] = {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    existing = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    merged = merge_terms(existing if isinstance(existing, list) else [], terms)
    if isinstance(existing, list) and merged == existing:
        return []
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": merged}
    op = "replace" if "affinity" in spec else "add"
    return [{"op": op, "path": "/spec/affinity", "value": affinity}]


def _gate_ops(spec: dict[str, Any]) -> list[Operation]:
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": CAPACITY_GATE}]}]
    if has_capacity_gate(spec):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": CAPACITY_GATE}}]


def annotation_value(decision: PodDecision) -> str:
    return decision.allocation().to_annotation()


def _annotation_ops(pod: dict[str, Any], values: dict[str, str | None]) -> list[Operation]:
    """Set each annotation of ``values`` to its value, or remove it where the value is None."""
    metadata = _map(pod.get("metadata"))
    wanted = {k: v for k, v in values.items() if v is not None}
    if metadata is None:
        return [{"op": "add", "path": "/metadata", "value": {"annotations": wanted}}]
    current = _map(metadata.get("annotations"))
    if current is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": wanted}]
    ops: list[Operation] = []
    for key, value in values.items():
        path = f"/metadata/annotations/{escape(key)}"
        if value is None and key in current:
            ops.append({"op": "remove", "path": path})
        elif value is not None and current.get(key) != value:  # equal: the webhook's own, seen again
            ops.append({"op": "add", "path": path, "value": value})
    return ops


def build_patch(pod: dict[str, Any], decision: PodDecision, right_sized: RightSizedFrom | None = None
                ) -> list[Operation]:
    """The JSON Patch turning ``pod`` into what ``decision`` says; ``right_sized``: what right-sizing
    changed of the pod's request (``sharing.admission.right_sizing``), recorded in
    ``gpupack.io/right-sized-from``; None removes a record the pod carries (only the webhook's counts)."""
    spec = pod["spec"]
    dra = decision.backend == "dra"
    ops: list[Operation] = []
    for c in decision.containers:
        container = spec[c.kind][c.index]
        base = f"/spec/{c.kind}/{c.index}"
        ops += _resources_ops(container, base, None if dra else c.resource)
        ops += _claim_ops(container, base, c.resource) if dra else _env_ops(container, base, c.env)
    if dra and decision.mode != "cpu":  # a pod that asks for no GPU has no claim
        ops += _pod_claim_ops(spec, decision.claim)
    ops += _affinity_ops(spec, decision.terms)
    if decision.gated:
        ops += _gate_ops(spec)
    ops += _annotation_ops(pod, {
        ALLOCATION_ANNOTATION: annotation_value(decision),
        RIGHT_SIZED_ANNOTATION: right_sized.to_annotation() if right_sized is not None else None,
    })
    return ops


# --- applying (CLI dry run, tests) ---------------------------------------------


def _walk(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def apply_patch(document: Any, ops: list[Operation]) -> Any:
    """Apply add/replace/remove operations to a deep copy of ``document``."""
    doc = copy.deepcopy(document)
    for op in ops:
        tokens = [unescape(t) for t in op["path"].split("/")[1:]]
        parent = _walk(doc, tokens[:-1])
        last = tokens[-1]
        kind = op["op"]
        if isinstance(parent, list):
            if kind == "add":
                parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[int(last)] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[int(last)]
            else:
                raise ValueError(f"unsupported op {kind!r}")
        else:
            if kind in ("replace", "remove") and last not in parent:
                raise KeyError(f"{op['path']}: no such member for {kind}")
            if kind in ("add", "replace"):
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            else:
                raise ValueError(f"unsupported op {kind!r}")
    return doc

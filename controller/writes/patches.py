"""The writes the controller makes, as pure functions from objects to patches.

Pinning a gated pod: Kubernetes lets a *gated* pod's required node affinity be
tightened (KEP-3838: expressions may be added to existing terms; a pod without
required affinity may get one), never loosened. So the hostname expression is
ANDed into every existing term and the gate removed in the same patch
(:func:`release_ops`), guarded by a ``test`` op on the gates: if anyone changed
them meanwhile, the patch fails instead of releasing a pod it should not. One
patch is enough because the API server checks the tightening against the pod
as it was (gated); it is atomic, so no pod is ever left pinned but gated, and it
is one write per pod, not two (the 10,000-GPU steady state is bound by the API
server's writes). A pod pinned by an earlier controller and still gated is only
ungated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.planning.migplan import LayoutChange
from controller.planning.planner import SharingChange
from sharing.api.allocation import has_capacity_gate
from sharing.api.keys import CAPACITY_GATE, HOSTNAME_LABEL
from sharing.api.fields import as_map as _map

Op = dict[str, Any]
_TERMS = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"


def pin_ops(pod: Mapping[str, Any], node: str) -> list[Op]:
    """JSON patch adding ``kubernetes.io/hostname In [node]`` to every required term (gate still on)."""
    spec = _map(pod.get("spec"))
    gates = spec.get("schedulingGates")
    if not has_capacity_gate(spec):
        raise ValueError("pod is not gated by gpupack.io/capacity: its affinity can no longer be changed")
    expression = {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}
    ops: list[Op] = [{"op": "test", "path": "/spec/schedulingGates", "value": gates}]
    affinity = _map(spec.get("affinity"))
    node_affinity = _map(affinity.get("nodeAffinity"))
    required = _map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        value = {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
        if not affinity:
            ops.append({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": value}}})
        elif not node_affinity:
            ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {"requiredDuringSchedulingIgnoredDuringExecution": value}})
        else:
            ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", "value": value})
        return ops
    for i, term in enumerate(terms):
        if isinstance(_map(term).get("matchExpressions"), list):
            ops.append({"op": "add", "path": f"{_TERMS}/{i}/matchExpressions/-", "value": expression})
        else:
            ops.append({"op": "add", "path": f"{_TERMS}/{i}/matchExpressions", "value": [expression]})
    return ops


def ungate_ops(pod: Mapping[str, Any]) -> list[Op]:
    """JSON patch removing only gpupack's gate (other controllers' gates stay)."""
    gates = _map(pod.get("spec")).get("schedulingGates")
    if not isinstance(gates, list):
        return []
    rest = [g for g in gates if _map(g).get("name") != CAPACITY_GATE]
    if len(rest) == len(gates):
        return []
    ops: list[Op] = [{"op": "test", "path": "/spec/schedulingGates", "value": gates}]
    ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": rest} if rest else {"op": "remove", "path": "/spec/schedulingGates"})
    return ops


def release_ops(pod: Mapping[str, Any], node: str, pinned: bool) -> list[Op]:
    """One guarded JSON patch that pins ``pod`` to ``node`` (unless already ``pinned`` there) and
    removes gpupack's gate; ``[]`` when there is nothing to do."""
    ungate = ungate_ops(pod)
    if pinned:
        return ungate
    return pin_ops(pod, node) + ungate[1:]  # pin_ops starts with the same test op on the gates


def gpus_spec(gpunode: Mapping[str, Any], changes: list[LayoutChange]) -> list[dict[str, Any]]:
    """``spec.gpus`` with the changed GPUs replaced (others kept as they are)."""
    current = {int(_map(g).get("index", -1)): dict(_map(g)) for g in _map(gpunode.get("spec")).get("gpus") or []}
    for change in changes:
        current[change.index] = {
            "index": change.index,
            "migEnabled": True,
            # Profiles only: the agent places them (mig.reach keeps in-use instances in place).
            "layout": [{"profile": i.profile} for i in change.layout],
        }
    return [current[i] for i in sorted(current) if i >= 0]


def sharing_spec(change: SharingChange) -> dict[str, Any]:
    return {"mode": change.mode, "replicas": change.replicas if change.mode != "none" else 1}

"""kube-scheduler's prioritize extender, pure: read its ExtenderArgs, score nodes by the priority preference.

kube-scheduler places the pods gpupack does not (plain ``nvidia.com/gpu`` pods, CPU-only pods);
a scheduler extender lets it prefer the nodes where no GPU pod has a lower priority than the pod
(``sharing.packing.priority_affinity.no_lower_among``, the one rule; the module says why it is not
the engine's ``unmixed``). The webhook serves it (``webhook.app``, ``POST /scheduler/prioritize``); this module is
what the route decides, a function of the body and the GPU pods per node.

The wire form is kube-scheduler's (k8s.io/kube-scheduler ``extender/v1/types.go``):
``ExtenderArgs`` is a Go struct without json tags, so its keys are the field names ``Pod`` (a v1
Pod), ``Nodes`` (a NodeList; null when the extender is ``nodeCacheCapable``) and ``NodeNames``;
Go's decoder matches keys case-insensitively, and so does :func:`parse_extender_args`. The
answer is a ``HostPriorityList``, ``[{"Host": name, "Score": n}]`` with ``0 <= n <=``
:data:`MAX_EXTENDER_PRIORITY`, which kube-scheduler scales by ``MaxNodeScore /
MaxExtenderPriority`` and the extender's weight before adding it to its plugins' scores.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from sharing.api.priority import pod_priority
from sharing.packing.priority_affinity import no_lower_among

MAX_EXTENDER_PRIORITY: Final = 10
"""kube-scheduler's ``MaxExtenderPriority``: the highest score an extender may give."""

__all__ = ["MAX_EXTENDER_PRIORITY", "ExtenderArgs", "host_priorities", "parse_extender_args", "score_nodes"]


@dataclass(frozen=True)
class ExtenderArgs:
    """What the preference needs of one prioritize call: the pod's priority and the nodes asked about."""

    pod: str
    """``namespace/name``, for messages."""
    priority: int
    nodes: tuple[str, ...]


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` as Go's decoder reads a struct field without a json tag: an exact key, else any
    key equal to ``name`` ignoring case (the last such key, as later keys overwrite earlier ones)."""
    if name in obj:
        return obj[name]
    found = None
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == name.lower():
            found = value
    return found


def _names(args: Mapping[str, Any]) -> tuple[str, ...]:
    names = _field(args, "NodeNames")
    where = "NodeNames"
    if names is None:
        nodes = _field(args, "Nodes")
        if nodes is None:
            raise ValueError("ExtenderArgs has neither NodeNames nor Nodes: no node to score")
        if not isinstance(nodes, Mapping) or not isinstance(nodes.get("items"), list):
            raise ValueError("ExtenderArgs Nodes must be a NodeList object with an items list")
        names = [item.get("metadata", {}).get("name") if isinstance(item, Mapping)
                 and isinstance(item.get("metadata"), Mapping) else None for item in nodes["items"]]
        where = "Nodes.items[*].metadata.name"
    if not isinstance(names, list):
        raise ValueError(f"ExtenderArgs {where} must be a list of node names, got {type(names).__name__}")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ValueError(f"ExtenderArgs {where}[{i}] must be a node name (a non-empty string), got {name!r}")
    return tuple(names)


def parse_extender_args(body: object) -> ExtenderArgs:
    """The pod's priority (``sharing.api.priority.pod_priority``) and the node names of an ExtenderArgs
    (``NodeNames``, else the names of ``Nodes.items``); a :class:`ValueError` saying what is wrong
    with a body that is not one. Priority fields the reader refuses are an error too: the API
    server never writes them, and a guessed priority could steer the pod beside the wrong pods."""
    if not isinstance(body, Mapping):
        raise ValueError(f"ExtenderArgs must be a JSON object, got {type(body).__name__}")
    pod = _field(body, "Pod")
    if pod is None:
        raise ValueError("ExtenderArgs has no Pod")
    if not isinstance(pod, Mapping):
        raise ValueError(f"ExtenderArgs Pod must be an object, got {type(pod).__name__}")
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    if not isinstance(pod.get("spec"), Mapping):
        raise ValueError(f"ExtenderArgs Pod {key} has no spec")
    return ExtenderArgs(key, pod_priority(pod).value, _names(body))


def score_nodes(priority: int, nodes: Sequence[str], priorities: Mapping[str, Collection[int]]) -> list[int]:
    """Per node of ``nodes``, :data:`MAX_EXTENDER_PRIORITY` where no GPU pod on it has a priority below
    ``priority`` (a node without GPU pods too), else 0. ``priorities``: node -> the priorities of its GPU pods;
    one entry per priority present suffices, so the cost grows with the nodes asked, not the pods."""
    on: list[int] = []
    held: list[int] = []
    for i, node in enumerate(nodes):
        for p in priorities.get(node, ()):
            on.append(i)
            held.append(p)
    preferred = no_lower_among(np.array(on, dtype=np.int64), np.array(held, dtype=np.int64), len(nodes), priority)
    return [MAX_EXTENDER_PRIORITY if ok else 0 for ok in preferred.tolist()]


def host_priorities(nodes: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    """The ``HostPriorityList`` kube-scheduler decodes (``Host``, ``Score``)."""
    if len(nodes) != len(scores):
        raise ValueError(f"{len(nodes)} nodes but {len(scores)} scores: one score per node")
    return [{"Host": node, "Score": score} for node, score in zip(nodes, scores)]

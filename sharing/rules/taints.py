"""Whether a pod tolerates a node's taints: the one reading of ``spec.taints`` and ``spec.tolerations``.

The planner pins a gated pod to a node, or holds a node for a pod kube-scheduler places, only
where kube-scheduler will then bind the pod. A node with a ``NoSchedule`` or ``NoExecute`` taint
the pod does not tolerate is no such node: a pinned pod would stay Pending there, and GPUs held for
it would be held for nothing. The rule is kube-scheduler's TaintToleration filter (facts from the
Kubernetes API reference, "Taints and Tolerations", and ``k8s.io/api/core/v1``
``Toleration.ToleratesTaint``):

* only taints with effect ``NoSchedule`` or ``NoExecute`` filter; ``PreferNoSchedule`` only scores;
* a toleration matches a taint when its ``effect`` is empty or equal to the taint's, and
  - operator ``Exists``: its ``key`` is empty (every key) or equal to the taint's, whatever the value;
  - operator ``Equal`` (the default when empty): its ``key`` and ``value`` equal the taint's;
* the pod tolerates the node when every filtering taint is matched by some toleration.

Entries the API server would not have accepted (not a mapping, a key that is not a string, an
unknown operator) are left out of what is read: a taint that cannot be read does not filter, a
toleration that cannot be read tolerates nothing. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects kube-scheduler's filter honours (``PreferNoSchedule`` only scores a node)."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    """Empty: every effect."""

    def matches(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None if value is not None else ""


def read_taints(node_spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The node's filtering taints (``NoSchedule``, ``NoExecute``), from its ``spec``."""
    out = []
    raw = node_spec.get("taints")
    for entry in raw if isinstance(raw, list) else ():
        if not isinstance(entry, Mapping):
            continue
        key, value, effect = _text(entry.get("key")), _text(entry.get("value")), _text(entry.get("effect"))
        if key and value is not None and effect in FILTERING_EFFECTS:
            out.append(Taint(key, value, effect))
    return tuple(sorted(out, key=lambda t: (t.key, t.value, t.effect)))


def read_tolerations(pod_spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """The pod's tolerations, from its ``spec``."""
    out = []
    raw = pod_spec.get("tolerations")
    for entry in raw if isinstance(raw, list) else ():
        if not isinstance(entry, Mapping):
            continue
        key, value, effect = _text(entry.get("key")), _text(entry.get("value")), _text(entry.get("effect"))
        operator = _text(entry.get("operator")) or "Equal"
        if key is None or value is None or effect is None or operator not in ("Equal", "Exists"):
            continue
        out.append(Toleration(key, operator, value, effect))
    return tuple(out)


def tolerates(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> bool:
    """Whether every filtering taint of a node is tolerated (module docstring)."""
    held = tuple(tolerations)
    return all(any(t.matches(taint) for t in held) for taint in taints if taint.effect in FILTERING_EFFECTS)


__all__ = ["FILTERING_EFFECTS", "Taint", "Toleration", "read_taints", "read_tolerations", "tolerates"]

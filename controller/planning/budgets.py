"""Which pods a PodDisruptionBudget protects now: preemption prefers other victims (kube-scheduler's rule).

kube-scheduler's DefaultPreemption prefers victims whose eviction violates no
PodDisruptionBudget and still preempts others when it must (it deletes; it does not evict).
A pod is protected here when a budget of its namespace selects it and that budget's
``status.disruptionsAllowed`` is below 1: one more disruption would violate it. A budget's
``spec.selector`` is a label selector (``matchLabels`` and ``matchExpressions``: ``In``,
``NotIn``, ``Exists``, ``DoesNotExist``); an empty selector selects every pod of the namespace,
a missing one none (policy/v1). A budget whose status or selector cannot be read protects nothing
(the disruption controller has not judged it yet, or it is not one the API server accepts).
Pure: raw objects in, pod keys out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sharing.api.fields import as_list as _list
from sharing.api.fields import as_map as _map


def _matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    if any(labels.get(k) != v for k, v in _map(selector.get("matchLabels")).items()):
        return False
    for expression in _list(selector.get("matchExpressions")):
        e = _map(expression)
        key, op, values = str(e.get("key")), e.get("operator"), [str(v) for v in _list(e.get("values"))]
        present = key in labels
        if op == "In" and not (present and str(labels[key]) in values):
            return False
        if op == "NotIn" and present and str(labels[key]) in values:
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # not a selector the API server accepts: select nothing
    return True


def protected_pods(budgets: Iterable[Mapping[str, Any]], pods: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """Keys (``namespace/name``) of the ``pods`` a budget with no disruption left selects."""
    out: set[str] = set()
    for budget in budgets:
        allowed = _map(budget.get("status")).get("disruptionsAllowed")
        selector = _map(budget.get("spec")).get("selector")
        if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed >= 1 or not isinstance(selector, Mapping):
            continue
        namespace = _map(budget.get("metadata")).get("namespace")
        for key, pod in pods.items():
            if key.partition("/")[0] == namespace and _matches(selector, _map(_map(pod.get("metadata")).get("labels"))):
                out.add(key)
    return frozenset(out)


__all__ = ["protected_pods"]

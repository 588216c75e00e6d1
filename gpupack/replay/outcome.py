"""What became of one submitted pod, read from the Pod object alone: bound, unplaceable, or not yet known.

* **bound**: ``spec.nodeName`` is set (kube-scheduler bound it; on KWOK it then runs).
* **unplaceable**, said by whoever places the pod:

  - a gated pod (``gpupack.io/capacity``: every fractional pod, placed by
    gpupack's packing engine): the controller's placement condition says
    ``NoCapacity`` (``sharing.api.placement_status``);
  - an ungated pod of kube-scheduler's (whole GPUs asked as ``nvidia.com/gpu``,
    CPU-only pods): ``PodScheduled=False`` with reason ``Unschedulable``. A pod
    the controller released (it carries gpupack's allocation record) that
    kube-scheduler then finds no room for is not judged here: the controller
    plans it again, so it is left waiting. Nor is a pod kube-scheduler preempted for
  (``status.nominatedNodeName``): it waits for its victims to go. Nor is one gpupack's controller
  preempted for (its ``gpupack.io/preempting`` record, ``sharing.api.preempting``): it waits for
  its victims to go and for the node they held to return to whole GPUs.

* otherwise **waiting**.

:func:`classify` is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from sharing.api.allocation import has_capacity_gate
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.api.placement_status import read_placement
from sharing.api.preempting import read_preempting

Outcome = Literal["bound", "unplaceable", "waiting"]
Decider = Literal["scheduler", "controller", "released-unschedulable", "admission", "timeout"]
"""Who declared a pod never placed: kube-scheduler (Unschedulable), the controller (NoCapacity),
kube-scheduler for a pod the controller had released (after
``released_unschedulable_s``: ``gpupack.replay.runner``), the webhook (refused at admission), or the
replay's per-pod time limit."""

UNSCHEDULABLE: Final = "Unschedulable"


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def bound_node(pod: Mapping[str, Any]) -> str | None:
    node = _spec(pod).get("nodeName")
    return node if isinstance(node, str) and node else None


def gated(pod: Mapping[str, Any]) -> bool:
    return has_capacity_gate(_spec(pod))


def has_allocation(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return isinstance(annotations, Mapping) and ALLOCATION_ANNOTATION in annotations


def deleting(pod: Mapping[str, Any]) -> bool:
    """The pod has a ``deletionTimestamp``: someone deleted it and it is terminating."""
    meta = pod.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def nominated(pod: Mapping[str, Any]) -> bool:
    """kube-scheduler preempted for the pod and nominated it to the freed node (``status.nominatedNodeName``):
    it waits there for its victims to go, so it is not unplaceable."""
    status = pod.get("status")
    return isinstance(status, Mapping) and bool(status.get("nominatedNodeName"))


def preempted_for(pod: Mapping[str, Any]) -> bool:
    """gpupack's controller preempted for the pod (its ``gpupack.io/preempting`` record): it waits for the
    place it freed, so it is not unplaceable."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return read_preempting(annotations if isinstance(annotations, Mapping) else None) is not None


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """kube-scheduler's ``PodScheduled=False, reason Unschedulable``."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return False
    return any(isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == UNSCHEDULABLE for c in conditions)


def released_unschedulable(pod: Mapping[str, Any]) -> bool:
    """A pod of gpupack's the controller released (ungated) that kube-scheduler finds no room for: the
    controller pinned it to a node that cannot take it. Transient while the node's advertised resources
    catch up with a change the controller waited for; lasting when the node lacks what the pod asks
    beside its GPU (CPU, memory), which the controller's packing engine does not count today."""
    return not gated(pod) and has_allocation(pod) and unschedulable(pod) and not bound_node(pod)


def classify(pod: Mapping[str, Any]) -> tuple[Outcome, Decider | None]:
    """The pod's outcome so far, and who decided it when it is ``unplaceable`` (module docstring)."""
    if bound_node(pod):
        return "bound", None
    if gated(pod):
        status = read_placement(pod)
        return ("unplaceable", "controller") if status is not None and status.unplaceable else ("waiting", None)
    if unschedulable(pod) and not has_allocation(pod) and not nominated(pod) and not preempted_for(pod):
        return "unplaceable", "scheduler"
    return "waiting", None

"""A GPU pod on a node, with its priority: the one reading of which pods the placement preference counts.

The placement preference by priority (``sharing.packing.priority_affinity``) keeps pods of
different priorities off each other's nodes, counting every GPU pod that sits on a node. The
controller's live planner counts them from its snapshot (``controller.planning.sharedplan.SharedPlacer``)
and the webhook's scheduler extender (``webhook.priority_watch``) from a pod watch; both read a raw
pod object through :func:`gpu_pod_site`, so they count the same pods:

* a gpupack pod (a trusted ``gpupack.io/allocation`` record, ``sharing.api.allocation.trusted_allocation``)
  whose node is known: bound (``spec.nodeName``) or pinned by its required node affinity on
  ``kubernetes.io/hostname`` while it waits at the gate (:func:`pinned_node`), and whose mode is
  not ``mig`` (a MIG instance holds no replica nor whole GPU) nor ``cpu`` (a DRA pool pod that asks
  for no GPU) (:data:`UNCOUNTED_MODES`);
* a pod that is not gpupack's (no allocation record at all) asking ``nvidia.com/gpu``
  (:func:`whole_gpus_requested`) and bound to a node;

and none that is finished (``Succeeded``/``Failed``) or being deleted. A pod whose record is not
trusted is neither: its GPUs are not what the record says, and it is not a plain pod either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mig.units import parse_quantity
from sharing.api.allocation import trusted_allocation
from sharing.api.fields import as_list, as_map
from sharing.api.keys import ALLOCATION_ANNOTATION, HOSTNAME_LABEL, WHOLE_RESOURCE
from sharing.api.priority import priority_of

UNCOUNTED_MODES: Final = ("mig", "cpu")
"""Allocation modes whose pods are not GPU pods for the placement preference: a MIG instance holds no
replica nor whole GPU, and a ``cpu`` pod holds no GPU at all (CPU-only pods never count, as in the
product model)."""

__all__ = ["UNCOUNTED_MODES", "UNFINISHED_PODS", "GpuPodSite", "ended", "gpu_pod_site", "pinned_node", "whole_gpus_requested"]

UNFINISHED_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"
"""The field selector of the pods that are not finished: the API server's half of :func:`ended`, so
a watch of pods neither lists nor follows finished ones (a pod that finishes leaves it as ``DELETED``)."""


@dataclass(frozen=True)
class GpuPodSite:
    """A GPU pod's node and ``spec.priority`` (0 where the priority reader refuses the fields)."""

    node: str
    priority: int


def ended(obj: Mapping[str, Any]) -> bool:
    """Whether the pod is finished (``Succeeded``/``Failed``) or being deleted: it holds no GPU to plan around."""
    return bool(as_map(obj.get("metadata")).get("deletionTimestamp")) or (
        as_map(obj.get("status")).get("phase") in ("Succeeded", "Failed"))


def pinned_node(spec: Mapping[str, Any]) -> str | None:
    """The one node the pod's required node affinity allows by ``kubernetes.io/hostname In [node]``
    (every term names the same single host), or None: how the controller pins a gated pod."""
    terms = as_list(as_map(as_map(as_map(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution")).get("nodeSelectorTerms"))
    pinned: set[str] = set()
    for term in terms:
        hosts = [
            tuple(as_list(e.get("values")))
            for e in as_list(as_map(term).get("matchExpressions"))
            if isinstance(e, Mapping) and e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In"
        ]
        if len(hosts) != 1 or len(hosts[0]) != 1:
            return None
        pinned.add(str(hosts[0][0]))
    return pinned.pop() if len(pinned) == 1 else None


def whole_gpus_requested(obj: Mapping[str, Any]) -> int:
    """``nvidia.com/gpu`` a pod holds at its peak (app containers together, or its largest
    init container), as kube-scheduler counts it; 0 for finished pods and pods being deleted."""
    if ended(obj):
        return 0
    spec = as_map(obj.get("spec"))

    def count(container: Any) -> int:
        limits = as_map(as_map(as_map(container).get("resources")).get("limits"))
        try:
            return max(0, int(parse_quantity(limits.get(WHOLE_RESOURCE, 0))))
        except (ValueError, TypeError):
            return 0

    app = sum(count(c) for c in as_list(spec.get("containers")))
    return max([app, *(count(c) for c in as_list(spec.get("initContainers")))])


def _bound(spec: Mapping[str, Any]) -> str | None:
    node = spec.get("nodeName")
    return node if isinstance(node, str) and node else None


def gpu_pod_site(obj: Mapping[str, Any]) -> GpuPodSite | None:
    """Where the GPU pod ``obj`` (a raw pod object) sits and its priority; None for any other pod
    (module docstring: which pods count)."""
    if ended(obj):
        return None
    spec = as_map(obj.get("spec"))
    text = as_map(as_map(obj.get("metadata")).get("annotations")).get(ALLOCATION_ANNOTATION)
    if text is None:
        node = _bound(spec) if whole_gpus_requested(obj) else None
    else:
        allocation, _ = trusted_allocation(text, spec)
        node = None if allocation is None or allocation.mode in UNCOUNTED_MODES else _bound(spec) or pinned_node(spec)
    return None if node is None else GpuPodSite(node, priority_of(obj)[0].value)

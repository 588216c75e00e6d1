"""Reading gpupack pods from raw Pod objects (dicts): the allocation annotation, gates, affinity.

Pure and lenient: a pod without a readable ``gpupack.io/allocation`` annotation
(``sharing.api.allocation``, the webhook's own record) is simply not a gpupack pod. The required node affinity and nodeSelector are
kept whole, so the planner never pins a pod to a node its own terms exclude.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.state.snapshot import Pod
from kube.times import parse_time
from mig.units import parse_quantity
from sharing.api.allocation import Allocation, has_capacity_gate, held_by_kueue, trusted_allocation
from sharing.api.gpu_pod_site import ended, pinned_node, whole_gpus_requested
from sharing.api.keys import ALLOCATION_ANNOTATION, PRODUCT_LABEL
from sharing.api.preempting import read_preempting
from sharing.api.priority import priority_of
from sharing.api.fields import as_list as _list
from sharing.api.fields import as_map as _map
from sharing.rules.taints import read_tolerations

__all__ = ["plain_preemptor", "pod_from_object", "priority_of", "read_pod", "read_record", "required_products", "resources_held", "waiting_unschedulable", "whole_gpus_requested"]


def required_products(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """GPU products a pod's required node affinity names (``nvidia.com/gpu.product In``); empty: any."""
    terms = _list(
        _map(_map(_map(spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")).get(
            "nodeSelectorTerms"
        )
    )
    found: set[str] = set()
    for term in terms:
        for e in _list(_map(term).get("matchExpressions")):
            if isinstance(e, Mapping) and e.get("key") == PRODUCT_LABEL and e.get("operator") == "In":
                found.update(str(v) for v in _list(e.get("values")))
    return tuple(sorted(found))


def _node_selector(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pod's ``nodeSelector``, as sorted ``(key, value)`` pairs."""
    return tuple(sorted((str(k), str(v)) for k, v in _map(spec.get("nodeSelector")).items()))


def _terms(spec: Mapping[str, Any]) -> tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...]:
    terms = _list(
        _map(_map(_map(spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")).get(
            "nodeSelectorTerms"
        )
    )
    out = []
    for term in terms:
        exprs = tuple(
            (str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in _list(e.get("values"))))
            for e in _list(_map(term).get("matchExpressions"))
            if isinstance(e, Mapping)
        )
        out.append(exprs)
    return tuple(out)


_UNITS: dict[str, tuple[int, int]] = {"cpu": (1000, 1), "memory": (1, 1024 * 1024)}
"""Resource -> (multiply, divide): CPU in milli, memory in MiB."""


def _quantity(requests: Any, resource: str) -> int:
    value = _map(requests).get(resource)
    if value is None:
        return 0
    times, over = _UNITS[resource]
    try:
        return max(0, int(parse_quantity(value) * times / over))
    except (ValueError, TypeError, ArithmeticError):
        return 0


def _container_requests(container: Any) -> Any:
    return _map(_map(container).get("resources")).get("requests")


def _requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """CPU milli and memory MiB the pod requests as kube-scheduler counts them (NodeResourcesFit):
    per resource the larger of its app containers together and its largest init container,
    plus the pod's ``overhead``; an unreadable quantity counts as 0."""
    out: list[int] = []
    for resource in ("cpu", "memory"):
        app = sum(_quantity(_container_requests(c), resource) for c in _list(spec.get("containers")))
        init = max((_quantity(_container_requests(c), resource) for c in _list(spec.get("initContainers"))), default=0)
        overhead = _quantity(spec.get("overhead"), resource)
        out.append(max(app, init) + overhead)
    return out[0], out[1]


def resources_held(obj: Mapping[str, Any]) -> tuple[int, int]:
    """CPU milli and memory MiB a pod holds on its node (:func:`_requests`); 0 for finished pods.
    A terminating pod still holds them: kube-scheduler counts it until it is gone."""
    spec, status = _map(obj.get("spec")), _map(obj.get("status"))
    if status.get("phase") in ("Succeeded", "Failed"):
        return 0, 0
    return _requests(spec)


def waiting_unschedulable(obj: Mapping[str, Any]) -> bool:
    """Pending, not gated, not bound, and kube-scheduler reported it Unschedulable."""
    spec, status = _map(obj.get("spec")), _map(obj.get("status"))
    if spec.get("nodeName") or _list(spec.get("schedulingGates")) or status.get("phase") not in (None, "Pending"):
        return False
    return any(
        _map(c).get("type") == "PodScheduled" and _map(c).get("reason") == "Unschedulable"
        for c in _list(status.get("conditions"))
    )


def plain_preemptor(obj: Mapping[str, Any], gpus: int) -> Pod | None:
    """The planner's view of a pod that is not gpupack's and asks ``gpus`` of ``nvidia.com/gpu``, which
    kube-scheduler left Unschedulable and nominated to no node (its own preemption found no
    candidate): mode ``whole``, never gated, :attr:`Pod.plain`. gpupack may preempt for it and switch
    the freed node back to whole GPUs (``controller.planning.planner``). A pod carrying gpupack's
    ``gpupack.io/preempting`` record is its preemptor whatever kube-scheduler nominated: its node is
    the one the record names. None for any other pod."""
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    if gpus <= 0 or not waiting_unschedulable(obj) or meta.get("deletionTimestamp"):
        return None
    record = read_preempting(_map(meta.get("annotations")))
    if record is None and status.get("nominatedNodeName"):
        return None  # kube-scheduler preempted for it itself: its victims are going
    created = parse_time(meta.get("creationTimestamp"))
    if created is None or not isinstance(meta.get("name"), str):
        return None
    cpu, mem = _requests(spec)
    priority, priority_problem = priority_of(obj)
    return Pod(
        namespace=str(meta.get("namespace") or "default"), name=meta["name"], mode="whole", created=created,
        milli=(1000,) * gpus, memory_bytes=(None,) * gpus, products=required_products(spec), unschedulable=True,
        node=None if record is None else record.node, cpu_milli=cpu, memory_mib=mem, uid=str(meta.get("uid") or ""),
        node_selector=_node_selector(spec),
        terms=_terms(spec), tolerations=read_tolerations(spec), priority=priority,
        priority_problem=priority_problem,
        victims=() if record is None else record.victims, plain=True,
    )


def pod_from_object(obj: Mapping[str, Any]) -> Pod | None:
    """A gpupack pod (one with an allocation annotation), or None for others and finished pods."""
    return read_pod(obj)[0]


def read_pod(obj: Mapping[str, Any]) -> tuple[Pod | None, str | None]:
    """The gpupack pod in ``obj`` (or None), and why an allocation it carries is not trusted (or None)."""
    pod, _, distrust = read_record(obj)
    return pod, distrust


def read_record(obj: Mapping[str, Any]) -> tuple[Pod | None, Allocation | None, str | None]:
    """The gpupack pod in ``obj`` and the record it was read from (or None, None), and why an
    allocation it carries is not trusted (or None).

    An allocation whose pod does not request what it records (``Allocation.mismatch``)
    is ignored: the annotation is text any pod creator can write, and trusting a forged
    one would count GPUs as taken and release a pod that asks for none. Whether the
    namespace's SharingPolicy could have produced the record is the snapshot's check
    (``controller.state.build.assemble``), which knows the policies and namespaces: this
    reading is a function of the pod alone, kept while the pod does not change.
    """
    meta, spec = _map(obj.get("metadata")), _map(obj.get("spec"))
    if ended(obj):
        return None, None, None
    text = _map(meta.get("annotations")).get(ALLOCATION_ANNOTATION)
    if text is None:
        return None, None, None
    allocation, distrust = trusted_allocation(text, spec)
    if allocation is None:
        return None, None, distrust
    return _pod(meta, spec, obj, allocation), allocation, None


def _victims(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The uids in the preemptor's ``gpupack.io/preempting`` record (empty when it has none)."""
    record = read_preempting(_map(meta.get("annotations")))
    return () if record is None else record.victims


def _pod(meta: Mapping[str, Any], spec: Mapping[str, Any], obj: Mapping[str, Any], allocation: Allocation) -> Pod | None:
    mode, containers = allocation.mode, allocation.containers
    created = parse_time(meta.get("creationTimestamp"))
    if created is None or not isinstance(meta.get("name"), str):
        return None
    node_name = spec.get("nodeName")
    cpu, mem = _requests(spec)
    replicas = allocation.replicas
    gated = has_capacity_gate(spec)
    unschedulable = waiting_unschedulable(obj)
    priority, priority_problem = priority_of(obj)
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=meta["name"],
        mode=mode,
        created=created,
        profiles=tuple(c.profile for c in containers if c.profile) if mode == "mig" else (),
        milli=tuple(c.milli for c in containers),
        memory_bytes=tuple(c.memory_bytes for c in containers),
        products=required_products(spec),
        replicas=replicas,
        gated=gated,
        queue_held=held_by_kueue(spec),
        unschedulable=unschedulable,
        node=node_name if isinstance(node_name, str) and node_name else pinned_node(spec),
        bound=isinstance(node_name, str) and bool(node_name),
        cpu_milli=cpu,
        memory_mib=mem,
        uid=str(meta.get("uid") or ""),
        node_selector=_node_selector(spec),
        terms=_terms(spec), tolerations=read_tolerations(spec),
        backend=allocation.backend,
        claim=allocation.claim,
        requests=tuple(c.resource for c in containers) if allocation.backend == "dra" else (),
        mig_fallback=allocation.mig_fallback or (),
        priority=priority,
        priority_problem=priority_problem,
        victims=_victims(meta),
    )

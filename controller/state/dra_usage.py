"""What the DRA pool's ResourceClaims hold: allocated by kube-scheduler, or promised by the controller.

On a DRA node pool the devices in use are not in the GPUNode status: they are
in ResourceClaims of driver ``gpu.gpupack.io``. Two kinds count (pure reading,
raw API dicts in):

* **allocated**: ``status.allocation.devices.results[]`` names the pool (= the
  node), the device and, for a share, what it consumed
  (``consumedCapacity``); the truth, whoever created the claim;
* **promised**: a claim the controller created and kube-scheduler has not
  allocated yet holds the devices its ``gpupack.io/dra-pinned`` annotation
  names (``sharing.dra.pinned``); without counting them, a burst of pods in
  consecutive cycles would be promised one device twice.

**Whose pin counts** (issue 33, item 1). A tenant may create ResourceClaims in
its namespace, on any DeviceClass, with any annotation the API server lets
through: a pin is gpupack's record only when gpupack wrote it. The admission
policy ``gpupack-claim-marks`` refuses ``gpupack.io/*`` annotations on claims
written by anyone but the controller; this module does not rely on it being
installed (:func:`pin_untrusted`): a pin counts, as a promise or for adoption,
only on a claim the controller could have written, one owned by a DRA pod of
the cycle whose trusted record names the claim, pinning exactly that pod's
requests to devices its record allows, each asked on gpupack's DeviceClass of
the pinned kind. Any other pin is ignored and named once in
:attr:`DraUsage.problems`. An allocation stays the truth whoever created the
claim: kube-scheduler wrote it, not the claim's author.

Device names are read back through the names the node's GPUs can publish
(``sharing.dra.names`` writes them; :func:`device_table` lists them per GPU of
the node's model), so a name resolves to its GPU, profile and placement
exactly, and a name gpupack never publishes is reported, not guessed at.
Lenient like ``controller.state.build``: a malformed claim or result is skipped
and named in :attr:`DraUsage.problems`, never fatal to the cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.state.snapshot import Node, Pod
from kube.times import parse_time
from mig.model import GpuModel
from sharing.dra import names
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice, PinnedError
from sharing.dra.results import ResultError, allocated_node, read_result
from sharing.api.keys import DRA_REQUEUES_ANNOTATION
from sharing.api.fields import as_list as _list
from sharing.api.fields import as_map as _map

DeviceRef = tuple[names.DeviceKind, int, str | None, int | None]
"""``(kind, GPU index, MIG profile, MIG start)`` of a device name."""


@dataclass(frozen=True)
class Hold:
    """One request of a claim holding (or promised) one device of a node."""

    claim: str
    """``namespace/name``."""
    node: str
    device: PinnedDevice
    allocated: bool


@dataclass(frozen=True)
class ClaimRecord:
    """A claim as the cycle found it: whose it is and what the controller pinned it to."""

    key: str
    owners: tuple[str, ...]
    """UIDs of the Pods in its ``ownerReferences``."""
    pinned: Pinned | None
    problem: str | None = None
    """Why its pinned annotation could not be read (None: absent or read)."""
    allocated: bool = False
    """kube-scheduler has allocated it (``status.allocation``)."""
    uid: str = ""
    resource_version: str = ""
    created: datetime | None = None
    """``metadata.creationTimestamp`` (None: absent or unreadable)."""
    requeues: int = 0
    """Times the controller re-created it, same pin, for a pod kube-scheduler had set aside
    (``gpupack.io/dra-requeues``; unreadable: 0)."""


@dataclass(frozen=True)
class ClaimConflict:
    """Why a pod cannot use the claim that exists under its claim's name."""

    why: str
    foreign: bool
    """The claim is not the pod's (another pod's, or anyone's): gpupack must never release the pod onto it."""


def claim_key(pod: Pod) -> str:
    """The key (``namespace/name``) of the ResourceClaim ``pod`` references: :attr:`Hold.claim`'s and
    :attr:`DraUsage.claims`' key."""
    return f"{pod.namespace}/{pod.claim}"


def own_pin(record: ClaimRecord, pod_uid: str) -> Pinned | ClaimConflict:
    """Where the pod's existing claim was pinned, when it is the pod's (its owner is the pod's UID)."""
    if not pod_uid or pod_uid not in record.owners:
        return ClaimConflict(f"ResourceClaim {record.key} exists and is not this pod's (no ownerReference to it): "
                             "gpupack does not release the pod", True)
    if record.pinned is None:
        return ClaimConflict(f"ResourceClaim {record.key} is this pod's but says no device "
                             f"({record.problem or 'no ' + ANNOTATION + ' annotation'})", False)
    return record.pinned


@dataclass(frozen=True)
class DraUsage:
    holds: tuple[Hold, ...] = ()
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)
    """Every ResourceClaim of the cycle by ``namespace/name`` (gpupack's or not: a pod's claim
    name may be taken by anyone)."""
    problems: tuple[str, ...] = ()


def broken_promises(usage: DraUsage, nodes: Sequence[Node]) -> dict[str, str]:
    """Claims the controller pinned and kube-scheduler has not allocated whose pinned device is no
    longer free, by claim key, with why: claims allocated since (a user's own claim on gpupack's
    classes, which the engine does not plan, or one it could not see) took it. kube-scheduler can
    give such a claim nothing, so its pod would wait Pending for good (docs/dra-placement.md).

    Only allocated claims count against a promise: other promises are the controller's own and
    never overlap (``controller.planning.draplan``)."""
    allocated = [h for h in usage.holds if h.allocated]
    memory = {(n.name, g.index): g.memory_mib * 2**20 for n in nodes for g in n.gpus}
    models = {n.name: n.model for n in nodes}
    out: dict[str, str] = {}
    for promise in (h for h in usage.holds if not h.allocated):
        if promise.claim in out:
            continue
        on_gpu = [h for h in allocated if h.node == promise.node and h.device.gpu == promise.device.gpu
                  and h.claim != promise.claim]
        if not on_gpu:
            continue
        taken_by = ", ".join(sorted({h.claim for h in on_gpu}))
        device, kind = promise.device, promise.device.kind
        if kind == "gpu" or any(h.device.kind == "gpu" for h in on_gpu):
            broken = True
        elif kind == "shared":
            shares = [h.device for h in on_gpu if h.device.kind == "shared"]
            broken = (any(h.device.kind == "mig" for h in on_gpu)
                      or sum(d.milli for d in shares) + device.milli > 1000
                      or sum(d.memory_bytes for d in shares) + device.memory_bytes
                      > memory.get((promise.node, device.gpu), 0))
        else:
            broken = any(h.device.kind == "shared" or _overlap(models.get(promise.node), h.device, device)
                         for h in on_gpu)
        if broken:
            out[promise.claim] = (f"the device it was pinned to ({promise.node}, GPU {device.gpu}) was allocated to "
                                  f"{taken_by} before kube-scheduler allocated it")
    return out


def _overlap(model: GpuModel | None, a: PinnedDevice, b: PinnedDevice) -> bool:
    """Two MIG devices' placements share a memory slice (unknown profiles: assume they do)."""
    placed_a, placed_b = a.placed(model), b.placed(model)
    return placed_a is None or placed_b is None or bool(placed_a.placement.mask & placed_b.placement.mask)


def device_table(node: Node) -> dict[str, DeviceRef]:
    """Every device name the node's GPUs can publish, with what it names."""
    table: dict[str, DeviceRef] = {}
    for gpu in node.gpus:
        table[names.shared_device_name(gpu.index)] = ("shared", gpu.index, None, None)
        table[names.gpu_device_name(gpu.index)] = ("gpu", gpu.index, None, None)
        if node.model is None:
            continue
        for profile in node.model.profiles:
            for placement in profile.placements:
                name = names.mig_device_name(gpu.index, profile.name, placement.start)
                table[name] = ("mig", gpu.index, profile.name, placement.start)
    return table


def pin_untrusted(obj: Mapping[str, Any], pinned: Pinned, pods: Mapping[str, Pod]) -> str | None:
    """Why the pin of claim ``obj`` is not one the controller could have written (None: it could).

    ``pods``: the cycle's DRA pods by UID (their records already trusted, ``controller.state.pods``).
    The controller writes a claim (``controller.writes.dra_claims``) only for the pod whose record names it,
    owned by that pod, one request per recorded container on gpupack's DeviceClass of the device
    chosen for it, and a pin of exactly those requests to devices the record allows."""
    meta = _map(obj.get("metadata"))
    namespace, name = meta.get("namespace"), meta.get("name")
    owners = [pods.get(str(_map(o).get("uid"))) for o in _list(meta.get("ownerReferences"))
              if _map(o).get("kind") == "Pod" and _map(o).get("controller") is True]
    pod = next((p for p in owners if p is not None and p.backend == "dra" and p.namespace == namespace
                and p.claim == name), None)
    if pod is None:
        return "not owned by the DRA pod whose record names it"
    wanted = {request: index for index, request in enumerate(pod.requests)}
    pinned_requests = [d.request for d in pinned.devices]
    if sorted(pinned_requests) != sorted(wanted):
        return f"pins requests {sorted(pinned_requests)}, its pod's record asks {sorted(wanted)}"
    classes: dict[str, Any] = {}
    for raw in _list(_map(_map(obj.get("spec")).get("devices")).get("requests")):
        request = _map(raw)
        classes[str(request.get("name"))] = _map(request.get("exactly")).get("deviceClassName")
    if sorted(classes) != sorted(wanted):
        return f"asks requests {sorted(classes)}, its pod's record asks {sorted(wanted)}"
    for device in pinned.devices:
        if classes[device.request] != names.CLASS_OF_KIND[device.kind]:
            return (f"request {device.request!r} asks DeviceClass {classes[device.request]!r}, "
                    f"not {names.CLASS_OF_KIND[device.kind]!r} of the {device.kind} device it pins")
        why = _kind_refused(pod, wanted[device.request], device)
        if why is not None:
            return f"request {device.request!r}: {why}"
    return None


def _kind_refused(pod: Pod, index: int, device: PinnedDevice) -> str | None:
    """Why the pod's record does not allow ``device`` for its container ``index`` (the rule
    ``controller.writes.dra_claims`` builds claims by)."""
    if device.kind == "gpu":
        return None if pod.mode == "whole" else f"a whole GPU for a pod of mode {pod.mode!r}"
    if device.kind == "shared":
        return None if pod.mode in ("mps", "time-slicing") else f"a share for a pod of mode {pod.mode!r}"
    recorded = pod.profiles[index] if pod.mode == "mig" and index < len(pod.profiles) else None
    fallback = pod.mig_fallback[index] if index < len(pod.mig_fallback) else None
    if device.profile in (recorded, fallback) and device.profile is not None:
        return None
    return f"MIG profile {device.profile!r}, the record allows {recorded or fallback or 'no MIG instance'}"


def read_usage(claims: Iterable[Mapping[str, Any]], nodes: Sequence[Node],
               pods: Iterable[Pod] | None = None) -> DraUsage:
    """The holds of ``claims`` on ``nodes`` (the DRA pool), and every claim's record.

    ``pods``: the cycle's pods; a pin counts only where :func:`pin_untrusted` finds it the
    controller's. None checks no pin: for readers that only count what claims say they hold
    (tests of that counting), never for a placement decision."""
    by_uid = None if pods is None else {p.uid: p for p in pods if p.uid and p.backend == "dra"}
    tables = {n.name: device_table(n) for n in nodes}
    holds: list[Hold] = []
    records: dict[str, ClaimRecord] = {}
    problems: list[str] = []
    for obj in claims:
        meta = _map(obj.get("metadata"))
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        owners = tuple(str(_map(o).get("uid")) for o in _list(meta.get("ownerReferences"))
                       if _map(o).get("kind") == "Pod" and _map(o).get("uid"))
        pinned: Pinned | None = None
        problem: str | None = None
        text = _map(meta.get("annotations")).get(ANNOTATION)
        if text is not None:
            try:
                pinned = Pinned.from_annotation(text)
            except PinnedError as exc:
                problem = str(exc)
                problems.append(f"ResourceClaim {key}: {exc}")
        trusted = pinned is not None
        if pinned is not None and by_uid is not None:
            why = pin_untrusted(obj, pinned, by_uid)
            if why is not None:
                # Not gpupack's record (a tenant's forgery, or an admin's copy): no promise, no adoption.
                pinned, trusted = None, False
                problem = f"{ANNOTATION} not written by gpupack ({why}); ignored"
                problems.append(f"ResourceClaim {key}: {problem}")
        allocation = _map(_map(obj.get("status")).get("allocation"))
        records[key] = ClaimRecord(key, owners, pinned, problem, bool(allocation), str(meta.get("uid") or ""),
                                   str(meta.get("resourceVersion") or ""), parse_time(meta.get("creationTimestamp")),
                                   _count(_map(meta.get("annotations")).get(DRA_REQUEUES_ANNOTATION)) if trusted else 0)
        results = _list(_map(allocation.get("devices")).get("results"))
        if results:
            holds += _allocated(key, results, tables, problems, allocated_node(allocation))
        elif pinned is not None and not meta.get("deletionTimestamp"):
            # Not allocated yet: the promise holds until kube-scheduler allocates it or the claim goes.
            holds += [Hold(key, pinned.node, d, False) for d in pinned.devices]
    return DraUsage(tuple(holds), records, tuple(problems))


def _count(text: Any) -> int:
    """A non-negative count written as a string; anything else reads as 0."""
    return int(text) if isinstance(text, str) and text.isdigit() else 0


def _allocated(key: str, results: list[Any], tables: Mapping[str, Mapping[str, DeviceRef]],
               problems: list[str], on_node: str | None) -> list[Hold]:
    """The holds of an allocated claim's ``results``; ``on_node``: the node its allocation is confined to."""
    out: list[Hold] = []
    for index, raw in enumerate(results):
        if _map(raw).get("driver") != names.DRIVER or _map(raw).get("pool") not in tables:
            continue  # another driver's device, or a node outside the pool the engine plans
        try:
            result = read_result(raw, f"ResourceClaim {key}: status.allocation.devices.results[{index}]")
        except ResultError as exc:
            problems.append(str(exc))
            continue
        node, device = result.pool, result.device
        if on_node is not None and on_node != node:
            # Pool name = node name: these devices came from a slice on another node that named this
            # node's pool (a forgery, or a stale slice). They are not on `node`; charging it would
            # hide its real GPUs from the engine (issue 33, item 4).
            problems.append(f"ResourceClaim {key}: device {device!r} of pool {node} was allocated on node "
                            f"{on_node}; a slice of {on_node} named another node's pool, not counted")
            continue
        ref = tables[node].get(device)
        if ref is None:
            problems.append(f"ResourceClaim {key}: device {device!r} of {node} is none gpupack publishes there")
            continue
        kind, gpu, profile, start = ref
        milli = memory = 0
        if kind == "shared":
            milli, memory = result.consumed.get(names.MILLI, 0), result.consumed.get(names.MEMORY, 0)
            if milli <= 0 or memory <= 0:
                problems.append(f"ResourceClaim {key}: share of {device} on {node} records no consumedCapacity")
                continue
        out.append(Hold(key, node, PinnedDevice(result.request, kind, gpu, milli, memory, profile, start), True))
    return out

"""The ``gpupack.io/allocation`` pod annotation: one typed value, written and read here.

The webhook records its decision on every pod it changes (``sharing.admission.patch``,
from ``sharing.admission.decision.PodDecision``); the controller reads it back to know
what each pod asks for (``controller.state.pods``). Both go through
:meth:`Allocation.to_annotation` and :meth:`Allocation.from_annotation`, so
the two cannot drift apart. The wire form is documented in docs/webhook.md:

    {"version": "v1", "mode": "mps", "gated": true, "capacityExisted": true,
     "policy": "...", "reason": "...", "gpuModel": "...", "replicas": 4,
     "containers": [{"name": "c", "kind": "containers", "milli": 250,
                     "memoryBytes": 17179869184, "resource": "nvidia.com/gpu.shared",
                     "profile": "1g.10gb"}]}

``gpuModel``, ``replicas``, ``memoryBytes`` and ``profile`` are absent when not
set. Mode ``cpu`` (a pod that asks for no GPU, placed by the packing engine on the DRA
pool) has ``"containers": []``, ``"backend": "dra"`` and no claim. A pod bound for a DRA node pool (``sharing.api.backend``) adds ``"backend": "dra"``
and ``"claim"``, the name of the ResourceClaim its ``spec.resourceClaims`` entry
``gpupack`` references (created by the controller when it places the pod), and each
container's ``resource`` is the name of its request in that claim (``gpu-<n>``),
which the container's ``resources.claims`` names; ``backend`` is absent for the
device-plugin backend. A DRA record of a shared mode that the webhook decided for an ``auto``
pod may add ``"migFallback": ["3g.40gb", ...]``, per container (in ``containers`` order) the
MIG profile the packing engine may place the pod on instead when no shared GPU has room
(docs/dra-placement.md, "The mode of an auto pod"); absent otherwise. A container the webhook
right-sized from its workload's recommendation (``sharing.admission.right_sizing``) adds
``"predictedMilli"``: the compute it is predicted to use, while its ``milli`` is what placement
counts (``sharing.rules.right_sizing.accounted_milli``: less where the namespace's policy
over-commits compute) and its MPS share has no SM cap; absent on every other container, and on
records written before it, which read as not right-sized. The JSON has sorted keys
and no spaces, so the same decision always gives the same text (the webhook's reinvocation
check compares it).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Final, get_args

from mig.errors import RequestError
from mig.units import parse_quantity
from sharing.api.backend import DEFAULT_BACKEND, POD_CLAIM, Backend, is_backend
from sharing.api.keys import (
    ALLOCATION_ANNOTATION, CAPACITY_GATE, KUEUE_ADMISSION_GATE, NVIDIA_PREFIX, OWN_PREFIX, SHARED_RESOURCE,
    WHOLE_RESOURCE, mig_resource,
)
from sharing.api.fields import as_list, as_map
from sharing.api.fields import is_int as _is_int
from sharing.api.modes import ALLOCATION_MODES, AllocationMode
from sharing.api.json_records import json_record, record_text
from sharing.api.request import ContainerKind

VERSION: Final = "v1"
_KINDS: Final = get_args(ContainerKind)


class AllocationError(ValueError):
    """An annotation that is not a gpupack allocation record (what is wrong, and where)."""


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container was given."""

    name: str
    kind: ContainerKind
    milli: int
    memory_bytes: int | None
    resource: str
    profile: str | None = None
    predicted_milli: int | None = None
    """Right-sized: the compute the container is predicted to use; ``milli`` is what placement counts
    (module docstring). None: not right-sized."""


@dataclass(frozen=True)
class Allocation:
    """What the webhook decided for a pod."""

    mode: AllocationMode
    gated: bool
    capacity_existed: bool
    """False: the pod waits for capacity to be created, not only for the engine's choice."""
    policy: str
    reason: str
    containers: tuple[ContainerAllocation, ...]
    gpu_model: str | None = None
    replicas: int | None = None
    backend: Backend = DEFAULT_BACKEND
    claim: str | None = None
    """DRA backend: the ResourceClaim the pod references as ``gpupack``."""
    mig_fallback: tuple[str, ...] | None = None
    """DRA backend, shared modes decided for ``auto``: per container the MIG profile the engine may
    place the pod on when no shared GPU has room (None: the mode is final)."""

    def to_annotation(self) -> str:
        """The annotation's text."""
        record: dict[str, Any] = {
            "version": VERSION, "mode": self.mode, "gated": self.gated, "capacityExisted": self.capacity_existed,
            "policy": self.policy, "reason": self.reason,
            "containers": [
                {
                    "name": c.name, "kind": c.kind, "milli": c.milli, "resource": c.resource,
                    **({"memoryBytes": c.memory_bytes} if c.memory_bytes is not None else {}),
                    **({"profile": c.profile} if c.profile else {}),
                    **({"predictedMilli": c.predicted_milli} if c.predicted_milli is not None else {}),
                }
                for c in self.containers
            ],
        }
        if self.gpu_model is not None:
            record["gpuModel"] = self.gpu_model
        if self.replicas is not None:
            record["replicas"] = self.replicas
        if self.backend != DEFAULT_BACKEND:
            record["backend"] = self.backend
        if self.claim is not None:
            record["claim"] = self.claim
        if self.mig_fallback is not None:
            record["migFallback"] = list(self.mig_fallback)
        return record_text(record)

    def mismatch(self, pod_spec: Mapping[str, Any]) -> str | None:
        """Why the pod's containers do not request what this record says; None when they do.

        The annotation is plain text any pod creator can write, so a record counts only
        when it describes what the pod really asks the device plugin for: the webhook
        writes ``limits[resource] = 1`` for every container it records, in the resource
        of the record's mode. A record that claims GPUs the pod does not request (a
        forged one) must not make gpupack count capacity as taken or release the pod.
        On the DRA backend the pod must reference the record's claim as ``gpupack`` and
        every recorded container must name its request of that claim.
        """
        if self.mode == "cpu":
            return gpu_ask(pod_spec)
        if self.backend == "dra":
            return self._claim_mismatch(pod_spec)
        for c in self.containers:
            expected = resource_for(self.mode, c.profile)
            if expected is None or c.resource != expected:
                return f"container {c.name!r}: resource {c.resource!r} is not what mode {self.mode!r} is given"
            container = next((x for x in as_list(pod_spec.get(c.kind)) if as_map(x).get("name") == c.name), None)
            if container is None:
                return f"the pod has no {c.kind} container {c.name!r}"
            limit = as_map(as_map(as_map(container).get("resources")).get("limits")).get(c.resource)
            try:
                requested = parse_quantity(limit) if limit is not None else None
            except RequestError:
                requested = None
            if requested != 1:
                return f"container {c.name!r} does not request {c.resource}: 1 (limits say {limit!r})"
        return None

    def _claim_mismatch(self, pod_spec: Mapping[str, Any]) -> str | None:
        if not self.claim:
            return "a DRA record names no claim"
        entry = next((as_map(x) for x in as_list(pod_spec.get("resourceClaims")) if as_map(x).get("name") == POD_CLAIM), None)
        if entry is None or entry.get("resourceClaimName") != self.claim:
            return f"the pod does not reference ResourceClaim {self.claim!r} as {POD_CLAIM!r}"
        for c in self.containers:
            container = next((x for x in as_list(pod_spec.get(c.kind)) if as_map(x).get("name") == c.name), None)
            if container is None:
                return f"the pod has no {c.kind} container {c.name!r}"
            claims = as_list(as_map(as_map(container).get("resources")).get("claims"))
            if not any(as_map(x).get("name") == POD_CLAIM and as_map(x).get("request") == c.resource for x in claims):
                return f"container {c.name!r} does not use request {c.resource!r} of claim {POD_CLAIM!r}"
        return None

    @classmethod
    def from_annotation(cls, text: object) -> Allocation:
        """The record in ``text``; :class:`AllocationError` naming the first problem otherwise."""
        raw = json_record(text, ALLOCATION_ANNOTATION, AllocationError)
        if raw.get("version", VERSION) != VERSION:
            raise AllocationError(f"{ALLOCATION_ANNOTATION} version {raw.get('version')!r} is not {VERSION!r}")
        mode = raw.get("mode")
        if mode not in ALLOCATION_MODES:
            raise AllocationError(f"{ALLOCATION_ANNOTATION} mode {mode!r} is not one of {', '.join(ALLOCATION_MODES)}")
        containers = raw.get("containers")
        if mode == "cpu":
            # A pod that asks for no GPU: nothing per container, and only the DRA pool places it.
            if containers not in (None, []):
                raise AllocationError(f"{ALLOCATION_ANNOTATION} mode 'cpu' records no containers")
            if raw.get("backend") != "dra" or raw.get("claim") is not None:
                raise AllocationError(f"{ALLOCATION_ANNOTATION} mode 'cpu' belongs to the DRA pool and names no claim")
            containers = []
        elif not isinstance(containers, list) or not containers:
            raise AllocationError(f"{ALLOCATION_ANNOTATION} has no containers")
        replicas, gpu_model, gated = raw.get("replicas"), raw.get("gpuModel"), raw.get("gated") is True
        existed = raw.get("capacityExisted")
        backend, claim = raw.get("backend", DEFAULT_BACKEND), raw.get("claim")
        if not is_backend(backend):
            raise AllocationError(f"{ALLOCATION_ANNOTATION} backend {backend!r} is not a gpupack backend")
        fallback = _mig_fallback(raw.get("migFallback"), mode, backend, len(containers))
        return cls(
            mode=mode,
            gated=gated,
            # Records written before capacityExisted: a gated pod was one waiting for capacity.
            capacity_existed=existed if isinstance(existed, bool) else not gated,
            policy=str(raw.get("policy") or ""),
            reason=str(raw.get("reason") or ""),
            containers=tuple(_container(c, i) for i, c in enumerate(containers)),
            gpu_model=gpu_model if isinstance(gpu_model, str) else None,
            replicas=replicas if _is_int(replicas) else None,
            backend=backend,
            claim=claim if isinstance(claim, str) and claim else None,
            mig_fallback=fallback,
        )


def gpu_ask(pod_spec: Mapping[str, Any]) -> str | None:
    """Why a pod recorded as asking for no GPU (mode ``cpu``) does ask for one; None when it does not:
    a ``gpupack.io/*``, ``nvidia.com/*`` resource or a claim, in any container, or a pod claim."""
    if as_list(pod_spec.get("resourceClaims")):
        return "a pod recorded as asking for no GPU references a ResourceClaim"
    for kind in _KINDS:
        for container in as_list(pod_spec.get(kind)):
            resources = as_map(as_map(container).get("resources"))
            names = [*as_map(resources.get("limits")), *as_map(resources.get("requests"))]
            gpu = next((str(n) for n in names if str(n).startswith((OWN_PREFIX, NVIDIA_PREFIX))), None)
            if gpu is not None:
                return f"container {as_map(container).get('name')!r} asks for {gpu}, not for no GPU"
            if as_list(resources.get("claims")):
                return f"container {as_map(container).get('name')!r} uses a ResourceClaim"
    return None


def resource_for(mode: AllocationMode, profile: str | None) -> str | None:
    """The device-plugin resource a container of ``mode`` is given (``profile``: its MIG profile).

    The one rule: the webhook writes it (``sharing.admission.decision``) and :meth:`Allocation.mismatch`
    checks it. None for a MIG container without a profile, and for mode ``cpu`` (no GPU).
    """
    if mode == "cpu":
        return None
    if mode == "mig":
        return mig_resource(profile) if profile else None
    return WHOLE_RESOURCE if mode == "whole" else SHARED_RESOURCE


def trusted_allocation(text: object, pod_spec: Mapping[str, Any]) -> tuple[Allocation | None, str | None]:
    """The record in annotation ``text`` if the pod (``pod_spec``) requests what it says; else None and why not.

    The webhook (refusing hand-written records) and the controller (ignoring them) both read
    a pod's record through this, so they trust the same records.
    """
    try:
        allocation = Allocation.from_annotation(text)
    except AllocationError as exc:
        return None, str(exc)
    mismatch = allocation.mismatch(pod_spec)
    if mismatch is not None:
        return None, f"{ALLOCATION_ANNOTATION} does not match the pod's requests: {mismatch}"
    return allocation, None


def has_capacity_gate(pod_spec: Mapping[str, Any]) -> bool:
    """Whether the pod waits at gpupack's scheduling gate."""
    return any(as_map(g).get("name") == CAPACITY_GATE for g in as_list(pod_spec.get("schedulingGates")))


def held_by_kueue(pod_spec: Mapping[str, Any]) -> bool:
    """Whether the pod still waits at Kueue's admission gate (its quota): not demand for gpupack yet."""
    return any(as_map(g).get("name") == KUEUE_ADMISSION_GATE for g in as_list(pod_spec.get("schedulingGates")))


def _mig_fallback(raw: object, mode: AllocationMode, backend: Backend, containers: int) -> tuple[str, ...] | None:
    """The record's ``migFallback``: None when absent; one profile per container, on a shared DRA record."""
    if raw is None:
        return None
    where = f"{ALLOCATION_ANNOTATION} migFallback"
    if not isinstance(raw, list) or len(raw) != containers or not all(isinstance(p, str) and p for p in raw):
        raise AllocationError(f"{where} {raw!r} is not one MIG profile per container ({containers})")
    if backend != "dra" or mode not in ("mps", "time-slicing"):
        raise AllocationError(f"{where} belongs to a shared mode on the DRA pool, not to mode {mode!r} on {backend}")
    return tuple(raw)


def _container(raw: object, position: int) -> ContainerAllocation:
    where = f"{ALLOCATION_ANNOTATION} containers[{position}]"
    if not isinstance(raw, dict):
        raise AllocationError(f"{where} is not an object")
    milli, memory, kind = raw.get("milli"), raw.get("memoryBytes"), raw.get("kind", "containers")
    if not isinstance(milli, int) or isinstance(milli, bool) or not 1 <= milli <= 1000:
        raise AllocationError(f"{where}.milli {milli!r} is not 1..1000")
    if memory is not None and (not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0):
        raise AllocationError(f"{where}.memoryBytes {memory!r} is not a positive integer")
    if kind not in _KINDS:
        raise AllocationError(f"{where}.kind {kind!r} is not one of {', '.join(_KINDS)}")
    profile, predicted = raw.get("profile"), raw.get("predictedMilli")
    if predicted is not None and (not isinstance(predicted, int) or isinstance(predicted, bool)
                                  or not 1 <= predicted <= 1000):
        raise AllocationError(f"{where}.predictedMilli {predicted!r} is not 1..1000")
    return ContainerAllocation(
        name=str(raw.get("name") or ""),
        kind=kind,
        milli=milli,
        memory_bytes=memory,
        resource=str(raw.get("resource") or ""),
        profile=profile if isinstance(profile, str) and profile else None,
        predicted_milli=predicted,
    )

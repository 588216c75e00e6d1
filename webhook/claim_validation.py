"""Checks on users' ResourceClaims and ResourceClaimTemplates that ask for gpupack's devices.

``sharing.admission.dra_claims.check_claim`` knows what gpupack's devices can never serve
(a share above a whole GPU, an unknown MIG profile, more memory than any GPU
has); this module gives it the cluster's bounds and turns its problems into
one denial. The bounds are the DRA node pool's (``Inventory.pool``): only its
devices serve claims. With no DRA node yet, memory is not bounded, any MIG
profile of gpupack's catalog is accepted and whole GPUs are bounded by the most
a GPUNode may hold: the pool may still be filling, and a claim that no device
serves only stays pending. The claim's namespace's SharingPolicy
(``Inventory.policy_for``) bounds it as it bounds the webhook's decision for a
pod of that namespace: a tenant's own claim gets no mode or profile the
webhook would not have given it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sharing.api.crd import MAX_GPUS_PER_NODE
from sharing.admission.dra_claims import KNOWN_PROFILES, ClaimBounds, ClaimProblem, check_claim
from sharing.admission.inventory import Inventory

GROUP: Final = "resource.k8s.io"
KINDS: Final = ("ResourceClaim", "ResourceClaimTemplate")
_MIB: Final = 1024**2


@dataclass(frozen=True)
class Bounds:
    """What the DRA pool's GPUs can serve."""

    largest_gpu_memory_bytes: int | None
    profiles: Collection[str]
    most_gpus: int = MAX_GPUS_PER_NODE
    """The GPUs of the pool's largest node (the most a request of whole GPUs may count)."""


def bounds(inventory: Inventory) -> Bounds:
    pool = inventory.pool("dra")
    profiles = frozenset(p.name for m in pool.mig_models for p in m.profiles)
    most = max((len(n.gpus) for n in pool.nodes), default=0)
    return Bounds(pool.max_gpu_memory_mib * _MIB or None, profiles or KNOWN_PROFILES, most or MAX_GPUS_PER_NODE)


def claim_problems(obj: Mapping[str, Any], inventory: Inventory, namespace: str) -> tuple[ClaimProblem, ...]:
    """Every reason gpupack's devices could never serve ``obj`` (a claim or a template in ``namespace``),
    or the namespace's SharingPolicy would not give a pod of it what ``obj`` asks."""
    b = bounds(inventory)
    return check_claim(obj, largest_gpu_memory_bytes=b.largest_gpu_memory_bytes, profiles=b.profiles,
                       bounds=ClaimBounds(inventory.policy_for(namespace), b.most_gpus))


def denial_message(kind: str, name: str, problems: tuple[ClaimProblem, ...]) -> str:
    """One message naming each problem with its reason code."""
    listed = "; ".join(f"[{p.reason}] {p.message}" for p in problems)
    return f"{kind} {name} cannot be served by gpupack's devices: {listed}"


def same_spec(obj: Mapping[str, Any], old: object) -> bool:
    """An update that leaves the spec as it was (claims' and templates' specs are immutable, so
    every update is one: finalizers, labels). It was checked at create; checking it again
    against a changed inventory would refuse kube-scheduler's own metadata writes."""
    return isinstance(old, Mapping) and old.get("spec") == obj.get("spec")

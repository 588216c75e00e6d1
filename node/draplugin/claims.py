"""What a ResourceClaim was allocated, as typed values, and where the plugin reads it from.

The kubelet sends the plugin only claim references (namespace, name, UID): the
allocation itself is in the ResourceClaim's ``status.allocation.devices.results``
(one entry per device: request, driver, pool, device, ``shareID`` and
``consumedCapacity`` for a share of a shared device), and the configuration the claim gave its
requests in ``status.allocation.devices.config`` (a right-sized share's predicted use,
``sharing.dra.share_config``, kept on each result). That configuration is honoured only on a claim
the controller created: one carrying its ``gpupack.io/dra-pinned`` annotation, which only the
controller's ServiceAccount may write (the ``gpupack-claim-marks`` ValidatingAdmissionPolicy,
``manifests/rbac/claim-marks-policy.yaml``). A tenant's own claim naming itself right-sized would
otherwise lift its share's SM cap. A :class:`ClaimSource`
returns those entries for one claim; :func:`allocation_from_claim` is the one
reading of the API's JSON, shared by every source (the API server's, a file's).

A claim that cannot be read (not found, recreated under the same name, not
allocated, a malformed entry) raises :class:`ClaimError`, whose message goes to
the kubelet as that claim's error; it never stops the other claims of a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sharing.api.keys import DRA_PINNED_ANNOTATION
from sharing.dra.results import AllocatedDevice, ResultError, read_result
from sharing.dra.share_config import predicted_by_request


class ClaimError(Exception):
    """A claim cannot be prepared or unprepared; the message is the kubelet's per-claim error."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it (``dra.v1.Claim``)."""

    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (UID {self.uid})"


class ClaimSource(Protocol):
    """Where the plugin reads a claim's allocation (the API server; a file in simulation and tests)."""

    def get(self, claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
        """Every allocation result of ``claim`` (all drivers'); raises :class:`ClaimError`."""
        ...


def allocation_from_claim(obj: Mapping[str, Any], claim: ClaimRef) -> tuple[AllocatedDevice, ...]:
    """The allocation results of the ResourceClaim ``obj``, checked to be ``claim``; raises :class:`ClaimError`."""
    if not isinstance(obj, Mapping):
        raise ClaimError(f"{claim}: the API returned {type(obj).__name__}, not a ResourceClaim object")
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if uid != claim.uid:
        raise ClaimError(f"{claim}: the ResourceClaim of that name has UID {uid!r}; it was deleted and "
                         "recreated, and the claim the kubelet asks for no longer exists")
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{claim} is not allocated (no status.allocation): nothing to prepare")
    devices = allocation.get("devices")
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        raise ClaimError(f"{claim}: status.allocation.devices.results is missing or not a list")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    controllers = isinstance(annotations, Mapping) and DRA_PINNED_ANNOTATION in annotations
    try:
        predicted = predicted_by_request(allocation, f"{claim}: status.allocation") if controllers else {}
    except ResultError as exc:
        raise ClaimError(str(exc)) from None
    read = (_result(raw, claim, i) for i, raw in enumerate(results))
    return tuple(replace(r, predicted_milli=predicted.get(r.request, predicted.get(r.base_request, predicted.get("*"))))
                 for r in read)


def _result(raw: object, claim: ClaimRef, index: int) -> AllocatedDevice:
    try:
        return read_result(raw, f"{claim}: status.allocation.devices.results[{index}]")
    except ResultError as exc:
        raise ClaimError(str(exc)) from None

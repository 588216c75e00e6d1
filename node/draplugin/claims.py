"""What a ResourceClaim was allocated, as typed values, and where the plugin reads it from.

The kubelet sends the plugin only claim references (namespace, name, UID): the
allocation itself is in the ResourceClaim's ``status.allocation.devices.results``
(one entry per device: request, driver, pool, device, ``shareID`` and
``consumedCapacity`` for a share of a shared device). A :class:`ClaimSource`
returns those entries for one claim; :func:`allocation_from_claim` is the one
reading of the API's JSON, shared by every source (the API server's, a file's).

A claim that cannot be read (not found, recreated under the same name, not
allocated, a malformed entry) raises :class:`ClaimError`, whose message goes to
the kubelet as that claim's error; it never stops the other claims of a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NotRequired, Protocol, TypedDict

from mig.errors import MigError
from mig.units import parse_quantity


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


@dataclass(frozen=True)
class AllocatedDevice:
    """One ``DeviceRequestAllocationResult``; quantities in ``consumed`` as integers (milli, bytes)."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed: Mapping[str, int] = field(default_factory=dict)
    admin_access: bool = False

    @property
    def base_request(self) -> str:
        """The claim's request a container names: ``gpu`` for a ``firstAvailable`` subrequest ``gpu/big``."""
        return self.request.split("/", 1)[0]


class DeviceResultJSON(TypedDict):
    """``status.allocation.devices.results[]`` of a ``resource.k8s.io/v1`` ResourceClaim (fields read here)."""

    request: str
    driver: str
    pool: str
    device: str
    adminAccess: NotRequired[bool]
    shareID: NotRequired[str]
    consumedCapacity: NotRequired[dict[str, str]]


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
    return tuple(_result(raw, claim, i) for i, raw in enumerate(results))


def _result(raw: object, claim: ClaimRef, index: int) -> AllocatedDevice:
    where = f"{claim}: status.allocation.devices.results[{index}]"
    if not isinstance(raw, Mapping):
        raise ClaimError(f"{where} is not an object")
    values: dict[str, str] = {}
    for key in ("request", "driver", "pool", "device"):
        value = raw.get(key)
        if not isinstance(value, str) or not value:
            raise ClaimError(f"{where}.{key} is missing or not a string")
        values[key] = value
    share_id = raw.get("shareID")
    if share_id is not None and not isinstance(share_id, str):
        raise ClaimError(f"{where}.shareID is not a string")
    consumed_raw = raw.get("consumedCapacity") or {}
    if not isinstance(consumed_raw, Mapping):
        raise ClaimError(f"{where}.consumedCapacity is not an object")
    consumed: dict[str, int] = {}
    for name, text in consumed_raw.items():
        try:
            amount = parse_quantity(text)
        except MigError as exc:
            raise ClaimError(f"{where}.consumedCapacity[{name}]: {exc}") from None
        if amount < 0 or amount != amount.to_integral_value() or amount > Decimal(2**62):
            raise ClaimError(f"{where}.consumedCapacity[{name}] = {text!r} is not a whole, non-negative amount")
        consumed[str(name)] = int(amount)
    return AllocatedDevice(values["request"], values["driver"], values["pool"], values["device"], share_id or None,
                           consumed, raw.get("adminAccess") is True)

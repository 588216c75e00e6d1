"""One entry of a ResourceClaim's ``status.allocation.devices.results``, read into a typed value.

The one reading of an allocation result (request, driver, pool, device,
``shareID``, ``consumedCapacity``), shared by the kubelet plugin (which refuses
a claim with a malformed entry, ``node.draplugin.claims``) and the controller
(which counts what each device holds and names what it skips,
``controller.state.dra_usage``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NotRequired, TypedDict

from mig.errors import MigError
from mig.units import parse_quantity


class ResultError(ValueError):
    """An allocation result that does not read; the message names the field."""


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
    predicted_milli: int | None = None
    """A right-sized share: the compute its container is predicted to use, from the claim's
    configuration (``sharing.dra.share_config``), not from the result itself; None: not right-sized."""

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


def read_result(raw: object, where: str) -> AllocatedDevice:
    """One allocation result (``where`` names it in errors); :class:`ResultError` naming the problem."""
    if not isinstance(raw, Mapping):
        raise ResultError(f"{where} is not an object")
    values: dict[str, str] = {}
    for key in ("request", "driver", "pool", "device"):
        value = raw.get(key)
        if not isinstance(value, str) or not value:
            raise ResultError(f"{where}.{key} is missing or not a string")
        values[key] = value
    share_id = raw.get("shareID")
    if share_id is not None and not isinstance(share_id, str):
        raise ResultError(f"{where}.shareID is not a string")
    consumed_raw = raw.get("consumedCapacity") or {}
    if not isinstance(consumed_raw, Mapping):
        raise ResultError(f"{where}.consumedCapacity is not an object")
    consumed: dict[str, int] = {}
    for name, text in consumed_raw.items():
        try:
            amount = parse_quantity(text)
        except MigError as exc:
            raise ResultError(f"{where}.consumedCapacity[{name}]: {exc}") from None
        if amount < 0 or amount != amount.to_integral_value() or amount > Decimal(2**62):
            raise ResultError(f"{where}.consumedCapacity[{name}] = {text!r} is not a whole, non-negative amount")
        consumed[str(name)] = int(amount)
    return AllocatedDevice(values["request"], values["driver"], values["pool"], values["device"], share_id or None,
                           consumed, raw.get("adminAccess") is True)


NODE_NAME_FIELD = "metadata.name"
"""The node field kube-scheduler's allocation nodeSelector names a node's slices by."""


def allocated_node(allocation: object) -> str | None:
    """The one node a claim's ``status.allocation`` is confined to, or None when it names no single node.

    For devices of a slice with ``spec.nodeName`` kube-scheduler writes ``nodeSelector:
    {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [<node>]}]}]}``.
    gpupack's pool of a node is named after it (``sharing.dra.slices``), so a result whose ``pool``
    is not this node came from a slice published in another node's pool: its devices are not where
    the pod runs, and a reader must not charge that pool for them."""
    if not isinstance(allocation, Mapping):
        return None
    selector = allocation.get("nodeSelector")
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    if not isinstance(terms, list) or len(terms) != 1 or not isinstance(terms[0], Mapping):
        return None
    fields = terms[0].get("matchFields")
    if not isinstance(fields, list) or len(fields) != 1 or not isinstance(fields[0], Mapping):
        return None
    field_ = fields[0]
    values = field_.get("values")
    if (field_.get("key") != NODE_NAME_FIELD or field_.get("operator") != "In" or not isinstance(values, list)
            or len(values) != 1 or not isinstance(values[0], str) or not values[0]):
        return None
    return values[0]

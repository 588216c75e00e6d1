"""Value types of what gpupack's DRA driver publishes: counter sets, devices, capacities, slices.

They mirror ``resource.k8s.io/v1`` (``CounterSet``, ``Device``,
``DeviceCapacity``, ``CapacityRequestPolicy``, ``ResourceSlice``) closely
enough that ``sharing.dra.wire`` is a field-by-field translation, but hold
plain integers (bytes, milli, counts) instead of quantity strings, so
builders and tests compute with them. Mappings keep insertion order, which the
builders make deterministic: the same inputs give equal objects and the same
JSON, so the agent can diff what it publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sharing.dra.names import DRIVER, KIND

AttributeValue = bool | int | str
"""An attribute's value: the API's ``bool``, ``int`` or ``string`` (gpupack publishes no versions)."""


class DraModelError(ValueError):
    """Input the device model cannot publish (overlapping in-use instances, a bad share policy,
    duplicate GPU indices); the message names the input and the rule."""


@dataclass(frozen=True)
class ValidRange:
    """``CapacityRequestPolicyRange``: requests below ``min`` consume ``min``; others are rounded
    up to ``min + n * step``; above ``max`` the device cannot serve the request."""

    min: int
    max: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class RequestPolicy:
    """``CapacityRequestPolicy`` with a ``validRange`` (gpupack uses no ``validValues``)."""

    default: int
    valid_range: ValidRange


@dataclass(frozen=True)
class Capacity:
    """``DeviceCapacity``: a total, and how one allocation consumes it (shared devices only)."""

    value: int
    request_policy: RequestPolicy | None = None


@dataclass(frozen=True)
class CounterSet:
    """``CounterSet``: counters a pool's devices consume from; a device's allocation takes its share."""

    name: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class CounterConsumption:
    """``DeviceCounterConsumption``: what one device takes from one counter set."""

    counter_set: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class Device:
    """``Device``: attribute and capacity names are fully qualified (``sharing.dra.names``)."""

    name: str
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, Capacity]
    consumes_counters: tuple[CounterConsumption, ...] = ()
    allow_multiple_allocations: bool = False

    @property
    def kind(self) -> str:
        """The ``kind`` attribute (``mig``, ``gpu`` or ``shared``)."""
        return str(self.attributes[KIND])


@dataclass(frozen=True)
class GpuOffer:
    """What one GPU offers: its counter set (partitionable GPUs only) and its devices, in the
    order the allocator should try them."""

    index: int
    devices: tuple[Device, ...]
    counter_set: CounterSet | None = None


@dataclass(frozen=True)
class ResourceSlice:
    """One ``ResourceSlice`` of a node's pool: either counter sets or devices, never both."""

    name: str
    node_name: str
    pool: str
    generation: int
    slice_count: int
    driver: str = DRIVER
    devices: tuple[Device, ...] = ()
    shared_counters: tuple[CounterSet, ...] = ()
    owner_uid: str | None = None
    """The Node's UID: set, the slice is owned by the Node and goes when the Node goes."""

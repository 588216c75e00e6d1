"""gpupack's DRA objects as the API's JSON: ResourceSlices and DeviceClasses (``resource.k8s.io/v1``).

A field-by-field translation of ``sharing.dra.model``; integers become
quantity strings (bytes with a binary suffix when they divide evenly:
``81559Mi``, ``20Gi``). The API server stores quantities in canonical form
(``1000`` reads back as ``1k``), so compare what it returns by value
(``mig.units.parse_quantity``), not by text.

The DeviceClasses shipped in ``manifests/dra/deviceclasses.yaml`` are
:func:`device_classes`; a unit test keeps the two equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NotRequired, TypedDict

from sharing.dra import names
from sharing.dra.model import Capacity, CounterConsumption, CounterSet, Device, ResourceSlice

_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity(value: int) -> str:
    """An integer as a Kubernetes quantity: the largest binary suffix that divides it, else plain."""
    for suffix, size in _BINARY:
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    return str(value)


class CounterJSON(TypedDict):
    value: str


class CounterSetJSON(TypedDict):
    name: str
    counters: dict[str, CounterJSON]


class ConsumptionJSON(TypedDict):
    counterSet: str
    counters: dict[str, CounterJSON]


class RangeJSON(TypedDict):
    min: str
    max: NotRequired[str]
    step: NotRequired[str]


class RequestPolicyJSON(TypedDict):
    default: str
    validRange: RangeJSON


class CapacityJSON(TypedDict):
    value: str
    requestPolicy: NotRequired[RequestPolicyJSON]


AttributeJSON = TypedDict("AttributeJSON", {"bool": bool, "int": int, "string": str}, total=False)


class DeviceJSON(TypedDict):
    name: str
    attributes: dict[str, AttributeJSON]
    capacity: dict[str, CapacityJSON]
    consumesCounters: NotRequired[list[ConsumptionJSON]]
    allowMultipleAllocations: NotRequired[bool]


class PoolJSON(TypedDict):
    name: str
    generation: int
    resourceSliceCount: int


class SliceSpecJSON(TypedDict):
    driver: str
    pool: PoolJSON
    nodeName: str
    devices: NotRequired[list[DeviceJSON]]
    sharedCounters: NotRequired[list[CounterSetJSON]]


class OwnerJSON(TypedDict):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class MetadataJSON(TypedDict):
    name: str
    ownerReferences: NotRequired[list[OwnerJSON]]


class ResourceSliceJSON(TypedDict):
    apiVersion: str
    kind: Literal["ResourceSlice"]
    metadata: MetadataJSON
    spec: SliceSpecJSON


class CELJSON(TypedDict):
    expression: str


class SelectorJSON(TypedDict):
    cel: CELJSON


class DeviceClassSpecJSON(TypedDict):
    selectors: list[SelectorJSON]


class ClassMetadataJSON(TypedDict):
    name: str


class DeviceClassJSON(TypedDict):
    apiVersion: str
    kind: Literal["DeviceClass"]
    metadata: ClassMetadataJSON
    spec: DeviceClassSpecJSON


def _counters(counters: Mapping[str, int]) -> dict[str, CounterJSON]:
    return {name: {"value": quantity(value)} for name, value in counters.items()}


def _attribute(value: bool | int | str) -> AttributeJSON:
    if isinstance(value, bool):  # before int: bool is an int
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def _capacity(capacity: Capacity) -> CapacityJSON:
    out: CapacityJSON = {"value": quantity(capacity.value)}
    policy = capacity.request_policy
    if policy is not None:
        valid: RangeJSON = {"min": quantity(policy.valid_range.min)}
        if policy.valid_range.max is not None:
            valid["max"] = quantity(policy.valid_range.max)
        if policy.valid_range.step is not None:
            valid["step"] = quantity(policy.valid_range.step)
        out["requestPolicy"] = {"default": quantity(policy.default), "validRange": valid}
    return out


def counter_set_json(counter_set: CounterSet) -> CounterSetJSON:
    return {"name": counter_set.name, "counters": _counters(counter_set.counters)}


def consumption_json(used: CounterConsumption) -> ConsumptionJSON:
    return {"counterSet": used.counter_set, "counters": _counters(used.counters)}


def device_json(device: Device) -> DeviceJSON:
    out: DeviceJSON = {
        "name": device.name,
        "attributes": {name: _attribute(value) for name, value in device.attributes.items()},
        "capacity": {name: _capacity(capacity) for name, capacity in device.capacity.items()},
    }
    if device.consumes_counters:
        out["consumesCounters"] = [consumption_json(c) for c in device.consumes_counters]
    if device.allow_multiple_allocations:
        out["allowMultipleAllocations"] = True
    return out


def slice_json(item: ResourceSlice) -> ResourceSliceJSON:
    """One slice as the body of a create or update (``resource.k8s.io/v1``)."""
    spec: SliceSpecJSON = {
        "driver": item.driver,
        "pool": {"name": item.pool, "generation": item.generation, "resourceSliceCount": item.slice_count},
        "nodeName": item.node_name,
    }
    if item.devices:
        spec["devices"] = [device_json(d) for d in item.devices]
    if item.shared_counters:
        spec["sharedCounters"] = [counter_set_json(c) for c in item.shared_counters]
    metadata: MetadataJSON = {"name": item.name}
    if item.owner_uid is not None:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": item.node_name,
                                        "uid": item.owner_uid, "controller": True}]
    return {"apiVersion": names.API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}


def device_class(kind: names.DeviceKind) -> DeviceClassJSON:
    """The DeviceClass of gpupack's devices of ``kind``."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": names.CLASS_OF_KIND[kind]},
        "spec": {"selectors": [{"cel": {"expression": names.class_selector(kind)}}]},
    }


def device_classes() -> list[DeviceClassJSON]:
    """gpupack's DeviceClasses: one per device kind."""
    return [device_class(kind) for kind in names.KINDS]

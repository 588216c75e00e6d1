"""The devices the controller pinned a ResourceClaim to: one typed value, written and read here.

On a DRA node pool gpupack's packing engine chooses the node and the device of
every gpupack pod, and the controller creates the pod's ResourceClaim with CEL
selectors that only that device satisfies (docs/dra-placement.md).
kube-scheduler allocates the claim later, when it schedules the pod; until then
the claim's ``status`` says nothing, yet the device is promised. The
``gpupack.io/dra-pinned`` annotation on the claim records the promise, so that
the next cycle (this controller's or a new leader's) counts it as taken:

    {"version": "v1", "node": "gpu-node-1", "devices": [
      {"request": "gpu-0", "kind": "shared", "gpu": 1, "milli": 300, "memoryBytes": 21474836480},
      {"request": "gpu-1", "kind": "mig", "gpu": 0, "profile": "1g.10gb", "start": 6}]}

``milli`` and ``memoryBytes`` are what a share consumes (already rounded by
``SharePolicy``), present on ``shared`` devices only; ``profile`` and ``start``
on ``mig`` devices only. :class:`PinnedDevice` is also how the controller reads
an allocated device back (``controller.state.dra_usage``): one value type for "what a
claim holds of a device", promised or allocated.

:meth:`PinnedDevice.selectors` are the CEL selectors that pin a request to the
device: its GPU index (and, for MIG, its placement start) within the pool of
the node the pod is pinned to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from mig.model import GpuModel, PlacedInstance
from sharing.dra import names
from sharing.dra.wire import SelectorJSON
from sharing.api.keys import DRA_PINNED_ANNOTATION
from sharing.api.json_records import record_text, versioned_record

ANNOTATION: Final = DRA_PINNED_ANNOTATION
VERSION: Final = "v1"


class PinnedError(ValueError):
    """An annotation that is not a pinned-devices record (what is wrong, and where)."""


@dataclass(frozen=True)
class PinnedDevice:
    """One request of a claim and the device it holds (or is promised)."""

    request: str
    kind: names.DeviceKind
    gpu: int
    milli: int = 0
    """Shared devices: milli the request consumes."""
    memory_bytes: int = 0
    """Shared devices: bytes the request consumes."""
    profile: str | None = None
    """MIG devices: the profile, NVIDIA's spelling."""
    start: int | None = None
    """MIG devices: the placement's first memory slice."""

    def __post_init__(self) -> None:
        if self.kind not in names.KINDS:
            raise PinnedError(f"request {self.request!r}: kind {self.kind!r} is not one of {', '.join(names.KINDS)}")
        if self.gpu < 0:
            raise PinnedError(f"request {self.request!r}: GPU index {self.gpu} is negative")
        if self.kind == "mig" and (not self.profile or self.start is None or self.start < 0):
            raise PinnedError(f"request {self.request!r}: a MIG device needs a profile and a start")
        if self.kind == "shared" and (self.milli <= 0 or self.memory_bytes <= 0):
            raise PinnedError(f"request {self.request!r}: a share needs positive milli and memoryBytes")

    @property
    def device(self) -> str:
        """The device's name in the node's pool (``sharing.dra.names``)."""
        if self.kind == "mig":
            assert self.profile is not None and self.start is not None
            return names.mig_device_name(self.gpu, self.profile, self.start)
        return names.shared_device_name(self.gpu) if self.kind == "shared" else names.gpu_device_name(self.gpu)

    def placed(self, model: GpuModel | None) -> PlacedInstance | None:
        """A MIG device's instance on a GPU of ``model``: its profile at its start; None for another
        kind, or a profile or start the model does not have."""
        if model is None or self.kind != "mig" or self.profile is None or not model.has_profile(self.profile):
            return None
        placement = next((p for p in model.profile(self.profile).placements if p.start == self.start), None)
        return None if placement is None else PlacedInstance(self.profile, placement)

    def selectors(self) -> list[SelectorJSON]:
        """CEL selectors only this device of the node's pool satisfies (with the request's DeviceClass
        and, for MIG, its profile selector): the GPU's index, and a MIG placement's start."""
        out = [_equals(names.INDEX, self.gpu)]
        if self.kind == "mig":
            assert self.start is not None
            out.append(_equals(names.PLACEMENT_START, self.start))
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "kind": self.kind, "gpu": self.gpu}
        if self.kind == "shared":
            out.update(milli=self.milli, memoryBytes=self.memory_bytes)
        if self.kind == "mig":
            out.update(profile=self.profile, start=self.start)
        return out


@dataclass(frozen=True)
class Pinned:
    """The node a claim's pod is pinned to and the device of each of its requests."""

    node: str
    devices: tuple[PinnedDevice, ...]

    def to_annotation(self) -> str:
        return record_text({"version": VERSION, "node": self.node, "devices": [d.to_json() for d in self.devices]})

    @classmethod
    def from_annotation(cls, text: object) -> Pinned:
        """The record in ``text``; :class:`PinnedError` naming the first problem otherwise."""
        raw = versioned_record(text, ANNOTATION, PinnedError, VERSION)
        node, devices = raw.get("node"), raw.get("devices")
        if not isinstance(node, str) or not node:
            raise PinnedError(f"{ANNOTATION} names no node")
        if not isinstance(devices, list) or not devices:
            raise PinnedError(f"{ANNOTATION} lists no devices")
        return cls(node, tuple(_device(d, i) for i, d in enumerate(devices)))


def _equals(attribute: str, value: int) -> SelectorJSON:
    domain, _, ident = attribute.partition("/")
    return {"cel": {"expression": f'device.attributes["{domain}"].{ident} == {value}'}}


def _int(raw: dict[str, Any], key: str, where: str, default: int | None = None) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise PinnedError(f"{where}.{key} {value!r} is not an integer")
    return value


def _device(raw: object, position: int) -> PinnedDevice:
    where = f"{ANNOTATION} devices[{position}]"
    if not isinstance(raw, dict):
        raise PinnedError(f"{where} is not an object")
    request, kind, profile = raw.get("request"), raw.get("kind"), raw.get("profile")
    if not isinstance(request, str) or not request:
        raise PinnedError(f"{where} names no request")
    if kind not in names.KINDS:
        raise PinnedError(f"{where}.kind {kind!r} is not one of {', '.join(names.KINDS)}")
    gpu = _int(raw, "gpu", where)
    if gpu is None:
        raise PinnedError(f"{where} names no GPU")
    try:
        return PinnedDevice(
            request=request, kind=kind, gpu=gpu,
            milli=_int(raw, "milli", where, 0) or 0,
            memory_bytes=_int(raw, "memoryBytes", where, 0) or 0,
            profile=profile if isinstance(profile, str) and profile else None,
            start=_int(raw, "start", where),
        )
    except PinnedError as exc:
        raise PinnedError(f"{where}: {exc}") from None

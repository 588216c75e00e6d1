"""A MIG-capable GPU in dynamic mode as partitionable devices: every placement a claim may take.

One counter set per GPU (``gpu-<index>``) holds what MIG instances use up:

* ``memory-slice-<k>`` = 1 for each of the GPU's memory slices. A placement
  consumes 1 of each slice it covers, so two placements that share a slice can
  never both be allocated (rule 2 of ``mig.geometry``);
* ``compute-slices`` = the GPU's compute slices (7, or 4 on A30); a placement
  consumes its profile's (rule 4; today's placement tables already imply it,
  the counter guards a table where they would not);
* ``media-extensions`` = 1 on GPUs with ``+me`` profiles, consumed by each of
  them (rule 5: one set of media extensions per GPU).

Rule 1 (allowed placements) holds because only allowed placements are
published, and rule 3 (a profile's maximum count) follows from the others on
every GPU of the catalog; ``tests/unit/test_dra_mig.py`` checks on every model
that a set of devices fits the counters exactly when ``mig.geometry`` accepts
it as a layout.

Devices: one per allowed placement of each allowed profile, named
``gpu-<i>-mig-<profile>-<start>``, plus the whole GPU (``gpu-<i>``, MIG
disabled), which consumes every counter. Their order is the order
kube-scheduler's first-fit allocator tries them in: smaller profiles first and,
within a profile, the highest start first, so small instances pack at the top
and the low slices, where 4g and 7g must start, stay free (the tie rule of
``mig.geometry.best_placement``); the whole GPU last.

Instances in use (held by a claim) are offered as themselves only: their
device stays published (the claim's allocation names it), even if the policy
no longer allows its profile, and every other device that overlaps it is left
out until it is released. ``blocked`` placements (an instance faulted or used
outside DRA) take their slices off the offer: nothing overlapping them is
published.
"""

from __future__ import annotations

from collections.abc import Collection

from mig.geometry import validate_layout
from mig.model import GpuModel, PlacedInstance, Placement, Profile
from sharing.dra import names
from sharing.dra.model import AttributeValue, Capacity, CounterConsumption, CounterSet, Device, DraModelError, GpuOffer

MiB = 2**20


def has_media_extensions(model: GpuModel) -> bool:
    return any(p.media_extensions for p in model.profiles)


def counter_set(model: GpuModel, gpu_index: int) -> CounterSet:
    """The counter set of one GPU of ``model``: its memory slices, compute slices and media extensions."""
    counters = {names.memory_slice_counter(k): 1 for k in range(model.memory_slices)}
    counters[names.COMPUTE_COUNTER] = model.compute_slices
    if has_media_extensions(model):
        counters[names.MEDIA_COUNTER] = 1
    return CounterSet(names.counter_set_name(gpu_index), counters)


def consumption(model: GpuModel, gpu_index: int, profile: Profile, placement: Placement) -> CounterConsumption:
    """What ``profile`` at ``placement`` takes from its GPU's counter set."""
    counters = {names.memory_slice_counter(k): 1 for k in range(placement.start, placement.end)}
    counters[names.COMPUTE_COUNTER] = profile.compute_slices
    if profile.media_extensions:
        counters[names.MEDIA_COUNTER] = 1
    return CounterConsumption(names.counter_set_name(gpu_index), counters)


def _common(kind: names.DeviceKind, model: GpuModel, gpu_index: int, uuid: str) -> dict[str, AttributeValue]:
    return {names.KIND: kind, names.PRODUCT: model.product, names.UUID: uuid, names.INDEX: gpu_index}


def mig_device(model: GpuModel, gpu_index: int, uuid: str, profile: Profile, placement: Placement) -> Device:
    """The device for ``profile`` at ``placement`` on GPU ``gpu_index``."""
    attributes = _common("mig", model, gpu_index, uuid)
    attributes.update({
        names.PROFILE: profile.name,
        names.PLACEMENT_START: placement.start,
        names.PLACEMENT_SIZE: placement.size,
        names.COMPUTE_SLICES: profile.compute_slices,
        names.MEDIA_EXTENSIONS: profile.media_extensions,
    })
    return Device(
        name=names.mig_device_name(gpu_index, profile.name, placement.start),
        attributes=attributes,
        capacity={names.MEMORY: Capacity(profile.memory_bytes)},
        consumes_counters=(consumption(model, gpu_index, profile, placement),),
    )


def whole_device(model: GpuModel, gpu_index: int, uuid: str) -> Device:
    """The whole GPU, MIG disabled: consumes every counter of the GPU's set."""
    full = counter_set(model, gpu_index)
    return Device(
        name=names.gpu_device_name(gpu_index),
        attributes=_common("gpu", model, gpu_index, uuid),
        capacity={names.MEMORY: Capacity(model.memory_mib * MiB)},
        consumes_counters=(CounterConsumption(full.name, dict(full.counters)),),
    )


def _try_order(profile: Profile) -> tuple[int, int, bool, str]:
    return (profile.memory_slices, profile.compute_slices, profile.media_extensions, profile.name)


def placement_order(profile: Profile) -> list[Placement]:
    """A profile's placements in the order its devices are published, the order kube-scheduler's
    first-fit allocator tries them: the highest start first."""
    return sorted(profile.placements, key=lambda p: -p.start)


def _mask(placements: Collection[Placement]) -> int:
    mask = 0
    for placement in placements:
        mask |= placement.mask
    return mask


def mig_gpu(
    model: GpuModel,
    gpu_index: int,
    uuid: str,
    *,
    allowed_profiles: Collection[str] | None = None,
    in_use: Collection[PlacedInstance] = (),
    blocked: Collection[Placement] = (),
    whole_gpu: bool = True,
) -> GpuOffer:
    """Counter set and devices of one GPU of ``model`` in dynamic MIG mode.

    ``allowed_profiles``: the SharingPolicy's allowed profiles
    (``NodePolicy.allowed_profiles``; None: all; names of other models are
    ignored). ``in_use``: instances held by claims (offered as themselves
    only). ``blocked``: memory slices no device may use. ``whole_gpu``: also
    offer the whole GPU (when nothing is in use or blocked). Raises
    ``DraModelError`` when ``in_use`` is not a valid layout of ``model`` or
    overlaps ``blocked``.
    """
    if gpu_index < 0:
        raise DraModelError(f"GPU index must be 0 or more, got {gpu_index}")
    held = sorted(set(in_use))
    problem = validate_layout(model, held)
    if problem is not None:
        raise DraModelError(f"GPU {gpu_index}: the instances in use are not a layout of {model.product}: {problem}")
    held_mask = _mask([i.placement for i in held])
    blocked_mask = _mask(blocked)
    if held_mask & blocked_mask:
        raise DraModelError(f"GPU {gpu_index}: an instance in use overlaps a blocked placement")
    taken = held_mask | blocked_mask
    devices: list[Device] = []
    for profile in sorted(model.profiles, key=_try_order):
        for placement in placement_order(profile):
            instance = PlacedInstance(profile.name, placement)
            if instance in held:
                devices.append(mig_device(model, gpu_index, uuid, profile, placement))
            elif not placement.mask & taken and (allowed_profiles is None or profile.name in allowed_profiles):
                devices.append(mig_device(model, gpu_index, uuid, profile, placement))
    if whole_gpu and not taken:
        devices.append(whole_device(model, gpu_index, uuid))
    return GpuOffer(gpu_index, tuple(devices), counter_set(model, gpu_index))

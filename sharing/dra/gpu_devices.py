"""GPUs that are not partitioned by MIG: shared by several claims (MPS, time-slicing), or whole.

A shared GPU is one device, ``gpu-<i>-shared``, with
``allowMultipleAllocations: true`` and the consumable capacities ``milli``
and ``memory`` of :class:`sharing.dra.share_policy.SharePolicy`: kube-scheduler
adds up what the claims on it consume and never lets the sum pass 1000 milli or
the GPU's memory. ``sharing`` says whether the shares are enforced (MPS: the
kubelet plugin sets each claim's thread percentage and pinned memory limit) or
only counted (time-slicing: no isolation is promised). It consumes no counters,
so its slice may hold 128 devices.

A whole GPU (``gpu-<i>``, kind ``gpu``) is one device for one claim: a GPU of a
model without MIG, or one an admin keeps unshared. GPUs that can do MIG offer
their whole GPU through ``sharing.dra.mig_devices`` instead, so that it and the
MIG placements exclude each other by counters.

These builders take the product name and memory, not a ``mig`` model: a shared
GPU need not be MIG-capable (an L4 or an L40S is not in ``mig.catalog``).
"""

from __future__ import annotations

from sharing.dra import names
from sharing.dra.model import Capacity, Device, DraModelError, GpuOffer
from sharing.dra.share_policy import SHARES, SharePolicy


def _check(gpu_index: int, memory_bytes: int) -> None:
    if gpu_index < 0:
        raise DraModelError(f"GPU index must be 0 or more, got {gpu_index}")
    if memory_bytes <= 0:
        raise DraModelError(f"GPU {gpu_index}: memory must be positive, got {memory_bytes} bytes")


def shared_gpu(
    gpu_index: int,
    uuid: str,
    product: str,
    memory_bytes: int,
    sharing: names.SharingKind,
    policy: SharePolicy = SHARES,
) -> GpuOffer:
    """One GPU shared by claims: a single device with consumable ``milli`` and ``memory``."""
    _check(gpu_index, memory_bytes)
    device = Device(
        name=names.shared_device_name(gpu_index),
        attributes={names.KIND: "shared", names.PRODUCT: product, names.UUID: uuid,
                    names.INDEX: gpu_index, names.SHARING: sharing},
        capacity={names.MILLI: policy.milli_capacity(), names.MEMORY: policy.memory_capacity(memory_bytes)},
        allow_multiple_allocations=True,
    )
    return GpuOffer(gpu_index, (device,))


def whole_gpu(gpu_index: int, uuid: str, product: str, memory_bytes: int) -> GpuOffer:
    """One GPU for one claim (no MIG, no sharing)."""
    _check(gpu_index, memory_bytes)
    device = Device(
        name=names.gpu_device_name(gpu_index),
        attributes={names.KIND: "gpu", names.PRODUCT: product, names.UUID: uuid, names.INDEX: gpu_index},
        capacity={names.MEMORY: Capacity(memory_bytes)},
    )
    return GpuOffer(gpu_index, (device,))

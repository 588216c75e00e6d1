"""One node's GPUs as the ResourceSlices of its pool.

The pool is the node's (pool name = node name, ``nodeName`` set on every
slice) and the layout follows the API's rules for Kubernetes v1.37:

* counter sets go in slices of their own (a slice holds ``sharedCounters`` or
  ``devices``, never both), at most 8 per slice (``ResourceSliceMaxCounterSets``);
* a slice whose devices consume counters holds at most 64 devices
  (``ResourceSliceMaxDevicesWithAdvancedFeatures``), any other 128;
* every slice carries the pool's generation and the pool's slice count, so
  kube-scheduler can tell a complete pool from one being rewritten.

Devices are packed GPU by GPU, in index order, and a GPU's devices stay in one
slice whenever they fit one: a change to one GPU then rewrites one slice, and
the agent's diff stays small. A GPU with more devices than a slice holds is
split over consecutive slices. An H100 in dynamic MIG mode offers 26 devices
(25 placements and the whole GPU), so two fit a slice and a node of eight needs
four device slices and one counter slice.

Names are ``<node>-gpu.gpupack.io-counters-000`` and ``...-devices-000``; the
allocator visits slices in name order, so device slices are tried in GPU order.
The same inputs give the same slices, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

from sharing.dra import limits, names
from sharing.dra.model import CounterSet, Device, DraModelError, GpuOffer, ResourceSlice


def _device_limit(devices: Sequence[Device]) -> int:
    advanced = any(d.consumes_counters for d in devices)
    return limits.MAX_DEVICES_ADVANCED if advanced else limits.MAX_DEVICES


def pack_devices(gpus: Sequence[GpuOffer]) -> list[tuple[Device, ...]]:
    """The devices of ``gpus`` (in index order) grouped into slices, GPU by GPU (see the module doc)."""
    packed: list[tuple[Device, ...]] = []
    current: list[Device] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        group = list(gpu.devices)
        if not group:
            continue
        if len(current) + len(group) <= _device_limit(current + group):
            current += group
            continue
        if current:
            packed.append(tuple(current))
        limit = _device_limit(group)
        while len(group) > limit:
            packed.append(tuple(group[:limit]))
            group = group[limit:]
        current = group
    if current:
        packed.append(tuple(current))
    return packed


def node_slices(
    node_name: str,
    gpus: Sequence[GpuOffer],
    *,
    generation: int = 1,
    owner_uid: str | None = None,
) -> tuple[ResourceSlice, ...]:
    """The ResourceSlices of ``node_name``'s pool at ``generation``: counter slices, then device slices.

    ``owner_uid``: the Node's UID, to make the Node own the slices. A node without
    GPUs gets one empty slice (a pool must have at least one). Raises
    ``DraModelError`` for duplicate GPU indices, duplicate device names or a
    negative generation.
    """
    if generation < 0:
        raise DraModelError(f"the pool generation must be 0 or more, got {generation}")
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise DraModelError(f"node {node_name}: GPU indices repeat: {sorted(indices)}")
    seen: set[str] = set()
    for gpu in gpus:
        for device in gpu.devices:
            if device.name in seen:
                raise DraModelError(f"node {node_name}: two devices are called {device.name}")
            seen.add(device.name)
    ordered = sorted(gpus, key=lambda g: g.index)
    sets = [g.counter_set for g in ordered if g.counter_set is not None]
    counter_groups = [tuple(sets[i:i + limits.MAX_COUNTER_SETS]) for i in range(0, len(sets), limits.MAX_COUNTER_SETS)]
    device_groups = pack_devices(ordered)
    if not counter_groups and not device_groups:
        device_groups = [()]
    count = len(counter_groups) + len(device_groups)

    def make(role: names.SliceRole, number: int, devices: tuple[Device, ...] = (),
             shared_counters: tuple[CounterSet, ...] = ()) -> ResourceSlice:
        return ResourceSlice(name=names.slice_name(node_name, role, number), node_name=node_name, pool=node_name,
                             generation=generation, slice_count=count, devices=devices,
                             shared_counters=shared_counters, owner_uid=owner_uid)

    return (
        *(make("counters", k, shared_counters=group) for k, group in enumerate(counter_groups)),
        *(make("devices", k, devices=group) for k, group in enumerate(device_groups)),
    )

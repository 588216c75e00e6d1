"""What the node's GPUs are, how they are cut and how busy: NVML snapshot -> GPUNode status.

``read_snapshot`` is the only function here that calls the backend; it never raises
for NVML trouble: a failing GPU (or NVML missing altogether) becomes an ``error`` in
the snapshot, which the agent reports as a condition instead of crash-looping.
``status_from_snapshot`` is pure and returns the wire form of ``GPUNodeStatus``
(validated by the pydantic model before it leaves the process).

A GPU model missing from the ``mig/`` catalog is still reported: its profile table
is built from NVML's own profile list (``model_from_nvml``), with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mig.catalog import find_model, model_for_pci_device_id
from mig.model import GpuModel, Placement, Profile
from node.base.dcgm import Activity, gpu_percent
from node.nvml.errors import GPU_IS_LOST, NvmlError
from node.nvml.protocol import DeviceInfo, GpuInstance, NvmlReader, GpuProcess, InstanceProfile, Utilization
from sharing.api.crd import DeviceHealth, GPUNodeStatus, GPUStatus, LayoutRefusal, MemorySignalsSeen


@dataclass(frozen=True)
class GpuSnapshot:
    info: DeviceInfo
    model: GpuModel | None
    """Catalog model, or one built from NVML's profiles; None if not MIG-capable."""
    instances: tuple[GpuInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    utilization: Utilization | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()
    lost: bool = False
    """NVML answers ``GPU_IS_LOST``: ``info`` and ``instances`` are the last ones seen."""

    @property
    def product(self) -> str:
        """GFD's ``nvidia.com/gpu.product``: NVML's name with spaces as dashes."""
        return self.info.name.strip().replace(" ", "-")

    def busy_gi_ids(self) -> frozenset[int]:
        return frozenset(p.gi_id for p in self.processes if p.gi_id is not None)


@dataclass(frozen=True)
class NodeSnapshot:
    backend: str
    gpus: tuple[GpuSnapshot, ...] = ()
    error: str | None = None
    """NVML unusable (library missing, driver down): nothing else is known."""
    warnings: tuple[str, ...] = field(default=())

    def gpu(self, index: int) -> GpuSnapshot | None:
        return next((g for g in self.gpus if g.info.index == index), None)


def model_from_nvml(info: DeviceInfo, profiles: Sequence[InstanceProfile]) -> GpuModel:
    """A ``GpuModel`` for a GPU the catalog does not know, from NVML's own profile table."""
    memory_slices = max((p.end for prof in profiles for p in prof.placements), default=8)
    compute = max((p.slice_count for p in profiles), default=7)
    return GpuModel(
        product=info.name.replace(" ", "-"), display_name=info.name, pci_device_ids=(info.pci_device_id,),
        memory_mib=info.memory_total_mib, compute_slices=compute, memory_slices=memory_slices,
        profiles=tuple(
            Profile(p.name, p.profile_id, p.nvml_index, p.slice_count,
                    max((pl.size for pl in p.placements), default=1), p.memory_mib, p.max_count, p.placements,
                    media_extensions="+me" in p.name)
            for p in profiles
        ),
        source="read from NVML on this node (not in gpupack's catalog)",
    )


def _model_for(backend: NvmlReader, info: DeviceInfo) -> tuple[GpuModel | None, tuple[str, ...]]:
    if not info.mig_capable:
        return None, ()
    model = model_for_pci_device_id(info.pci_device_id) or find_model(info.name)
    if model is not None:
        return model, ()
    if not info.mig_enabled:
        return None, (f"GPU {info.index} ({info.name}, {info.pci_device_id}) is not in gpupack's catalog; "
                      "its profiles can be read once MIG mode is on",)
    built = model_from_nvml(info, backend.instance_profiles(info.index))
    return built, (f"GPU {info.index} ({info.name}, {info.pci_device_id}) is not in gpupack's catalog; "
                   f"using the {len(built.profiles)} profiles NVML reports",)


def read_snapshot(backend: NvmlReader, kind: str, dcgm: Activity | None = None,
                  known: Mapping[int, GpuSnapshot] | None = None) -> NodeSnapshot:
    """Everything NVML says about the node's GPUs; ``dcgm`` fills in MIG GPUs' activity.

    A GPU that answers ``GPU_IS_LOST`` stays in the snapshot, marked ``lost``, as ``known``
    (the agent's last sight of it) last saw it, so its status and its pods are not forgotten."""
    known = known or {}
    try:
        count = backend.device_count()
    except NvmlError as exc:
        return NodeSnapshot(kind, error=f"NVML unavailable: {exc}")
    gpus: list[GpuSnapshot] = []
    warnings: list[str] = []
    for index in range(count):
        try:
            info = backend.device_info(index)
        except NvmlError as exc:
            warnings.append(f"GPU {index}: {exc}")
            if exc.code == GPU_IS_LOST:
                # As last seen (processes too: they cannot be read, and the pods holding them still hold their
                # devices); a GPU never seen answering is reported by its index alone.
                before = known.get(index) or GpuSnapshot(DeviceInfo(index, "", "unknown", "", "", 0, False, False, False),
                                                         None)
                gpus.append(replace(before, utilization=None, error=str(exc), lost=True, warnings=()))
            continue
        try:
            model, notes = _model_for(backend, info)
            instances = backend.gpu_instances(index) if info.mig_enabled and info.mig_pending else ()
            util = backend.utilization(index)
            if util.gpu_percent is None and dcgm:
                percent = gpu_percent(dcgm, info.uuid, instances, model)
                if percent is not None:
                    util = replace(util, gpu_percent=percent, source="dcgm")
            gpus.append(GpuSnapshot(info, model, instances, backend.processes(index), util, warnings=notes))
            warnings.extend(notes)
        except NvmlError as exc:
            lost = exc.code == GPU_IS_LOST
            seen = known.get(index)
            instances = seen.instances if lost and seen is not None else ()
            gpus.append(GpuSnapshot(info, seen.model if seen else None, instances, error=str(exc), lost=lost))
            warnings.append(f"GPU {index}: {exc}")
    return NodeSnapshot(kind, tuple(gpus), warnings=tuple(warnings))


def known_from_status(status: Mapping[str, Any]) -> dict[int, GpuSnapshot]:
    """The GPUs a previous agent reported (``GPUNode.status.gpus``), as a restarted agent's last sight
    of them: what a GPU that is lost by now is reported as. Entries that do not validate are left out."""
    known: dict[int, GpuSnapshot] = {}
    for raw in status.get("gpus") or []:
        try:
            gpu = GPUStatus.model_validate(raw)
        except ValueError:
            continue
        model = find_model(gpu.product)
        info = DeviceInfo(gpu.index, gpu.uuid, gpu.product.replace("-", " "), "", "", gpu.memory_mib,
                          model is not None, gpu.mig_enabled, gpu.mig_enabled)
        instances = tuple(
            GpuInstance(i.gi_id or 0, model.profile(i.profile).profile_id if model and model.has_profile(i.profile) else 0,
                        i.profile, Placement(i.start, i.size), i.uuid or "")
            for i in gpu.instances)
        known[gpu.index] = GpuSnapshot(info, model, instances)
    return known


def status_from_snapshot(
    snapshot: NodeSnapshot,
    pods_by_device: Mapping[str, Sequence[str]],
    *,
    observed_generation: int | None,
    sharing: Mapping[str, Any] | None,
    conditions: Sequence[Mapping[str, Any]],
    reconfiguration: Mapping[str, Any] | None,
    refusals: Mapping[int, LayoutRefusal] | None = None,
    health: Mapping[tuple[int, int | None], DeviceHealth] | None = None,
    degraded: bool = False,
    memory_signals: Mapping[int, MemorySignalsSeen] | None = None,
) -> dict[str, Any]:
    """Wire form of ``GPUNodeStatus``; ``pods_by_device`` maps a GPU/MIG UUID to ``ns/name`` pods,
    ``refusals`` a GPU index to the agent's answer to a layout it gave up on, ``health`` a device
    (GPU index, GPU-instance id or None) to its fault (``node.health``)."""
    refusals = refusals or {}
    health = health or {}
    unhealthy_gpus = unhealthy_instances = 0
    gpus = []
    instance_count = in_use_count = 0
    for gpu in snapshot.gpus:
        busy = gpu.busy_gi_ids()
        instances = []
        for inst in gpu.instances:
            pods = sorted(pods_by_device.get(inst.uuid, ()))
            used = inst.gi_id in busy or bool(pods)
            fault = health.get((gpu.info.index, inst.gi_id))
            instances.append({"profile": inst.profile, "start": inst.placement.start, "size": inst.placement.size,
                              "uuid": inst.uuid or None, "inUse": used, "pods": pods, "giId": inst.gi_id,
                              "health": None if fault is None else fault.model_dump(mode="json", by_alias=True)})
            instance_count += 1
            in_use_count += used
        gpu_fault = health.get((gpu.info.index, None))
        unhealthy_gpus += gpu_fault is not None
        if gpu_fault is None:
            unhealthy_instances += sum(1 for i in instances if i.get("health"))
        util = gpu.utilization
        gpus.append({
            "index": gpu.info.index, "uuid": gpu.info.uuid, "product": gpu.product,
            "memoryMiB": gpu.info.memory_total_mib, "migEnabled": gpu.info.mig_enabled,
            "instances": instances,
            "utilization": None if util is None else {
                "gpuPercent": None if util.gpu_percent is None else max(0, min(100, round(util.gpu_percent))),
                "memoryUsedMiB": util.memory_used_mib,
            },
            "layoutRefusal": None if gpu.info.index not in refusals else
            refusals[gpu.info.index].model_dump(mode="json", by_alias=True),
            "health": None if gpu_fault is None else gpu_fault.model_dump(mode="json", by_alias=True),
            "memorySignals": None if gpu.info.index not in (memory_signals or {}) else
            (memory_signals or {})[gpu.info.index].model_dump(mode="json", by_alias=True),
        })
    products = sorted({g.product for g in snapshot.gpus})
    raw = {
        "observedGeneration": observed_generation,
        "product": products[0] if len(products) == 1 else (", ".join(products)[:128] or None),
        "gpus": gpus,
        "sharing": dict(sharing) if sharing else None,
        "summary": {"gpus": len(gpus), "migInstances": instance_count, "instancesInUse": in_use_count,
                    "unhealthyGpus": unhealthy_gpus, "unhealthyInstances": unhealthy_instances,
                    "degraded": degraded},
        "conditions": list(conditions),
        "reconfiguration": dict(reconfiguration) if reconfiguration else None,
    }
    # Validate against the API model (the CRD's twin) so a bug here shows up as a clear
    # local error, not as a 422 from the API server on every patch.
    model = GPUNodeStatus.model_validate(_drop_none(raw))
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value

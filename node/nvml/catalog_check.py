"""Compare what NVML reports for a GPU with gpupack's ``mig/`` catalog entry (read-only).

Used by ``tools/nvml_readonly_check.py`` on a real GPU and by the unit tests on the
simulated backend. Only inventory calls are made: never a MIG-mode change, never a
create or destroy, never a reset.
"""

from __future__ import annotations

from dataclasses import dataclass

from mig.catalog import find_model, model_for_pci_device_id
from mig.model import GpuModel
from node.nvml.errors import NOT_SUPPORTED, NvmlError
from node.nvml.protocol import DeviceInfo, NvmlReader, InstanceProfile

MEMORY_TOLERANCE = 0.02  # catalog sizes for some models are inferred; flag >2 % differences


@dataclass(frozen=True)
class GpuReport:
    info: DeviceInfo
    model: GpuModel | None
    profiles: tuple[InstanceProfile, ...]
    mismatches: tuple[str, ...]
    notes: tuple[str, ...]


def compare_profiles(model: GpuModel, profiles: tuple[InstanceProfile, ...]) -> list[str]:
    problems: list[str] = []
    seen = {p.name for p in profiles}
    for nv in profiles:
        if not model.has_profile(nv.name):
            problems.append(f"NVML profile {nv.name} (id {nv.profile_id}) is not in the catalog entry {model.product}")
            continue
        cat = model.profile(nv.name)
        for what, mine, theirs in (("profile id", cat.profile_id, nv.profile_id),
                                   ("NVML profile index", cat.nvml_index, nv.nvml_index),
                                   ("compute slices", cat.compute_slices, nv.slice_count),
                                   ("max instances", cat.max_count, nv.max_count)):
            if mine != theirs:
                problems.append(f"{nv.name}: {what} catalog {mine} vs NVML {theirs}")
        if tuple(sorted(cat.placements)) != tuple(sorted(nv.placements)):
            problems.append(f"{nv.name}: placements catalog {[str(p) for p in cat.placements]} "
                            f"vs NVML {[str(p) for p in nv.placements]}")
        if abs(cat.memory_mib - nv.memory_mib) > MEMORY_TOLERANCE * nv.memory_mib:
            problems.append(f"{nv.name}: memory catalog {cat.memory_mib} MiB vs NVML {nv.memory_mib} MiB")
    for name in model.profile_names:
        if name not in seen:
            problems.append(f"catalog profile {name} is not offered by NVML on this GPU")
    return problems


def check_gpu(inventory: NvmlReader, index: int) -> GpuReport:
    info = inventory.device_info(index)
    model = model_for_pci_device_id(info.pci_device_id) or find_model(info.name)
    notes: list[str] = []
    if model is None:
        notes.append(f"{info.name} ({info.pci_device_id}) is not in the catalog")
    try:
        profiles = inventory.instance_profiles(index)
    except NvmlError as exc:
        if exc.code != NOT_SUPPORTED:
            raise
        notes.append("MIG mode is off: NVML lists no GPU-instance profiles (this check will not turn it on)")
        return GpuReport(info, model, (), (), tuple(notes))
    mismatches = compare_profiles(model, profiles) if model is not None else []
    return GpuReport(info, model, profiles, tuple(mismatches), tuple(notes))

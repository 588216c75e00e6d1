"""The real NVML backend on nvidia-ml-py (``pynvml``).

``pynvml`` is imported lazily, inside ``RealNvml.open``, and libnvidia-ml is only
loaded by ``nvmlInit``: importing this module works on machines without a GPU
driver. Every ``pynvml.NVMLError`` is turned into ``NvmlError`` with the same code.

MIG devices are found the way mig-parted and the device plugin find them: GPU
instances per profile (``nvmlDeviceGetGpuInstances``), their placement from
``nvmlGpuInstanceGetInfo``, and the MIG device UUID from the MIG device handle
whose GPU-instance id matches. Utilisation: ``nvmlDeviceGetUtilizationRates`` is
NOT_SUPPORTED on MIG-enabled GPUs, so there memory use and process presence are
reported instead (``source="memory-and-processes"``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from mig.model import Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import DeviceInfo, GpuInstance, GpuProcess, InstanceProfile, Utilization

T = TypeVar("T")
MAX_PLACEMENTS = 16
MAX_INSTANCES = 8


@contextmanager
def _translated() -> Iterator[None]:
    import pynvml  # type: ignore[import-untyped]

    try:
        yield
    except pynvml.NVMLError as exc:
        raise NvmlError(int(exc.value), str(exc)) from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealNvml:
    """NVML on the host. Create with ``RealNvml.open()``; ``close()`` calls ``nvmlShutdown``."""

    kind = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._profiles: dict[int, tuple[InstanceProfile, ...]] = {}

    @classmethod
    def open(cls) -> RealNvml:
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py is a dependency; this is a broken install
            raise NvmlError(errors.LIBRARY_NOT_FOUND, f"nvidia-ml-py not importable: {exc}") from exc
        with _translated():
            pynvml.nvmlInit()
        return cls(pynvml)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        with _translated():
            return fn(*args)

    def _handle(self, index: int) -> Any:
        return self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)

    # ----------------------------------------------------------------- read side
    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def device_info(self, index: int) -> DeviceInfo:
        n = self._nvml
        handle = self._handle(index)
        pci = self._call(n.nvmlDeviceGetPciInfo, handle)
        memory = self._call(n.nvmlDeviceGetMemoryInfo, handle)
        try:
            current, pending = self._call(n.nvmlDeviceGetMigMode, handle)
            capable = True
        except NvmlError as exc:
            if exc.code != errors.NOT_SUPPORTED:
                raise
            current = pending = 0
            capable = False
        return DeviceInfo(
            index=index,
            uuid=_text(self._call(n.nvmlDeviceGetUUID, handle)),
            name=_text(self._call(n.nvmlDeviceGetName, handle)),
            pci_device_id=f"0x{int(pci.pciDeviceId):08X}",
            pci_bus_id=_text(pci.busId),
            memory_total_mib=int(memory.total) // (1024 * 1024),
            mig_capable=capable,
            mig_enabled=current == n.NVML_DEVICE_MIG_ENABLE,
            mig_pending=pending == n.NVML_DEVICE_MIG_ENABLE,
        )

    def instance_profiles(self, index: int) -> tuple[InstanceProfile, ...]:
        if index in self._profiles:
            return self._profiles[index]
        n = self._nvml
        handle = self._handle(index)
        found: list[InstanceProfile] = []
        for nvml_index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call(n.nvmlDeviceGetGpuInstanceProfileInfo, handle, nvml_index)
            except NvmlError as exc:
                if exc.code in (errors.NOT_SUPPORTED, errors.INVALID_ARGUMENT):
                    continue  # this profile does not exist on this GPU
                raise
            placements = self._possible_placements(handle, int(info.id))
            name = _text(info.name).removeprefix("MIG ").strip()
            found.append(InstanceProfile(
                name, int(info.id), nvml_index, int(info.sliceCount), int(info.memorySizeMB),
                int(info.instanceCount), placements,
            ))
        self._profiles[index] = tuple(found)
        return self._profiles[index]

    def _possible_placements(self, handle: Any, profile_id: int) -> tuple[Placement, ...]:
        n = self._nvml
        array = (n.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        self._call(n.nvmlDeviceGetGpuInstancePossiblePlacements, handle, profile_id, array, ctypes.byref(count))
        return tuple(Placement(int(array[i].start), int(array[i].size)) for i in range(count.value))

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        n = self._nvml
        handle = self._handle(index)
        uuids = self._mig_uuids(handle)
        result: list[GpuInstance] = []
        for profile in self.instance_profiles(index):
            array = (n.c_nvmlGpuInstance_t * MAX_INSTANCES)()
            count = ctypes.c_uint(0)
            self._call(n.nvmlDeviceGetGpuInstances, handle, profile.profile_id, array, ctypes.byref(count))
            for i in range(count.value):
                info = self._call(n.nvmlGpuInstanceGetInfo, array[i])
                placement = Placement(int(info.placement.start), int(info.placement.size))
                result.append(GpuInstance(int(info.id), profile.profile_id, profile.name, placement,
                                          uuids.get(int(info.id), "")))
        return tuple(sorted(result, key=lambda g: (g.placement.start, g.gi_id)))

    def _mig_uuids(self, handle: Any) -> dict[int, str]:
        """GPU-instance id -> MIG device UUID, from the MIG device handles."""
        n = self._nvml
        uuids: dict[int, str] = {}
        for i in range(int(self._call(n.nvmlDeviceGetMaxMigDeviceCount, handle))):
            try:
                mig = self._call(n.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            except NvmlError as exc:
                if exc.code == errors.NOT_FOUND:
                    continue
                raise
            uuids[int(self._call(n.nvmlDeviceGetGpuInstanceId, mig))] = _text(self._call(n.nvmlDeviceGetUUID, mig))
        return uuids

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        n = self._nvml
        procs = self._call(n.nvmlDeviceGetComputeRunningProcesses, self._handle(index))
        result = []
        for p in procs:
            gi = getattr(p, "gpuInstanceId", None)
            ci = getattr(p, "computeInstanceId", None)
            invalid = 0xFFFFFFFF  # NVML reports this when the process is not in a MIG instance
            used = p.usedGpuMemory or 0
            result.append(GpuProcess(int(p.pid), int(used) // (1024 * 1024),
                                     None if gi in (None, invalid) else int(gi),
                                     None if ci in (None, invalid) else int(ci)))
        return tuple(result)

    def utilization(self, index: int) -> Utilization:
        n = self._nvml
        handle = self._handle(index)
        memory = self._call(n.nvmlDeviceGetMemoryInfo, handle)
        procs = len(self.processes(index))
        used, total = int(memory.used) // (1024 * 1024), int(memory.total) // (1024 * 1024)
        try:
            rates = self._call(n.nvmlDeviceGetUtilizationRates, handle)
        except NvmlError as exc:
            if exc.code != errors.NOT_SUPPORTED:
                raise
            return Utilization(None, used, total, procs, "memory-and-processes")
        return Utilization(float(rates.gpu), used, total, procs, "nvml")

    # ---------------------------------------------------------------- write side
    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> GpuInstance:
        n = self._nvml
        handle = self._handle(index)
        c_placement = n.c_nvmlGpuInstancePlacement_t()
        c_placement.start, c_placement.size = placement.start, placement.size
        gi = self._call(n.nvmlDeviceCreateGpuInstanceWithPlacement, handle, profile_id, ctypes.byref(c_placement))
        try:
            # One compute instance over the whole GPU instance, as mig-parted creates it.
            ci_profile = self._full_ci_profile(gi)
            self._call(n.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile)
        except NvmlError:
            self._call(n.nvmlGpuInstanceDestroy, gi)  # leave no half-made instance behind
            raise
        info = self._call(n.nvmlGpuInstanceGetInfo, gi)
        name = next((p.name for p in self.instance_profiles(index) if p.profile_id == profile_id), str(profile_id))
        uuid = self._mig_uuids(handle).get(int(info.id), "")
        return GpuInstance(int(info.id), profile_id, name, placement, uuid)

    def _compute_instance_profiles(self, gi: Any) -> Iterator[Any]:
        """The shared-engine compute-instance profiles a GPU instance supports (NVML
        answers an error for the profile indices it does not)."""
        n = self._nvml
        for ci_index in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self._call(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, ci_index,
                                  n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except NvmlError:
                continue
            yield info

    def _full_ci_profile(self, gi: Any) -> int:
        best = None
        for info in self._compute_instance_profiles(gi):
            if best is None or int(info.sliceCount) > best[0]:
                best = (int(info.sliceCount), int(info.id))
        if best is None:
            raise NvmlError(errors.NOT_SUPPORTED, "no compute-instance profile on the new GPU instance")
        return best[1]

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        n = self._nvml
        gi = self._call(n.nvmlDeviceGetGpuInstanceById, self._handle(index), gi_id)
        for info in self._compute_instance_profiles(gi):
            array = (n.c_nvmlComputeInstance_t * MAX_INSTANCES)()
            count = ctypes.c_uint(0)
            self._call(n.nvmlGpuInstanceGetComputeInstances, gi, int(info.id), array, ctypes.byref(count))
            for i in range(count.value):
                self._call(n.nvmlComputeInstanceDestroy, array[i])
        self._call(n.nvmlGpuInstanceDestroy, gi)

    def close(self) -> None:
        with _translated():
            self._nvml.nvmlShutdown()

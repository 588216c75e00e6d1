"""The real (nvidia-ml-py) backend, driven through a stand-in for the ``pynvml`` module.

No GPU here, so ``RealNvml`` is given an object with pynvml's function names and
calling conventions (ctypes arrays and ``byref`` counts, ``NVMLError`` with real
codes, ``MIG `` profile-name prefixes, 0xFFFFFFFF for "no GPU instance") whose
hardware is the simulated backend. The same checks then run against both
backends: ``RealNvml`` must report what the simulation holds, translate errors,
and clean up a half-made instance.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from mig.catalog import get_model
from mig.model import Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import NvmlBackend
from node.nvml.real import RealNvml
from node.nvml.simulated import SimulatedNvml

H200 = get_model("H200")
NO_INSTANCE = 0xFFFFFFFF


class FakePynvml:
    """pynvml's surface over a ``SimulatedNvml`` (handles are tuples, arrays hold py_objects)."""

    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_GPU_INSTANCE_PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = ctypes.py_object
    c_nvmlComputeInstance_t = ctypes.py_object

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim
        self.compute_instances: set[tuple[int, int]] = set()
        self.fail_compute_instance = False
        self.calls: list[str] = []

    def _do(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except NvmlError as exc:
            raise pynvml.NVMLError(exc.code) from None

    def nvmlDeviceGetCount(self) -> int:
        return self.sim.device_count()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        return ("dev", index)

    def nvmlDeviceGetPciInfo(self, h: tuple[str, int]) -> Any:
        info = self._do(self.sim.device_info, h[1])
        return SimpleNamespace(pciDeviceId=int(info.pci_device_id, 16), busId=info.pci_bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, h: tuple[str, int]) -> Any:
        util = self._do(self.sim.utilization, h[1])
        return SimpleNamespace(total=util.memory_total_mib << 20, used=util.memory_used_mib << 20)

    def nvmlDeviceGetMigMode(self, h: tuple[str, int]) -> list[int]:
        info = self._do(self.sim.device_info, h[1])
        return [int(info.mig_enabled), int(info.mig_pending)]

    def nvmlDeviceGetUUID(self, h: tuple[Any, ...]) -> bytes:
        if h[0] == "mig":
            return next(i.uuid for i in self.sim.gpu_instances(h[1]) if i.gi_id == h[2]).encode()
        return str(self._do(self.sim.device_info, h[1]).uuid).encode()

    def nvmlDeviceGetName(self, h: tuple[str, int]) -> bytes:
        return str(self._do(self.sim.device_info, h[1]).name).encode()

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: tuple[str, int], nvml_index: int) -> Any:
        for p in self._do(self.sim.instance_profiles, h[1]):
            if p.nvml_index == nvml_index:
                return SimpleNamespace(id=p.profile_id, sliceCount=p.slice_count, instanceCount=p.max_count,
                                       memorySizeMB=p.memory_mib, name=f"MIG {p.name}".encode())
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: tuple[str, int], pid: int, array: Any, count: Any) -> int:
        profile = next(p for p in self.sim.instance_profiles(h[1]) if p.profile_id == pid)
        for i, placement in enumerate(profile.placements):
            array[i].start, array[i].size = placement.start, placement.size
        count._obj.value = len(profile.placements)
        return 0

    def nvmlDeviceGetGpuInstances(self, h: tuple[str, int], pid: int, array: Any, count: Any) -> int:
        found = [g for g in self._do(self.sim.gpu_instances, h[1]) if g.profile_id == pid]
        for i, g in enumerate(found):
            array[i] = ("gi", h[1], g.gi_id)
        count._obj.value = len(found)
        return 0

    def nvmlGpuInstanceGetInfo(self, gi: tuple[str, int, int]) -> Any:
        g = next(x for x in self.sim.gpu_instances(gi[1]) if x.gi_id == gi[2])
        return SimpleNamespace(id=g.gi_id, placement=SimpleNamespace(start=g.placement.start, size=g.placement.size))

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple[str, int]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple[str, int], i: int) -> tuple[str, int, int]:
        instances = self.sim.gpu_instances(h[1])
        if i >= len(instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], instances[i].gi_id)

    def nvmlDeviceGetGpuInstanceId(self, mig: tuple[str, int, int]) -> int:
        return mig[2]

    def nvmlDeviceGetComputeRunningProcesses(self, h: tuple[str, int]) -> list[Any]:
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory_mib << 20,
                                gpuInstanceId=NO_INSTANCE if p.gi_id is None else p.gi_id,
                                computeInstanceId=NO_INSTANCE if p.gi_id is None else 0)
                for p in self.sim.processes(h[1])]

    def nvmlDeviceGetUtilizationRates(self, h: tuple[str, int]) -> Any:
        util = self.sim.utilization(h[1])
        if util.gpu_percent is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=util.gpu_percent, memory=0)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: tuple[str, int], pid: int, placement: Any) -> Any:
        p = placement._obj
        g = self._do(self.sim.create_gpu_instance, h[1], pid, Placement(p.start, p.size))
        return ("gi", h[1], g.gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, ci_index: int, engine: int) -> Any:
        profile = next(x.profile for x in self.sim.gpu_instances(gi[1]) if x.gi_id == gi[2])
        slices = H200.profile(profile).compute_slices
        if ci_index > 4:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=ci_index, sliceCount=min(slices, ci_index + 1))

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, ci_profile: int) -> Any:
        if self.fail_compute_instance:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        self.compute_instances.add((gi[1], gi[2]))
        self.calls.append(f"ci-create {gi[2]} profile {ci_profile}")
        return ("ci", gi[1], gi[2])

    def nvmlDeviceGetGpuInstanceById(self, h: tuple[str, int], gi_id: int) -> Any:
        if all(x.gi_id != gi_id for x in self.sim.gpu_instances(h[1])):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("gi", h[1], gi_id)

    def nvmlGpuInstanceGetComputeInstances(self, gi: Any, ci_pid: int, array: Any, count: Any) -> int:
        present = (gi[1], gi[2]) in self.compute_instances and ci_pid == 0
        if present:
            array[0] = ("ci", gi[1], gi[2])
        count._obj.value = int(present)
        return 0

    def nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        if any(p.gi_id == ci[2] for p in self.sim.processes(ci[1])):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        self.compute_instances.discard((ci[1], ci[2]))
        return 0

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        self._do(self.sim.destroy_gpu_instance, gi[1], gi[2])
        self.calls.append(f"gi-destroy {gi[2]}")
        return 0

    def nvmlShutdown(self) -> None:
        return None


def _pair(mig_enabled: bool = True) -> tuple[SimulatedNvml, FakePynvml, RealNvml]:
    sim = SimulatedNvml(H200, 2, mig_enabled=mig_enabled)
    fake = FakePynvml(sim)
    return sim, fake, RealNvml(fake)


def test_real_backend_reports_what_the_hardware_holds() -> None:
    sim, _fake, real = _pair()
    assert isinstance(real, NvmlBackend) and real.kind == "nvml"
    gi = sim.create_gpu_instance(0, H200.profile("3g.71gb").profile_id, Placement(4, 4))
    sim.start_process(0, 501, 2048, gi.gi_id)
    assert real.device_count() == 2
    assert real.device_info(1) == sim.device_info(1)
    by_name = sorted(real.instance_profiles(0), key=lambda p: p.name)
    assert by_name == sorted(sim.instance_profiles(0), key=lambda p: p.name)  # "MIG " stripped, placements read
    assert real.gpu_instances(0) == sim.gpu_instances(0)  # incl. the MIG device UUID
    assert real.processes(0) == sim.processes(0)
    util = real.utilization(0)
    assert util.gpu_percent is None and util.source == "memory-and-processes" and util.processes == 1


def test_real_backend_create_makes_a_compute_instance_and_destroy_removes_both() -> None:
    sim, fake, real = _pair()
    made = real.create_gpu_instance(1, H200.profile("2g.35gb").profile_id, Placement(2, 2))
    assert made.placed == sim.gpu_instances(1)[0].placed and made.uuid == sim.gpu_instances(1)[0].uuid
    assert (1, made.gi_id) in fake.compute_instances
    assert any(c.startswith(f"ci-create {made.gi_id} profile 1") for c in fake.calls)  # the 2-slice (full) CI
    real.destroy_gpu_instance(1, made.gi_id)
    assert sim.gpu_instances(1) == () and not fake.compute_instances


def test_real_backend_translates_nvml_errors_with_their_codes() -> None:
    sim, fake, real = _pair()
    gi = real.create_gpu_instance(0, H200.profile("1g.18gb").profile_id, Placement(0, 1))
    sim.start_process(0, 7, 10, gi.gi_id)
    with pytest.raises(NvmlError) as busy:
        real.destroy_gpu_instance(0, gi.gi_id)
    assert busy.value.code == errors.IN_USE
    with pytest.raises(NvmlError) as taken:
        real.create_gpu_instance(0, H200.profile("1g.18gb").profile_id, Placement(0, 1))
    assert taken.value.code == errors.INSUFFICIENT_RESOURCES
    with pytest.raises(NvmlError) as missing:
        real.destroy_gpu_instance(0, 99)
    assert missing.value.code == errors.NOT_FOUND


def test_failed_compute_instance_leaves_no_half_made_gpu_instance() -> None:
    sim, fake, real = _pair()
    fake.fail_compute_instance = True
    with pytest.raises(NvmlError) as info:
        real.create_gpu_instance(0, H200.profile("7g.141gb").profile_id, Placement(0, 8))
    assert info.value.code == errors.INSUFFICIENT_RESOURCES
    assert sim.gpu_instances(0) == ()


def test_mig_off_gpu_reports_utilisation_and_no_profiles() -> None:
    sim, _fake, real = _pair(mig_enabled=False)
    sim.set_load(0, 37.0)
    assert real.utilization(0).gpu_percent == 37.0 and real.utilization(0).source == "nvml"
    assert real.device_info(0).mig_enabled is False
    with pytest.raises(NvmlError) as info:
        real.gpu_instances(0)
    assert info.value.code == errors.NOT_SUPPORTED

"""The real (nvidia-ml-py) backend, driven through a stand-in for the ``pynvml`` module.

No GPU here, so ``RealNvml`` is given an object with pynvml's function names and
calling conventions (ctypes arrays and ``byref`` counts, ``NVMLError`` with real
codes, ``MIG `` profile-name prefixes, 0xFFFFFFFF for "no GPU instance") whose
hardware is the simulated backend. The same checks then run against both
backends: ``RealNvml`` must report what the simulation holds, translate errors,
and clean up a half-made instance.

The health side (event sets, ECC counters, retired pages, remapped rows) has no
counterpart in the simulation's NVML surface, so the fake keeps that state itself:
an event queue per set that answers TIMEOUT when empty, per-GPU counters, and the
NVML error a GPU answers for each query.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from mig.catalog import get_model
from mig.model import Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import HealthReader, MemoryHealth, NvmlBackend, XidEvent
from node.nvml.real import MAX_EVENTS_PER_DRAIN, UNKNOWN_BOOT_ID, RealNvml
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
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim
        self.compute_instances: set[tuple[int, int]] = set()
        self.fail_compute_instance = False
        self.calls: list[str] = []
        # Health state. An event set is ("set", n); it queues posted events (or error
        # codes, raised by the wait that reaches them) for the GPUs registered in it.
        self.event_sets: dict[int, list[Any]] = {}
        self.registered: dict[int, dict[int, int]] = {}  # set -> GPU index -> event mask
        self.freed: list[int] = []
        self.register_errors: dict[int, int] = {}  # GPU index -> NVML error its registration answers
        self.wait_timeouts: list[int] = []
        # (GPU index, query) -> value; a query with no entry answers NOT_SUPPORTED.
        # Queries: ("ecc", error type, counter type), "retired", "remapped".
        self.memory: dict[tuple[int, Any], Any] = {}
        self.process_utilization_error: int | None = None
        """An NVML code every ``nvmlDeviceGetProcessUtilization`` raises (None: answer from the simulation)."""

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

    def nvmlDeviceGetProcessUtilization(self, h: tuple[str, int], since_us: int) -> list[Any]:
        if self.process_utilization_error is not None:
            raise pynvml.NVMLError(self.process_utilization_error)
        samples = self._do(self.sim.process_utilization, h[1], since_us)
        if not samples:  # what libnvidia-ml answers when no sample is newer than since_us
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=s.pid, timeStamp=s.timestamp_us, smUtil=int(s.sm_percent),
                                memUtil=int(s.memory_percent), encUtil=0, decUtil=0) for s in samples]

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

    # ------------------------------------------------------------- health side
    def nvmlEventSetCreate(self) -> tuple[str, int]:
        number = len(self.event_sets)
        self.event_sets[number], self.registered[number] = [], {}
        self.calls.append(f"event-set-create {number}")
        return ("set", number)

    def nvmlDeviceRegisterEvents(self, h: tuple[str, int], event_types: int, event_set: tuple[str, int]) -> None:
        if h[1] in self.register_errors:
            raise pynvml.NVMLError(self.register_errors[h[1]])
        self.registered[event_set[1]][h[1]] = event_types

    def post_event(self, index: int, xid: int, event_type: int = pynvml.nvmlEventTypeXidCriticalError,
                   gi: int = NO_INSTANCE, ci: int = NO_INSTANCE) -> None:
        """An event as NVML queues it: on the parent GPU's handle, in every live set the GPU is in.

        The event's type is not checked against the registered mask, so a stray type
        reaches the backend and its filter is what is tested."""
        data = SimpleNamespace(device=("dev", index), eventType=event_type, eventData=xid,
                               gpuInstanceId=gi, computeInstanceId=ci)
        for number, queue in self.event_sets.items():
            if number not in self.freed and index in self.registered[number]:
                queue.append(data)

    def post_error(self, code: int) -> None:
        for number, queue in self.event_sets.items():
            if number not in self.freed:
                queue.append(code)

    def nvmlEventSetWait_v2(self, event_set: tuple[str, int], timeout_ms: int) -> Any:
        assert event_set[1] not in self.freed, "wait on a freed event set"
        self.wait_timeouts.append(timeout_ms)
        queue = self.event_sets[event_set[1]]
        if not queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        item = queue.pop(0)
        if isinstance(item, int):
            raise pynvml.NVMLError(item)
        return item

    def nvmlDeviceGetIndex(self, h: tuple[str, int]) -> int:
        return h[1]

    def nvmlEventSetFree(self, event_set: tuple[str, int]) -> None:
        self.freed.append(event_set[1])
        self.calls.append(f"event-set-free {event_set[1]}")

    def _memory(self, index: int, query: Any) -> Any:
        if (index, query) not in self.memory:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        value = self.memory[(index, query)]
        if isinstance(value, pynvml.NVMLError):
            raise value
        return value

    def nvmlDeviceGetTotalEccErrors(self, h: tuple[str, int], error_type: int, counter_type: int) -> int:
        return int(self._memory(h[1], ("ecc", error_type, counter_type)))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: tuple[str, int]) -> int:
        return int(self._memory(h[1], "retired"))

    def nvmlDeviceGetRemappedRows(self, h: tuple[str, int]) -> tuple[int, int, int, int]:
        rows: tuple[int, int, int, int] = self._memory(h[1], "remapped")
        return rows

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")


def _pair(mig_enabled: bool = True, **kwargs: Any) -> tuple[SimulatedNvml, FakePynvml, RealNvml]:
    sim = SimulatedNvml(H200, 2, mig_enabled=mig_enabled)
    fake = FakePynvml(sim)
    return sim, fake, RealNvml(fake, **kwargs)


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


# ------------------------------------------------------------------ health signals
XID = pynvml.nvmlEventTypeXidCriticalError
UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED


def test_real_backend_is_still_a_whole_nvml_backend() -> None:
    _sim, _fake, real = _pair()
    assert isinstance(real, NvmlBackend) and isinstance(real, HealthReader)


def test_xid_events_registers_every_gpu_and_drains_without_blocking() -> None:
    _sim, fake, real = _pair(clock=lambda: 1234.5)
    assert real.xid_events() == ()  # makes the set; nothing queued yet
    assert fake.registered == {0: {0: XID, 1: XID}} and real.unwatched_gpus == {}
    fake.post_event(0, 79)  # whole GPU: NVML sends 0xFFFFFFFF for both instance ids
    fake.post_event(1, 94, gi=3, ci=0)  # inside MIG instance gi 3, compute instance 0
    fake.post_event(0, 0, event_type=pynvml.nvmlEventTypeSingleBitEccError)  # not a critical XID
    fake.post_event(1, 48, event_type=pynvml.nvmlEventTypeDoubleBitEccError)
    assert real.xid_events() == (
        XidEvent(gpu_index=0, xid=79, gi_id=None, ci_id=None, at=1234.5),
        XidEvent(gpu_index=1, xid=94, gi_id=3, ci_id=0, at=1234.5),
    )
    assert real.xid_events() == ()  # drained
    assert set(fake.wait_timeouts) == {0}  # never waits
    assert fake.calls.count("event-set-create 0") == 1 and len(fake.event_sets) == 1  # one set, reused


def test_xid_events_drain_is_capped_per_call() -> None:
    _sim, fake, real = _pair()
    real.xid_events()
    for i in range(MAX_EVENTS_PER_DRAIN + 5):
        fake.post_event(i % 2, 31 + i % 2)
    assert len(real.xid_events()) == MAX_EVENTS_PER_DRAIN
    assert len(fake.wait_timeouts) == MAX_EVENTS_PER_DRAIN + 1  # the first, empty drain's one wait
    assert len(real.xid_events()) == 5


def test_gpu_without_event_support_is_skipped_and_noted() -> None:
    _sim, fake, real = _pair()
    fake.register_errors[1] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert real.xid_events() == ()
    assert fake.registered == {0: {0: XID}}
    assert list(real.unwatched_gpus) == [1] and "NOT_SUPPORTED" in real.unwatched_gpus[1]
    fake.post_event(0, 79)
    assert [e.gpu_index for e in real.xid_events()] == [0]


def test_other_registration_error_frees_the_set_raises_and_retries() -> None:
    _sim, fake, real = _pair()
    fake.register_errors[1] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(NvmlError) as info:
        real.xid_events()
    assert info.value.code == errors.GPU_IS_LOST
    assert fake.freed == [0]
    del fake.register_errors[1]
    assert real.xid_events() == ()
    assert fake.registered[1] == {0: XID, 1: XID} and fake.freed == [0]


def test_lost_gpu_on_wait_raises_and_keeps_what_was_drained() -> None:
    _sim, fake, real = _pair(clock=lambda: 7.0)
    real.xid_events()
    fake.post_event(0, 79)
    fake.post_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NvmlError) as info:
        real.xid_events()
    assert info.value.code == errors.GPU_IS_LOST
    assert real.xid_events() == (XidEvent(0, 79, None, None, 7.0),)  # not lost with the failed call
    fake.post_error(pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(NvmlError) as other:
        real.xid_events()
    assert other.value.code == errors.UNKNOWN


def test_close_frees_the_event_set_before_shutdown() -> None:
    _sim, fake, real = _pair()
    real.xid_events()
    real.close()
    assert fake.calls[-2:] == ["event-set-free 0", "shutdown"]


def test_close_without_events_only_shuts_down() -> None:
    _sim, fake, real = _pair()
    real.close()
    assert fake.calls == ["shutdown"] and fake.freed == []


@pytest.mark.parametrize(("memory", "expected"), [
    pytest.param({("ecc", UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 2,
                  ("ecc", UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 5,
                  ("ecc", CORRECTED, pynvml.NVML_VOLATILE_ECC): 900,  # must not be read
                  ("ecc", CORRECTED, pynvml.NVML_AGGREGATE_ECC): 901,
                  "remapped": (4, 3, 1, 0)},  # no retired-pages entry: NOT_SUPPORTED (Ampere and later)
                 MemoryHealth(2, 5, None, True, False), id="hopper-pending-remap"),
    pytest.param({("ecc", UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
                  ("ecc", UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 0,
                  "remapped": (0, 2, 0, 1)},
                 MemoryHealth(0, 0, None, False, True), id="remap-failed"),
    pytest.param({"retired": pynvml.NVML_FEATURE_ENABLED}, MemoryHealth(None, None, True, None, None),
                 id="ecc-off-pages-pending"),
    pytest.param({"retired": pynvml.NVML_FEATURE_DISABLED}, MemoryHealth(None, None, False, None, None),
                 id="pages-not-pending"),
    pytest.param({}, MemoryHealth(None, None, None, None, None), id="nothing-supported"),
])
def test_memory_health_maps_counters_and_not_supported(memory: dict[Any, Any], expected: MemoryHealth) -> None:
    _sim, fake, real = _pair()
    fake.memory = {(1, query): value for query, value in memory.items()}
    assert real.memory_health(1) == expected


def test_memory_health_raises_other_errors() -> None:
    _sim, fake, real = _pair()
    fake.memory = {(0, "remapped"): pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)}
    with pytest.raises(NvmlError) as info:
        real.memory_health(0)
    assert info.value.code == errors.GPU_IS_LOST


def test_boot_id_is_read_stripped_and_is_the_reset_marker(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text("4b1c0d3e-1f2a-4c5b-9d8e-7f6a5b4c3d2e\n")
    _sim, _fake, real = _pair(boot_id_path=path)
    assert real.boot_id() == "4b1c0d3e-1f2a-4c5b-9d8e-7f6a5b4c3d2e"
    assert real.reset_marker(0) == real.reset_marker(1) == real.boot_id()
    path.write_text("0f0e0d0c-0000-4000-8000-000000000001\n")  # a reboot
    assert real.reset_marker(1) == "0f0e0d0c-0000-4000-8000-000000000001"


@pytest.mark.parametrize("name", ["missing", "empty", "directory"])
def test_unreadable_boot_id_gives_a_stable_fallback(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name == "empty":
        path.write_text("  \n")
    elif name == "directory":
        path.mkdir()
    _sim, _fake, real = _pair(boot_id_path=path)
    assert real.boot_id() == UNKNOWN_BOOT_ID == real.reset_marker(0)


def test_process_utilization_reads_samples_since_a_timestamp() -> None:
    sim, _fake, real = _pair(mig_enabled=False)
    sim.clock = lambda: 50.5
    sim.start_process(0, 11, 2048)
    sim.start_process(0, 12, 1024)
    sim.set_process_load(0, 11, 40.0)
    samples = real.process_utilization(0, 0)
    assert [(s.pid, s.timestamp_us, s.sm_percent) for s in samples] == [(11, 50_000_000, 40.0)]  # 12 idle: absent
    assert real.process_utilization(0, samples[0].timestamp_us) == ()  # NOT_FOUND: nothing newer


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS], ids=["not-found", "success"])
def test_process_utilization_without_samples_is_empty(code: int) -> None:
    _sim, fake, real = _pair(mig_enabled=False)
    fake.process_utilization_error = code  # SUCCESS: nvidia-ml-py's sizing call found no sample at all
    assert real.process_utilization(1, 0) == ()


def test_process_utilization_on_mig_and_other_errors_are_raised() -> None:
    _sim, fake, real = _pair(mig_enabled=True)
    with pytest.raises(NvmlError) as info:
        real.process_utilization(0, 0)
    assert info.value.code == errors.NOT_SUPPORTED
    fake.process_utilization_error = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(NvmlError) as info:
        real.process_utilization(0, 0)
    assert info.value.code == errors.NO_PERMISSION

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

Per-process utilisation (``process_utilization``) is ``nvmlDeviceGetProcessUtilization``:
the samples newer than the timestamp passed, NOT_FOUND (no sample newer) read as none.
nvidia-ml-py sizes the buffer with a first call and raises the code of that call when it
is not INSUFFICIENT_SIZE, so "no sample at all" can also come back as SUCCESS: read as
none too.

Health signals follow NVIDIA's k8s-device-plugin (``internal/rm/health.go``). Every
GPU is registered for ``nvmlEventTypeXidCriticalError`` in one event set, created on
the first ``xid_events()`` call; a GPU that answers NOT_SUPPORTED (too old for
events) is skipped and noted in ``unwatched_gpus``. Where the plugin blocks in
``nvmlEventSetWait`` in its own goroutine, ``xid_events()`` polls: it drains what is
queued with a 0 ms wait and returns. A failed wait (GPU_IS_LOST, ...) is raised, and
``node.health`` then treats every GPU as unhealthy, as the plugin does. Memory health
comes from counters (uncorrected ECC errors, pending page retirement, pending or
failed row remapping), each None where the GPU does not support the query. NVML has
no reset counter: ``reset_marker`` is the node's boot id, so only a reboot shows as a
reset, and faults that need a GPU reset end with an admin's acknowledgement.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from mig.model import Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import (
    DeviceInfo,
    GpuInstance,
    GpuProcess,
    InstanceProfile,
    MemoryHealth,
    ProcessSample,
    Utilization,
    XidEvent,
)

T = TypeVar("T")
MAX_PLACEMENTS = 16
MAX_INSTANCES = 8
MAX_EVENTS_PER_DRAIN = 1024
"""Most ``nvmlEventSetWait_v2`` calls one ``xid_events()`` makes; the rest waits for the next call."""
NOT_A_MIG_INSTANCE = 0xFFFFFFFF
"""What NVML puts in an event's GPU- and compute-instance ids when the event is not tied to one."""
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
UNKNOWN_BOOT_ID = "unknown"
"""``boot_id()`` when the boot id cannot be read: stable, so it never looks like a reboot."""
MAX_BOOT_ID_CHARS = 64  # GPUNode status fields boot_id and reset_marker allow 64


@contextmanager
def _translated() -> Iterator[None]:
    import pynvml  # type: ignore[import-untyped]

    try:
        yield
    except pynvml.NVMLError as exc:
        raise NvmlError(int(exc.value), str(exc)) from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _instance_id(value: Any) -> int | None:
    return None if int(value) == NOT_A_MIG_INSTANCE else int(value)


class RealNvml:
    """NVML on the host. Create with ``RealNvml.open()``; ``close()`` frees the event set
    and calls ``nvmlShutdown``.

    ``clock`` stamps XID events (Unix seconds); ``boot_id_path`` is where ``boot_id()``
    reads the kernel's boot id. Both are there for tests.
    """

    kind = "nvml"

    def __init__(self, nvml: Any, *, clock: Callable[[], float] = time.time,
                 boot_id_path: str | Path = BOOT_ID_PATH) -> None:
        self._nvml = nvml
        self._profiles: dict[int, tuple[InstanceProfile, ...]] = {}
        self._clock = clock
        self._boot_id_path = Path(boot_id_path)
        self._event_set: Any = None
        self._undelivered: list[XidEvent] = []
        self.unwatched_gpus: dict[int, str] = {}
        """GPU index -> why it is not registered for XID events (NOT_SUPPORTED: too old).
        Filled when the event set is made; the caller decides how loudly to warn."""

    @classmethod
    def open(cls, *, clock: Callable[[], float] = time.time, boot_id_path: str | Path = BOOT_ID_PATH) -> RealNvml:
        try:
            import pynvml
        except ImportError as exc:  # nvidia-ml-py is a dependency; this is a broken install
            raise NvmlError(errors.LIBRARY_NOT_FOUND, f"nvidia-ml-py not importable: {exc}") from exc
        with _translated():
            pynvml.nvmlInit()
        return cls(pynvml, clock=clock, boot_id_path=boot_id_path)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        with _translated():
            return fn(*args)

    def _handle(self, index: int) -> Any:
        return self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)

    def _unless_unsupported(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)``, or None where NVML answers NOT_SUPPORTED; other errors are raised."""
        try:
            return self._call(fn, *args)
        except NvmlError as exc:
            if exc.code != errors.NOT_SUPPORTED:
                raise
            return None

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

    # ---------------------------------------------------------------- usage side
    def process_utilization(self, index: int, since_us: int) -> tuple[ProcessSample, ...]:
        try:
            raw = self._call(self._nvml.nvmlDeviceGetProcessUtilization, self._handle(index), since_us)
        except NvmlError as exc:
            if exc.code in (errors.NOT_FOUND, errors.SUCCESS):  # no sample newer than since_us
                return ()
            raise
        return tuple(ProcessSample(int(s.pid), int(s.timeStamp), float(s.smUtil), float(s.memUtil)) for s in raw)

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

    # -------------------------------------------------------------- health side
    def _events(self) -> Any:
        """The event set every GPU is registered in for critical XIDs, made on first use.

        As in k8s-device-plugin ``internal/rm/health.go`` (``registerDevices``): one set,
        each GPU registered for ``XidCriticalError``, a GPU that answers NOT_SUPPORTED
        (too old for events) skipped with a warning. The plugin also marks that GPU
        unhealthy; here it is only noted in ``unwatched_gpus``, and what to do about an
        unwatched GPU is ``node.health``'s decision. Any other registration error frees
        the set and is raised; the next call tries again. Events are only queued from
        registration on: call ``xid_events()`` once at start-up.
        """
        if self._event_set is not None:
            return self._event_set
        n = self._nvml
        event_set = self._call(n.nvmlEventSetCreate)
        unwatched: dict[int, str] = {}
        try:
            for index in range(self.device_count()):
                try:
                    self._call(n.nvmlDeviceRegisterEvents, self._handle(index),
                               n.nvmlEventTypeXidCriticalError, event_set)
                except NvmlError as exc:
                    if exc.code != errors.NOT_SUPPORTED:
                        raise
                    unwatched[index] = f"GPU {index} does not support XID events ({exc.name}); not watched"
        except NvmlError:
            with suppress(NvmlError):
                self._call(n.nvmlEventSetFree, event_set)
            raise
        self._event_set, self.unwatched_gpus = event_set, unwatched
        return event_set

    def xid_events(self) -> tuple[XidEvent, ...]:
        """Critical-XID events queued since the last call, without blocking.

        Waits with a 0 ms timeout until NVML answers TIMEOUT (queue empty), at most
        ``MAX_EVENTS_PER_DRAIN`` times. Other event types are skipped, as the device
        plugin skips them. A failed wait, or an event whose GPU NVML cannot name, raises
        ``NvmlError``: the device plugin marks every device unhealthy then, and so does
        ``node.health``. Events read before such a failure are kept and returned by the
        next call that succeeds.
        """
        n = self._nvml
        event_set = self._events()
        for _ in range(MAX_EVENTS_PER_DRAIN):
            try:
                data = self._call(n.nvmlEventSetWait_v2, event_set, 0)
            except NvmlError as exc:
                if exc.code == errors.TIMEOUT:
                    break  # nothing (more) queued
                raise
            if int(data.eventType) != n.nvmlEventTypeXidCriticalError:
                continue
            # NVML reports a MIG instance's XID on the parent GPU's handle, with the
            # instance in gpuInstanceId/computeInstanceId (0xFFFFFFFF when not tied to one).
            index = int(self._call(n.nvmlDeviceGetIndex, data.device))
            self._undelivered.append(XidEvent(
                gpu_index=index, xid=int(data.eventData), gi_id=_instance_id(data.gpuInstanceId),
                ci_id=_instance_id(data.computeInstanceId), at=self._clock(),
            ))
        drained, self._undelivered = tuple(self._undelivered), []
        return drained

    def memory_health(self, index: int) -> MemoryHealth:
        """Uncorrected ECC counts, pending page retirement, pending or failed row remapping.

        A field is None where the GPU answers NOT_SUPPORTED: ECC turned off, page
        retirement on Ampere and later (they remap rows instead), row remapping before
        Ampere. Other errors are raised.
        """
        n = self._nvml
        handle = self._handle(index)
        uncorrected = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile = self._unless_unsupported(n.nvmlDeviceGetTotalEccErrors, handle, uncorrected, n.NVML_VOLATILE_ECC)
        aggregate = self._unless_unsupported(n.nvmlDeviceGetTotalEccErrors, handle, uncorrected, n.NVML_AGGREGATE_ECC)
        pages = self._unless_unsupported(n.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        rows = self._unless_unsupported(n.nvmlDeviceGetRemappedRows, handle)  # (corr, unc, pending, failed)
        return MemoryHealth(
            volatile_uncorrected=None if volatile is None else int(volatile),
            aggregate_uncorrected=None if aggregate is None else int(aggregate),
            retired_pages_pending=None if pages is None else int(pages) == n.NVML_FEATURE_ENABLED,
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failed=None if rows is None else bool(rows[3]),
        )

    def boot_id(self) -> str:
        """The kernel's boot id (``/proc/sys/kernel/random/boot_id``), stripped.

        ``UNKNOWN_BOOT_ID`` when it cannot be read or is empty: never raises, and stays
        the same, so an unreadable boot id hides reboots rather than inventing them.
        """
        try:
            text = self._boot_id_path.read_text(encoding="utf-8").strip()
        except (OSError, ValueError):
            return UNKNOWN_BOOT_ID
        return text[:MAX_BOOT_ID_CHARS] or UNKNOWN_BOOT_ID

    def reset_marker(self, index: int) -> str:
        """The node's boot id, for every GPU (``index`` is not used).

        NVML keeps no reset counter or last-reset time, so a reboot is the only reset
        this backend can see. A GPU reset without a reboot (``nvidia-smi -r``) leaves
        the marker unchanged: faults whose recovery is a reset then end with an
        admin's acknowledgement (annotation ``gpupack.io/health-acknowledged``).
        """
        return self.boot_id()

    def close(self) -> None:
        """Free the event set (if one was made), then ``nvmlShutdown`` even if freeing failed."""
        event_set, self._event_set = self._event_set, None
        try:
            if event_set is not None:
                self._call(self._nvml.nvmlEventSetFree, event_set)
        finally:
            with _translated():
                self._nvml.nvmlShutdown()

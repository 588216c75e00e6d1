"""The NVML backend interface: small Protocols and the plain values they return.

Four narrow roles, as mig-parted splits its managers: ``NvmlReader`` reads (devices,
profiles, instances, processes, utilisation), ``MigPartitioner`` creates and
destroys GPU instances at explicit placements, ``HealthReader`` reads fault
signals (XID events, memory errors, resets), and ``UsageReader`` reads per-process
utilisation samples (what each pod uses of a shared GPU). ``NvmlBackend`` is all four. The real
backend (``node.nvml.real``) and the simulation (``node.nvml.simulated``) implement
it; everything above this layer sees only these types, never pynvml's ctypes.

Every method may raise ``node.nvml.errors.NvmlError`` carrying NVML's return code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from mig.model import PlacedInstance, Placement


@dataclass(frozen=True)
class DeviceInfo:
    """A physical GPU as NVML describes it."""

    index: int
    uuid: str
    name: str
    """``nvmlDeviceGetName``, e.g. ``NVIDIA H200``."""
    pci_device_id: str
    """mig-parted ``device-filter`` form: ``0x<device><vendor>``, e.g. ``0x233510DE``."""
    pci_bus_id: str
    memory_total_mib: int
    mig_capable: bool
    mig_enabled: bool
    """Current MIG mode."""
    mig_pending: bool
    """Pending MIG mode (differs from current until the GPU is reset)."""


@dataclass(frozen=True)
class InstanceProfile:
    """A GPU-instance profile read from NVML (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    name: str
    """Without NVML's ``MIG `` prefix, e.g. ``1g.18gb``; the device plugin's name."""
    profile_id: int
    nvml_index: int
    slice_count: int
    memory_mib: int
    max_count: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class GpuInstance:
    """An existing GPU instance and the MIG device (its compute instance) on it."""

    gi_id: int
    profile_id: int
    profile: str
    placement: Placement
    uuid: str
    """``MIG-...`` UUID of the MIG device, what the device plugin hands to containers."""
    compute_instances: int = 1

    @property
    def placed(self) -> PlacedInstance:
        return PlacedInstance(self.profile, self.placement)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU; ``gi_id`` set when it runs inside a MIG instance."""

    pid: int
    used_memory_mib: int
    gi_id: int | None = None
    ci_id: int | None = None


@dataclass(frozen=True)
class ProcessSample:
    """One process's utilisation over NVML's last sample period (``nvmlProcessUtilizationSample_t``).

    NVML returns one per process that had *non-zero* utilisation in the period: a running
    process absent from the samples was idle.
    """

    pid: int
    timestamp_us: int
    """CPU time of the sample, microseconds since the epoch: what the next read passes as ``since_us``."""
    sm_percent: float
    """Share of the period a kernel of this process ran on the SMs (``smUtil``), 0..100."""
    memory_percent: float
    """Share of the period this process read or wrote device memory (``memUtil``), 0..100; not its size."""


UtilSource = Literal["nvml", "memory-and-processes", "dcgm"]


@dataclass(frozen=True)
class Utilization:
    """How busy a GPU is.

    ``gpu_percent`` is None where NVML cannot say: ``nvmlDeviceGetUtilizationRates``
    returns NOT_SUPPORTED on MIG-enabled GPUs, so there the agent reports memory use
    and process presence instead (``source="memory-and-processes"``), or DCGM's
    per-instance activity when DCGM is present.
    """

    gpu_percent: float | None
    memory_used_mib: int
    memory_total_mib: int
    processes: int
    source: UtilSource


@dataclass(frozen=True)
class XidEvent:
    """A critical-XID event NVML delivered (``nvmlEventTypeXidCriticalError``)."""

    gpu_index: int
    xid: int
    gi_id: int | None = None
    """GPU-instance id when NVML ties the event to a MIG instance (it sends 0xFFFFFFFF otherwise)."""
    ci_id: int | None = None
    """Compute-instance id, likewise."""
    at: float = 0.0
    """Unix time at which the backend received it."""


@dataclass(frozen=True)
class MemoryHealth:
    """A GPU's memory error counters and repair state; None where NVML does not support the query."""

    volatile_uncorrected: int | None = None
    """Uncorrected ECC errors since the last driver load or GPU reset."""
    aggregate_uncorrected: int | None = None
    """Uncorrected ECC errors over the GPU's life."""
    retired_pages_pending: bool | None = None
    """Pages are waiting to be retired at the next reset (``nvmlDeviceGetRetiredPagesPendingStatus``)."""
    remapped_rows_pending: bool | None = None
    """Rows are waiting to be remapped at the next reset (``nvmlDeviceGetRemappedRows``)."""
    remapped_rows_failed: bool | None = None
    """A row remapping failed: the GPU needs to be replaced."""


@runtime_checkable
class HealthReader(Protocol):
    """The fault signals of the node's GPUs (``node.health`` turns them into faults)."""

    def xid_events(self) -> tuple[XidEvent, ...]:
        """Critical-XID events received since the last call; never blocks."""
        ...

    def memory_health(self, index: int) -> MemoryHealth: ...

    def boot_id(self) -> str:
        """Changes when the node reboots."""
        ...

    def reset_marker(self, index: int) -> str:
        """Changes when the GPU is reset (or the node reboots), as far as the backend can tell."""
        ...


@runtime_checkable
class NvmlReader(Protocol):
    def device_count(self) -> int: ...

    def device_info(self, index: int) -> DeviceInfo: ...

    def instance_profiles(self, index: int) -> tuple[InstanceProfile, ...]: ...

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]: ...

    def processes(self, index: int) -> tuple[GpuProcess, ...]: ...

    def utilization(self, index: int) -> Utilization: ...


@runtime_checkable
class UsageReader(Protocol):
    def process_utilization(self, index: int, since_us: int) -> tuple[ProcessSample, ...]:
        """``nvmlDeviceGetProcessUtilization``: the samples of GPU ``index`` newer than ``since_us``
        (0: every sample NVML still holds). No sample newer than ``since_us`` (every process idle, or
        none running) is an empty tuple, where NVML answers NOT_FOUND. NOT_SUPPORTED on a MIG-enabled
        GPU (NVML samples no process there) and on GPUs older than Maxwell."""
        ...


@runtime_checkable
class MigPartitioner(Protocol):
    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> GpuInstance:
        """Create a GPU instance at ``placement`` and its one full-size compute instance."""
        ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy the GPU instance ``gi_id`` and its compute instances."""
        ...


@runtime_checkable
class NvmlBackend(NvmlReader, MigPartitioner, HealthReader, UsageReader, Protocol):
    kind: str
    """``nvml`` or ``simulated``: published in status so nobody mistakes one for the other."""

    def close(self) -> None: ...

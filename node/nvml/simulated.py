"""SIMULATED NVML: N GPUs of one product for machines without GPUs.

The product is a MIG-capable model of ``mig/``'s catalog, or a GPU without MIG
(``node.nvml.products.PlainGpu``: openb's GPU types, named and sized by the same
mapping as the trace simulator's product model); :func:`simulated_backend` builds
either from a name.

This is a simulation, named so everywhere it surfaces (``kind = "simulated"``,
published in ``GPUNode`` status). It enforces the placement rules of ``mig/``
(``mig.geometry.can_add``, the same rules NVML enforces on the hardware) and
answers with NVML's real error codes:

* ``IN_USE`` destroying an instance with a running process;
* ``INSUFFICIENT_RESOURCES`` when slices are taken or the profile's count is reached;
* ``INVALID_ARGUMENT`` for a placement the profile does not offer or an unknown id;
* ``NOT_SUPPORTED`` for MIG calls on a GPU whose MIG mode is off, and for every MIG
  call on a GPU without MIG (profiles, instances, create, destroy, and a MIG-mode
  change either way: such a GPU has no MIG mode to set);
* ``RESET_REQUIRED`` while a MIG-mode change is pending (needs a GPU reset);
* ``NOT_FOUND`` for an unknown GPU-instance id;
* ``NOT_SUPPORTED`` for per-process utilisation on a MIG-enabled GPU.

Per-process utilisation (``process_utilization``) follows ``nvmlDeviceGetProcessUtilization``:
the simulated driver samples every ``SAMPLE_PERIOD_S``; a read returns, for the latest
sample period newer than the timestamp passed, one sample per process whose SM load
(``set_process_load``) is above zero, stamped with the period's start in microseconds;
a read with nothing newer returns none (NVML's NOT_FOUND). A GPU's own utilisation is at
least its processes' summed SM load (capped at 100), as a GPU is busy whenever one of
its processes runs a kernel.

MPS follows what the real NVML does (benchmarks/nvml_usage_check.md, measured on an H200): on a
GPU whose MIG mode is off and that the device plugin serves through MPS (``set_mps``, persisted
with the GPU), an MPS server process (pid ``MPS_SERVER_PID_BASE`` + the GPU's index, no pod's,
``MPS_SERVER_MEMORY_MIB``) runs while at least one client does. The clients keep their own
memory in ``processes``, but their SM load is sampled to the server: one sample, their loads
summed (capped at 100), and none for the clients.

A usage trace can drive the processes instead (``play_trace``, the agent's ``--usage-trace``):
whenever a snapshot begins (``device_count``), each process is bound to a pod of a GenTD26 trace
and takes its duty cycle as SM load and its memory, at the scaled time
(``sharing.usage.playback`` holds the rules: time, binding, a trace pod's end). Memory is held
to what the device has, as the driver holds it: a process may always shrink, and grows only into
memory no other process of its GPU (of its MIG instance, in MIG mode) holds; a growth that does
not fit is an allocation that fails (an OOM in the workload): the process keeps what it got, and
``memory_limit_hits`` counts one per episode.

An MPS client is also held to its own memory limit, as the real driver holds it
(benchmarks/nvml_usage_check.md: a client over its pinned limit gets ``CUDA out of memory``). The limit
is the client's, fixed when it starts: a process started on a GPU served through MPS (MIG mode off)
takes ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from the environment its starter passes
(``start_process(env=...)``, read by ``sharing.api.mps_env``: its entry for device 0, the device as the
container numbers it, or for the GPU's UUID), narrowed to the MPS control daemon's default for the GPU
(``set_mps(default_limit_mib=...)``): a client's value only narrows the daemon's (NVIDIA's MPS
documentation, "Appendix: Environment Variables"). It is kept with the process in the state file.
A growth past it fails like one past the device: the process grows to its limit and no further (the
allocations that fit succeed), and counts a hit once per episode; shrinking is always allowed.
Time-sliced and whole GPUs ignore the variable, as CUDA does without an MPS daemon, and a MIG
instance bounds its processes' memory already. A malformed value is refused at the start, on any GPU
(a pod fails the same wherever it lands), with an error naming it (``sharing.api.mps_env.MpsEnvError``),
as a real client fails to start: it is never
ignored, which would let the client use the whole GPU.

Tests and the demo can inject faults (an error code for the next N calls of an
operation, optionally *after* the operation took effect, as a driver that hangs
up mid-call would) and delays, and hook every call (to kill the agent at any step).

GPU faults, with the semantics of the real driver (``HealthReader``): a critical
XID on a GPU or on one MIG instance (delivered once, by ``xid_events``); an ECC
burst (uncorrected counters grow, pages wait for retirement until a reset); a row
remapping pending or failed; a lost GPU (XID 79, then every call on it answers
``GPU_IS_LOST`` until the node reboots); a GPU reset (refused while processes run
or the GPU is lost; destroys its MIG instances and clears what a reset clears); a
reboot (everything but lifetime counters and a failed remapping starts afresh);
a repair (a replaced GPU: its failure signals gone). They are injected by calling
the methods, or, from another process, through an inbox file next to the state
file (``<state file>.inbox``, JSON lines, see :func:`post_to_inbox`) that the
backend reads whenever a snapshot begins (``device_count``).
State is persisted to a JSON file after every change (write, fsync, rename), so
an agent restarted on the same file sees the same GPUs, instances and processes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from kube.inputfile import InputFileError, read_text
from mig.geometry import can_add
from mig.model import GpuModel, PlacedInstance, Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.products import PlainGpu, SimulatedProduct, resolve_product
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
from sharing.api.mps_env import pinned_memory_mib
from sharing.usage.playback import TracePlayer
from sharing.usage.trace import UsageTrace

log = logging.getLogger("gpupack.simulated-nvml")
STATE_VERSION = 1
XID_FELL_OFF_THE_BUS = 79
INBOX_OPERATIONS = ("xid", "ecc", "remap", "lose", "reset", "reboot", "repair")
"""What another process may post to a simulated node's inbox (``gpupack agent fault``)."""
OPERATIONS = (
    "device_info", "instance_profiles", "gpu_instances", "processes", "utilization", "create", "destroy",
    "process_utilization",
)
MPS_SERVER_PID_BASE = 3_900_000
"""The simulated MPS server of GPU i has pid ``MPS_SERVER_PID_BASE + i``: below the pods' processes
(``node.base.pods.SIM_PID_BASE``), so the emulated device plugin never takes it for a pod's."""
MPS_SERVER_MEMORY_MIB = 66
"""What the MPS server held on an H200 (benchmarks/nvml_usage_check.md)."""
SAMPLE_PERIOD_S = 1.0
"""The simulated driver's utilisation sample period (NVML's is 1/6 s to 1 s, by product)."""

T = TypeVar("T")
CallHook = Callable[[str, int, str], None]
"""``hook(operation, gpu_index, "before" | "after")``; may raise to simulate a kill."""


@dataclass
class _Instance:
    gi_id: int
    profile: str
    start: int
    size: int
    uuid: str


@dataclass
class _Process:
    pid: int
    used_memory_mib: int
    gi_id: int | None
    sm_percent: float = 0.0
    """SM load the process puts on its GPU, 0..100 (``set_process_load``)."""
    owner: str = ""
    """The pod (``namespace/name``) the process runs for, when its starter said: what a real
    process's cgroup tells. A usage trace's explicit mapping binds by it."""
    trace_pod: str = ""
    """The usage-trace pod the process plays (``play_trace``); empty until bound."""
    memory_limit_hits: int = 0
    """Growths of its memory that found the device full (each an allocation that failed)."""
    memory_capped: bool = False
    """Its last growth did not fit: the episode goes on until its memory fits again."""
    mps_limit_mib: int | None = None
    """An MPS client's pinned device memory limit, fixed at its start (module docstring); None: none."""


@dataclass
class _Gpu:
    index: int
    uuid: str
    mig_enabled: bool
    mig_pending: bool
    load_percent: float = 0.0
    next_gi_id: int = 1
    created_total: int = 0
    instances: list[_Instance] = field(default_factory=list)
    processes: list[_Process] = field(default_factory=list)
    lost: bool = False
    resets: int = 0
    volatile_uncorrected: int = 0
    aggregate_uncorrected: int = 0
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    remapped_rows_failed: bool = False
    mps: bool = False
    """The device plugin serves this GPU through MPS (``set_mps``): its clients' SM samples go to the server."""
    mps_default_limit_mib: int | None = None
    """The MPS control daemon's default pinned memory limit for this GPU's clients (``set_mps``); None: none."""


@dataclass
class Fault:
    """Fail the next ``times`` calls of ``operation`` (on ``gpu``, or any) with ``code``."""

    operation: str
    code: int
    gpu: int | None = None
    times: int = 1
    after_effect: bool = False
    """Raise after the operation took effect (the caller cannot tell it happened)."""


class SimulatedNvml:
    """A simulated NVML backend; see the module docstring."""

    kind = "simulated"

    def __init__(
        self,
        model: SimulatedProduct,
        count: int,
        state_file: Path | str | None = None,
        *,
        seed: str = "gpupack-sim",
        mig_enabled: bool | None = None,
        delays: Mapping[str, float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``mig_enabled``: the GPUs' MIG mode at first start (default: on where the GPU has MIG)."""
        if count < 1:
            raise ValueError(f"simulated GPU count must be at least 1, got {count}")
        unknown = set(delays or {}) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown operation(s) {sorted(unknown)} in delays; valid: {', '.join(OPERATIONS)}")
        self.model: SimulatedProduct = model
        self._mig_model: GpuModel | None = model if isinstance(model, GpuModel) else None
        self._pci_device_id = model.pci_device_id if isinstance(model, PlainGpu) else model.pci_device_ids[0]
        if mig_enabled is None:
            mig_enabled = self._mig_model is not None
        elif mig_enabled and self._mig_model is None:
            raise ValueError(f"{model.display_name} has no MIG: its MIG mode cannot be enabled")
        self._path = Path(state_file) if state_file is not None else None
        self._delays = dict(delays or {})
        self._sleep = sleep
        self._faults: list[Fault] = []
        self._xids: list[XidEvent] = []
        self._boot = 1
        self.clock: Callable[[], float] = time.time
        self.hook: CallHook | None = None
        self.player: TracePlayer | None = None
        self._trace_start: float | None = None
        loaded = self._load(count) if self._path is not None and self._path.exists() else None
        if loaded is not None:
            self._gpus = loaded
        else:
            self._gpus = [
                _Gpu(i, _uuid("GPU", seed, str(i)), mig_enabled, mig_enabled) for i in range(count)
            ]
            self._save()

    # ----------------------------------------------------------------- read side
    def device_count(self) -> int:
        # Every snapshot starts here: faults posted by other processes take effect before it is read,
        # and a usage trace moves the processes to the use they have now.
        self.read_inbox()
        self._play()
        return len(self._gpus)

    def device_info(self, index: int) -> DeviceInfo:
        gpu = self._enter("device_info", index)
        info = DeviceInfo(
            index=gpu.index,
            uuid=gpu.uuid,
            name=self.model.display_name,
            pci_device_id=self._pci_device_id,
            pci_bus_id=f"00000000:{0x17 + gpu.index:02X}:00.0",
            memory_total_mib=self.model.memory_mib,
            mig_capable=self._mig_model is not None,
            mig_enabled=gpu.mig_enabled,
            mig_pending=gpu.mig_pending,
        )
        return self._leave("device_info", index, info)

    def instance_profiles(self, index: int) -> tuple[InstanceProfile, ...]:
        gpu = self._enter("instance_profiles", index)
        model = self._require_mig(gpu)
        profiles = tuple(
            InstanceProfile(p.name, p.profile_id, p.nvml_index, p.compute_slices, p.memory_mib, p.max_count, p.placements)
            for p in model.profiles
        )
        return self._leave("instance_profiles", index, profiles)

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        gpu = self._enter("gpu_instances", index)
        model = self._require_mig(gpu)
        result = tuple(
            GpuInstance(i.gi_id, model.profile(i.profile).profile_id, i.profile, Placement(i.start, i.size), i.uuid)
            for i in sorted(gpu.instances, key=lambda i: (i.start, i.gi_id))
        )
        return self._leave("gpu_instances", index, result)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        gpu = self._enter("processes", index)
        result = tuple(GpuProcess(p.pid, p.used_memory_mib, p.gi_id, 0 if p.gi_id is not None else None)
                       for p in self._running(gpu))
        return self._leave("processes", index, result)

    def utilization(self, index: int) -> Utilization:
        gpu = self._enter("utilization", index)
        running = self._running(gpu)
        used = sum(p.used_memory_mib for p in running)
        if gpu.mig_enabled:
            # As on hardware: no whole-GPU utilisation rate in MIG mode.
            util = Utilization(None, used, self.model.memory_mib, len(running), "memory-and-processes")
        else:
            busy = max(gpu.load_percent, min(100.0, sum(p.sm_percent for p in gpu.processes)))
            util = Utilization(busy, used, self.model.memory_mib, len(running), "nvml")
        return self._leave("utilization", index, util)

    def process_utilization(self, index: int, since_us: int) -> tuple[ProcessSample, ...]:
        gpu = self._enter("process_utilization", index)
        if gpu.mig_enabled:
            raise NvmlError(errors.NOT_SUPPORTED, f"no per-process utilisation on GPU {index}: MIG mode is on")
        period_us = int(SAMPLE_PERIOD_S * 1_000_000)
        latest = int(self.clock() * 1_000_000) // period_us * period_us
        # Under MPS the clients' kernels run in the server's context: only the server is sampled.
        sampled = [self._mps_server(gpu)] if self._serves_mps(gpu) else gpu.processes
        samples = () if latest <= since_us else tuple(
            ProcessSample(p.pid, latest, p.sm_percent, 0.0) for p in sampled if p.sm_percent > 0)
        return self._leave("process_utilization", index, samples)

    # ---------------------------------------------------------------- write side
    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> GpuInstance:
        gpu = self._enter("create", index)
        model = self._require_mig(gpu)
        profile = next((p for p in model.profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise NvmlError(errors.INVALID_ARGUMENT, f"no GPU-instance profile id {profile_id} on {model.product}")
        if placement not in profile.placements:
            raise NvmlError(
                errors.INVALID_ARGUMENT,
                f"placement {placement} not offered for {profile.name}; possible: {', '.join(map(str, profile.placements))}",
            )
        existing = [PlacedInstance(i.profile, Placement(i.start, i.size)) for i in gpu.instances]
        reason = can_add(model, existing, PlacedInstance(profile.name, placement))
        if reason is not None:
            raise NvmlError(errors.INSUFFICIENT_RESOURCES, reason)
        gpu.created_total += 1
        inst = _Instance(gpu.next_gi_id, profile.name, placement.start, placement.size,
                         _uuid("MIG", gpu.uuid, str(gpu.created_total)))
        gpu.next_gi_id += 1
        gpu.instances.append(inst)
        self._save()
        result = GpuInstance(inst.gi_id, profile.profile_id, profile.name, placement, inst.uuid)
        return self._leave("create", index, result)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        gpu = self._enter("destroy", index)
        self._require_mig(gpu)
        inst = next((i for i in gpu.instances if i.gi_id == gi_id), None)
        if inst is None:
            raise NvmlError(errors.NOT_FOUND, f"no GPU instance {gi_id} on GPU {index}")
        users = [p.pid for p in gpu.processes if p.gi_id == gi_id]
        if users:
            raise NvmlError(errors.IN_USE, f"GPU instance {gi_id} has running processes {users}")
        gpu.instances.remove(inst)
        self._save()
        self._leave("destroy", index, None)

    def close(self) -> None:
        self._save()

    # --------------------------------------------------------------- health side
    def xid_events(self) -> tuple[XidEvent, ...]:
        events, self._xids = tuple(self._xids), []
        return events

    def memory_health(self, index: int) -> MemoryHealth:
        gpu = self._gpu(index)
        self._require_present(gpu)
        return MemoryHealth(gpu.volatile_uncorrected, gpu.aggregate_uncorrected, gpu.retired_pages_pending,
                            gpu.remapped_rows_pending, gpu.remapped_rows_failed)

    def boot_id(self) -> str:
        return f"simulated-boot-{self._boot}"

    def reset_marker(self, index: int) -> str:
        return f"{self._boot}/{self._gpu(index).resets}"

    # ------------------------------------------------- simulation controls (not NVML)
    def inject_xid(self, index: int, xid: int, gi_id: int | None = None) -> None:
        """A critical XID on GPU ``index`` (on its instance ``gi_id`` when given)."""
        gpu = self._gpu(index)
        self._require_present(gpu)
        if not 0 < xid <= 65535:
            raise ValueError(f"XID must be 1..65535, got {xid}")
        if gi_id is not None and all(i.gi_id != gi_id for i in gpu.instances):
            raise ValueError(f"GPU {index} has no GPU instance {gi_id} (it has: "
                             f"{', '.join(str(i.gi_id) for i in gpu.instances) or 'none'})")
        self._xids.append(XidEvent(index, xid, gi_id, 0 if gi_id is not None else None, self.clock()))

    def inject_ecc(self, index: int, errors_: int = 1, *, retire: bool = True) -> None:
        """``errors_`` uncorrected ECC errors; with ``retire`` their pages wait for retirement at the next reset."""
        gpu = self._gpu(index)
        self._require_present(gpu)
        if errors_ < 1:
            raise ValueError(f"ECC error count must be at least 1, got {errors_}")
        gpu.volatile_uncorrected += errors_
        gpu.aggregate_uncorrected += errors_
        gpu.retired_pages_pending = gpu.retired_pages_pending or retire
        self._save()

    def inject_row_remap(self, index: int, *, failed: bool = False) -> None:
        """A row remapping waits for the next reset, or (``failed``) could not be made."""
        gpu = self._gpu(index)
        self._require_present(gpu)
        if failed:
            gpu.remapped_rows_failed = True
        else:
            gpu.remapped_rows_pending = True
        self._save()

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus: XID 79, then ``GPU_IS_LOST`` on every call until a reboot."""
        gpu = self._gpu(index)
        if not gpu.lost:
            self._xids.append(XidEvent(index, XID_FELL_OFF_THE_BUS, None, None, self.clock()))
        gpu.lost = True
        self._save()

    def reboot(self) -> None:
        """The node reboots: every process ends, MIG instances are gone (MIG mode stays), lost GPUs are back."""
        self._boot += 1
        self._xids.clear()
        for gpu in self._gpus:
            gpu.processes.clear()
            gpu.instances.clear()
            gpu.mig_enabled = gpu.mig_pending
            self._clear_on_reset(gpu)
            gpu.lost = False
        self._save()

    def repair(self, index: int) -> None:
        """The GPU was replaced or fixed: its failure signals are gone (counters over its life stay)."""
        gpu = self._gpu(index)
        gpu.lost = gpu.remapped_rows_failed = gpu.remapped_rows_pending = gpu.retired_pages_pending = False
        gpu.volatile_uncorrected = 0
        self._save()

    def read_inbox(self) -> int:
        """Apply what other processes posted to ``<state file>.inbox``; returns how many entries."""
        if self._path is None:
            return 0
        entries = take_inbox(inbox_path(self._path))
        for entry in entries:
            try:
                self._apply(entry)
            except (ValueError, TypeError, KeyError, NvmlError) as exc:
                log.warning("SIMULATED NVML: inbox entry %s not applied: %s", entry, exc)
        return len(entries)

    def _apply(self, entry: Mapping[str, object]) -> None:
        op, gpu = entry.get("op"), entry.get("gpu")
        index = int(gpu) if isinstance(gpu, int) else -1
        if op == "xid":
            gi = entry.get("gi")
            xid = entry.get("xid")
            self.inject_xid(index, int(xid) if isinstance(xid, int) else 0, int(gi) if isinstance(gi, int) else None)
        elif op == "ecc":
            count = entry.get("count", 1)
            self.inject_ecc(index, int(count) if isinstance(count, int) else 0, retire=entry.get("retire", True) is True)
        elif op == "remap":
            self.inject_row_remap(index, failed=entry.get("failed") is True)
        elif op == "lose":
            self.lose_gpu(index)
        elif op == "reset":
            self.reset_gpu(index)
        elif op == "reboot":
            self.reboot()
        elif op == "repair":
            self.repair(index)
        else:
            raise ValueError(f"unknown operation {op!r}; known: {', '.join(INBOX_OPERATIONS)}")

    def inject_fault(self, fault: Fault) -> None:
        if fault.operation not in OPERATIONS:
            raise ValueError(f"unknown operation {fault.operation!r}; valid: {', '.join(OPERATIONS)}")
        self._faults.append(fault)

    def start_process(self, index: int, pid: int, used_memory_mib: int = 1024, gi_id: int | None = None,
                      owner: str = "", env: Mapping[str, str] | None = None) -> None:
        """A workload (of pod ``owner``, when known) starts on the GPU (inside instance ``gi_id`` when MIG is on)
        with the environment ``env``: on a GPU served through MPS its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is the
        client's memory limit (module docstring). ``sharing.api.mps_env.MpsEnvError`` (a ValueError) naming a
        malformed value: the process does not start."""
        gpu = self._gpu(index)
        if gpu.mig_enabled:
            if gi_id is None or all(i.gi_id != gi_id for i in gpu.instances):
                raise NvmlError(errors.NOT_FOUND, f"no GPU instance {gi_id} on GPU {index} to run pid {pid} in")
        # Read on every GPU, so a bad value fails the same wherever the pod lands; applied only under MPS.
        own = pinned_memory_mib(env or {}, 0, gpu.uuid)
        limit = None
        if gpu.mps and not gpu.mig_enabled:
            limit = min((v for v in (own, gpu.mps_default_limit_mib) if v is not None), default=None)
        gpu.processes.append(_Process(pid, used_memory_mib, gi_id, owner=owner, mps_limit_mib=limit))
        self._save()

    def play_trace(self, trace: UsageTrace, time_scale: float, start_s: float | None = None,
                   pods: Mapping[str, str] | None = None) -> TracePlayer:
        """From the next snapshot on, the processes play ``trace`` (module docstring). ``start_s``: the clock
        time of the trace's first step; by default the one this node's state file kept from an earlier
        play, else now (so a restarted agent goes on where it was). ``pods``: ``namespace/name`` -> trace
        pod. ``sharing.usage.playback.PlaybackError`` (a ValueError) for a bad scale, start or mapping."""
        start = start_s if start_s is not None else self._trace_start if self._trace_start is not None else self.clock()
        self.player = TracePlayer(trace, time_scale=time_scale, start_s=start, pods=pods)
        self._trace_start = start
        self._save()
        return self.player

    def memory_limit_hits(self, index: int) -> dict[int, int]:
        """SIMULATION: pid -> growths of its memory that did not fit on GPU ``index`` (NVML has no such count)."""
        return {p.pid: p.memory_limit_hits for p in self._gpu(index).processes}

    def mps_memory_limits(self, index: int) -> dict[int, int | None]:
        """SIMULATION: pid -> the MPS pinned memory limit (MiB) it started with on GPU ``index``; None: none."""
        return {p.pid: p.mps_limit_mib for p in self._gpu(index).processes}

    def stop_process(self, index: int, pid: int) -> None:
        gpu = self._gpu(index)
        gpu.processes = [p for p in gpu.processes if p.pid != pid]
        self._save()

    def set_process_load(self, index: int, pid: int, percent: float) -> None:
        """The SM load (0..100) process ``pid`` puts on GPU ``index`` from now on."""
        if not 0 <= percent <= 100:
            raise ValueError(f"SM load must be 0..100 percent, got {percent}")
        gpu = self._gpu(index)
        proc = next((p for p in gpu.processes if p.pid == pid), None)
        if proc is None:
            raise ValueError(f"no process {pid} on GPU {index}")
        proc.sm_percent = percent
        self._save()

    def set_process_memory(self, index: int, pid: int, used_memory_mib: int) -> None:
        """SIMULATION: the GPU memory process ``pid`` holds on GPU ``index`` from now on (a workload that grows
        to its MPS limit, say); unchecked against what the device has and against its MPS limit (a test's
        control, not an allocation)."""
        if used_memory_mib < 0:
            raise ValueError(f"memory must not be negative, got {used_memory_mib} MiB")
        proc = next((p for p in self._gpu(index).processes if p.pid == pid), None)
        if proc is None:
            raise ValueError(f"no process {pid} on GPU {index}")
        proc.used_memory_mib = used_memory_mib
        self._save()

    def set_mps(self, index: int, enabled: bool, default_limit_mib: int | None = None) -> None:
        """SIMULATION: the device plugin serves GPU ``index`` through MPS from now on (or no longer): while it
        does and MIG mode is off, an MPS server runs beside its clients (module docstring).
        ``default_limit_mib``: its control daemon's default pinned memory limit for clients that start from
        now on (``set_default_device_pinned_mem_limit``); None: none."""
        if default_limit_mib is not None and default_limit_mib < 1:
            raise ValueError(f"an MPS default pinned memory limit must be at least 1 MiB, got {default_limit_mib}")
        gpu = self._gpu(index)
        default = default_limit_mib if enabled else None
        if gpu.mps != enabled or gpu.mps_default_limit_mib != default:
            gpu.mps, gpu.mps_default_limit_mib = enabled, default
            self._save()

    def set_load(self, index: int, percent: float) -> None:
        self._gpu(index).load_percent = percent
        self._save()

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Request a MIG-mode change: pending until ``reset_gpu``, as on hardware.

        A GPU without MIG has no MIG mode: ``NOT_SUPPORTED``, as ``nvmlDeviceSetMigMode`` answers there."""
        gpu = self._gpu(index)
        if self._mig_model is None:
            raise NvmlError(errors.NOT_SUPPORTED, f"GPU {index} ({self.model.display_name}) does not support MIG")
        gpu.mig_pending = enabled
        self._save()

    def reset_gpu(self, index: int) -> None:
        """A GPU reset, as ``nvidia-smi -r``: refused while processes run or the GPU is lost."""
        gpu = self._gpu(index)
        self._require_present(gpu)
        if gpu.processes:
            raise NvmlError(errors.IN_USE, f"GPU {index} has running processes")
        gpu.mig_enabled = gpu.mig_pending
        gpu.instances.clear()
        self._clear_on_reset(gpu)
        gpu.resets += 1
        self._save()

    @staticmethod
    def _clear_on_reset(gpu: _Gpu) -> None:
        # What a reset clears on hardware: volatile counters, and pending retirements and
        # remappings (they take effect). Lifetime counters and a failed remapping stay.
        gpu.volatile_uncorrected = 0
        gpu.retired_pages_pending = gpu.remapped_rows_pending = False

    # ------------------------------------------------------------------ internals
    def _play(self) -> None:
        """Each process's SM load and memory from the trace at the clock's time (binding new ones first)."""
        player = self.player
        if player is None:
            return
        now = self.clock()
        before = [asdict(p) for g in self._gpus for p in g.processes]
        playing = [p.trace_pod for g in self._gpus for p in g.processes if p.trace_pod in player]
        for gpu in self._gpus:
            wanted: list[tuple[_Process, int]] = []
            for proc in gpu.processes:
                if proc.trace_pod not in player:  # new, or bound to a pod of another trace
                    proc.trace_pod = player.choose(proc.owner, playing)
                    playing.append(proc.trace_pod)
                use = player.use(proc.trace_pod, now)
                proc.sm_percent = use.duty_percent
                wanted.append((proc, use.memory_bytes // (1024 * 1024)))
            if not gpu.lost:
                self._fit_memory(gpu, wanted)
        if before != [asdict(p) for g in self._gpus for p in g.processes]:
            self._save()  # a snapshot begins several times a tick; the trace moves once a step

    def _fit_memory(self, gpu: _Gpu, wanted: list[tuple[_Process, int]]) -> None:
        """Memory as the driver holds it: shrinking always works; a growth takes at most what its device has
        free after every shrink (in start order), and an MPS client at most its limit; one that does not fit
        counts a hit, once per episode."""
        for proc, mib in wanted:
            if mib <= proc.used_memory_mib:
                proc.used_memory_mib = mib
        for proc, mib in wanted:
            if mib <= proc.used_memory_mib:
                proc.memory_capped = False
                continue
            sharing = [p for p in self._running(gpu) if p.gi_id == proc.gi_id or not gpu.mig_enabled]
            free = self._device_memory_mib(gpu, proc.gi_id) - sum(p.used_memory_mib for p in sharing)
            allowed = proc.used_memory_mib + max(0, free)
            own_limit = proc.mps_limit_mib is not None and proc.mps_limit_mib < allowed
            if proc.mps_limit_mib is not None:
                allowed = min(allowed, proc.mps_limit_mib)
            fits = mib <= allowed
            proc.used_memory_mib = mib if fits else max(proc.used_memory_mib, allowed)
            if not fits and not proc.memory_capped:
                proc.memory_limit_hits += 1
                cause = f"its MPS memory limit of {proc.mps_limit_mib} MiB" if own_limit else "what its device has free"
                log.warning("SIMULATED NVML: pid %d on GPU %d wants %d MiB, %d MiB more than %s: "
                            "the allocation fails (an OOM in its workload)", proc.pid, gpu.index, mib,
                            mib - proc.used_memory_mib, cause)
            proc.memory_capped = not fits

    @staticmethod
    def _serves_mps(gpu: _Gpu) -> bool:
        return gpu.mps and not gpu.mig_enabled and bool(gpu.processes)

    @staticmethod
    def _mps_server(gpu: _Gpu) -> _Process:
        """The GPU's MPS server as NVML shows it: its own memory, its clients' SM load."""
        return _Process(MPS_SERVER_PID_BASE + gpu.index, MPS_SERVER_MEMORY_MIB, None,
                        min(100.0, sum(p.sm_percent for p in gpu.processes)))

    def _running(self, gpu: _Gpu) -> list[_Process]:
        """The processes NVML lists on ``gpu``: the workloads', and the MPS server while it serves them."""
        return [*gpu.processes, self._mps_server(gpu)] if self._serves_mps(gpu) else gpu.processes

    def _device_memory_mib(self, gpu: _Gpu, gi_id: int | None) -> int:
        """The memory of the device a process runs in: its MIG instance's, or the whole GPU's."""
        inst = next((i for i in gpu.instances if i.gi_id == gi_id), None) if gpu.mig_enabled else None
        if inst is None or self._mig_model is None:
            return self.model.memory_mib
        return self._mig_model.profile(inst.profile).memory_mib

    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self._gpus):
            raise NvmlError(errors.INVALID_ARGUMENT, f"GPU index {index} out of range 0..{len(self._gpus) - 1}")
        return self._gpus[index]

    def _require_present(self, gpu: _Gpu) -> None:
        if gpu.lost:
            raise NvmlError(errors.GPU_IS_LOST, f"GPU {gpu.index} has fallen off the bus")

    def _enter(self, operation: str, index: int) -> _Gpu:
        gpu = self._gpu(index)
        self._require_present(gpu)
        if self.hook is not None:
            self.hook(operation, index, "before")
        delay = self._delays.get(operation, 0.0)
        if delay > 0:
            self._sleep(delay)
        fault = self._take_fault(operation, index, after_effect=False)
        if fault is not None:
            raise NvmlError(fault.code, f"injected fault on {operation} (GPU {index})")
        return gpu

    def _leave(self, operation: str, index: int, value: T) -> T:
        fault = self._take_fault(operation, index, after_effect=True)
        if self.hook is not None:
            self.hook(operation, index, "after")
        if fault is not None:
            raise NvmlError(fault.code, f"injected fault after {operation} took effect (GPU {index})")
        return value

    def _take_fault(self, operation: str, index: int, *, after_effect: bool) -> Fault | None:
        for fault in self._faults:
            if fault.operation == operation and fault.after_effect == after_effect and fault.gpu in (None, index):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _require_mig(self, gpu: _Gpu) -> GpuModel:
        """The GPU's MIG model, when MIG calls may be made on it now; NVML's error otherwise."""
        if self._mig_model is None:
            raise NvmlError(errors.NOT_SUPPORTED, f"GPU {gpu.index} ({self.model.display_name}) does not support MIG")
        if gpu.mig_enabled != gpu.mig_pending:
            raise NvmlError(errors.RESET_REQUIRED, f"GPU {gpu.index} has a pending MIG-mode change; reset it first")
        if not gpu.mig_enabled:
            raise NvmlError(errors.NOT_SUPPORTED, f"MIG mode is disabled on GPU {gpu.index}")
        return self._mig_model

    def _save(self) -> None:
        if self._path is None:
            return
        doc = {"version": STATE_VERSION, "simulation": True, "model": self.model.product, "boot": self._boot,
               "trace_start": self._trace_start, "gpus": [asdict(g) for g in self._gpus]}
        tmp = self._path.with_name(self._path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._path)

    def _load(self, count: int) -> list[_Gpu]:
        assert self._path is not None
        try:
            doc = json.loads(read_text(self._path, syntax="json"))
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"state version {doc.get('version')!r}, expected {STATE_VERSION}")
            if doc.get("model") != self.model.product:
                raise ValueError(f"state is for model {doc.get('model')!r}, not {self.model.product!r}")
            gpus = [
                _Gpu(**{**g, "instances": [_Instance(**i) for i in g["instances"]],
                        "processes": [_Process(**p) for p in g["processes"]]})
                for g in doc["gpus"]
            ]
            self._boot = int(doc.get("boot", 1))
            start = doc.get("trace_start")
            self._trace_start = float(start) if isinstance(start, (int, float)) else None
        except InputFileError as exc:  # its message names the file already
            raise ValueError(f"simulated NVML state file {exc}") from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"simulated NVML state file {self._path}: {exc}") from exc
        if len(gpus) != count:
            raise ValueError(f"simulated NVML state file {self._path} holds {len(gpus)} GPUs, not {count}")
        return gpus


def simulated_backend(
    model_name: str,
    count: int,
    state_file: Path | str | None = None,
    seed: str = "gpupack-sim",
    *,
    mig_enabled: bool | None = None,
    delays: Mapping[str, float] | None = None,
) -> SimulatedNvml:
    """``count`` simulated GPUs of the product ``model_name`` names: a MIG catalog model (``H200``,
    ``A100-80GB``, ...) or else an openb GPU type or its product (``T4``, ``Tesla-V100-SXM2-16GB``,
    case-insensitive; ``node.nvml.products.resolve_product``). ``ValueError`` for an unknown name
    (listing the valid ones), a bad count or a state file that does not match."""
    return SimulatedNvml(resolve_product(model_name), count, state_file, seed=seed, mig_enabled=mig_enabled,
                         delays=delays)


def _uuid(prefix: str, *parts: str) -> str:
    return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, '/'.join(('gpupack-sim',) + parts))}"


def inbox_path(state_file: Path | str) -> Path:
    """Where other processes post faults for the simulated node whose state is ``state_file``."""
    path = Path(state_file)
    return path.with_name(path.name + ".inbox")


def post_to_inbox(state_file: Path | str, entry: Mapping[str, object]) -> None:
    """Append one entry (``{"op": ..., "gpu": ...}``) to the node's inbox; safe against a reader
    taking the inbox at the same moment (the entry lands in the file the reader takes next)."""
    path = inbox_path(state_file)
    line = json.dumps(dict(entry), sort_keys=True) + "\n"
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not taken by the reader while we waited for the lock
                os.write(fd, line.encode())
                return
        finally:
            os.close(fd)


def take_inbox(path: Path) -> list[dict[str, object]]:
    """Every entry posted to ``path`` so far (the file is consumed); malformed lines are logged and dropped."""
    if not path.exists():
        return []
    taken = path.with_name(f"{path.name}.{os.getpid()}.taking")
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(path, taken)
    except FileNotFoundError:
        return []
    finally:
        os.close(fd)
    try:
        text = taken.read_text(encoding="utf-8")
    finally:
        taken.unlink(missing_ok=True)
    entries: list[dict[str, object]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            log.warning("SIMULATED NVML: inbox line %r is not JSON (%s); dropped", line[:200], exc.msg)
            continue
        if isinstance(value, dict):
            entries.append(value)
        else:
            log.warning("SIMULATED NVML: inbox line %r is not an object; dropped", line[:200])
    return entries

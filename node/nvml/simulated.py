"""SIMULATED NVML: N GPUs of one catalog model for machines without GPUs.

This is a simulation, named so everywhere it surfaces (``kind = "simulated"``,
published in ``GPUNode`` status). It enforces the placement rules of ``mig/``
(``mig.geometry.can_add``, the same rules NVML enforces on the hardware) and
answers with NVML's real error codes:

* ``IN_USE`` destroying an instance with a running process;
* ``INSUFFICIENT_RESOURCES`` when slices are taken or the profile's count is reached;
* ``INVALID_ARGUMENT`` for a placement the profile does not offer or an unknown id;
* ``NOT_SUPPORTED`` for MIG calls on a GPU whose MIG mode is off;
* ``RESET_REQUIRED`` while a MIG-mode change is pending (needs a GPU reset);
* ``NOT_FOUND`` for an unknown GPU-instance id.

Tests and the demo can inject faults (an error code for the next N calls of an
operation, optionally *after* the operation took effect, as a driver that hangs
up mid-call would) and delays, and hook every call (to kill the agent at any step).
State is persisted to a JSON file after every change (write, fsync, rename), so
an agent restarted on the same file sees the same GPUs, instances and processes.
"""

from __future__ import annotations

import json
import os
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from mig.geometry import can_add
from mig.model import GpuModel, PlacedInstance, Placement
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import DeviceInfo, GpuInstance, GpuProcess, InstanceProfile, Utilization

STATE_VERSION = 1
OPERATIONS = (
    "device_info", "instance_profiles", "gpu_instances", "processes", "utilization", "create", "destroy",
)

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
        model: GpuModel,
        count: int,
        state_file: Path | str | None = None,
        *,
        seed: str = "gpupack-sim",
        mig_enabled: bool = True,
        delays: Mapping[str, float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if count < 1:
            raise ValueError(f"simulated GPU count must be at least 1, got {count}")
        unknown = set(delays or {}) - set(OPERATIONS)
        if unknown:
            raise ValueError(f"unknown operation(s) {sorted(unknown)} in delays; valid: {', '.join(OPERATIONS)}")
        self.model = model
        self._path = Path(state_file) if state_file is not None else None
        self._delays = dict(delays or {})
        self._sleep = sleep
        self._faults: list[Fault] = []
        self.hook: CallHook | None = None
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
        return len(self._gpus)

    def device_info(self, index: int) -> DeviceInfo:
        gpu = self._enter("device_info", index)
        info = DeviceInfo(
            index=gpu.index,
            uuid=gpu.uuid,
            name=self.model.display_name,
            pci_device_id=self.model.pci_device_ids[0],
            pci_bus_id=f"00000000:{0x17 + gpu.index:02X}:00.0",
            memory_total_mib=self.model.memory_mib,
            mig_capable=True,
            mig_enabled=gpu.mig_enabled,
            mig_pending=gpu.mig_pending,
        )
        return self._leave("device_info", index, info)

    def instance_profiles(self, index: int) -> tuple[InstanceProfile, ...]:
        gpu = self._enter("instance_profiles", index)
        self._require_mig(gpu)
        profiles = tuple(
            InstanceProfile(p.name, p.profile_id, p.nvml_index, p.compute_slices, p.memory_mib, p.max_count, p.placements)
            for p in self.model.profiles
        )
        return self._leave("instance_profiles", index, profiles)

    def gpu_instances(self, index: int) -> tuple[GpuInstance, ...]:
        gpu = self._enter("gpu_instances", index)
        self._require_mig(gpu)
        result = tuple(
            GpuInstance(i.gi_id, self.model.profile(i.profile).profile_id, i.profile, Placement(i.start, i.size), i.uuid)
            for i in sorted(gpu.instances, key=lambda i: (i.start, i.gi_id))
        )
        return self._leave("gpu_instances", index, result)

    def processes(self, index: int) -> tuple[GpuProcess, ...]:
        gpu = self._enter("processes", index)
        result = tuple(GpuProcess(p.pid, p.used_memory_mib, p.gi_id, 0 if p.gi_id is not None else None) for p in gpu.processes)
        return self._leave("processes", index, result)

    def utilization(self, index: int) -> Utilization:
        gpu = self._enter("utilization", index)
        used = sum(p.used_memory_mib for p in gpu.processes)
        if gpu.mig_enabled:
            # As on hardware: no whole-GPU utilisation rate in MIG mode.
            util = Utilization(None, used, self.model.memory_mib, len(gpu.processes), "memory-and-processes")
        else:
            util = Utilization(gpu.load_percent, used, self.model.memory_mib, len(gpu.processes), "nvml")
        return self._leave("utilization", index, util)

    # ---------------------------------------------------------------- write side
    def create_gpu_instance(self, index: int, profile_id: int, placement: Placement) -> GpuInstance:
        gpu = self._enter("create", index)
        self._require_mig(gpu)
        profile = next((p for p in self.model.profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise NvmlError(errors.INVALID_ARGUMENT, f"no GPU-instance profile id {profile_id} on {self.model.product}")
        if placement not in profile.placements:
            raise NvmlError(
                errors.INVALID_ARGUMENT,
                f"placement {placement} not offered for {profile.name}; possible: {', '.join(map(str, profile.placements))}",
            )
        existing = [PlacedInstance(i.profile, Placement(i.start, i.size)) for i in gpu.instances]
        reason = can_add(self.model, existing, PlacedInstance(profile.name, placement))
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

    # ------------------------------------------------- simulation controls (not NVML)
    def inject_fault(self, fault: Fault) -> None:
        if fault.operation not in OPERATIONS:
            raise ValueError(f"unknown operation {fault.operation!r}; valid: {', '.join(OPERATIONS)}")
        self._faults.append(fault)

    def start_process(self, index: int, pid: int, used_memory_mib: int = 1024, gi_id: int | None = None) -> None:
        """A workload starts on the GPU (inside instance ``gi_id`` when MIG is on)."""
        gpu = self._gpu(index)
        if gpu.mig_enabled:
            if gi_id is None or all(i.gi_id != gi_id for i in gpu.instances):
                raise NvmlError(errors.NOT_FOUND, f"no GPU instance {gi_id} on GPU {index} to run pid {pid} in")
        gpu.processes.append(_Process(pid, used_memory_mib, gi_id))
        self._save()

    def stop_process(self, index: int, pid: int) -> None:
        gpu = self._gpu(index)
        gpu.processes = [p for p in gpu.processes if p.pid != pid]
        self._save()

    def set_load(self, index: int, percent: float) -> None:
        self._gpu(index).load_percent = percent
        self._save()

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Request a MIG-mode change: pending until ``reset_gpu``, as on hardware."""
        self._gpu(index).mig_pending = enabled
        self._save()

    def reset_gpu(self, index: int) -> None:
        gpu = self._gpu(index)
        if gpu.processes:
            raise NvmlError(errors.IN_USE, f"GPU {index} has running processes")
        gpu.mig_enabled = gpu.mig_pending
        gpu.instances.clear()
        self._save()

    # ------------------------------------------------------------------ internals
    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self._gpus):
            raise NvmlError(errors.INVALID_ARGUMENT, f"GPU index {index} out of range 0..{len(self._gpus) - 1}")
        return self._gpus[index]

    def _enter(self, operation: str, index: int) -> _Gpu:
        gpu = self._gpu(index)
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

    def _require_mig(self, gpu: _Gpu) -> None:
        if gpu.mig_enabled != gpu.mig_pending:
            raise NvmlError(errors.RESET_REQUIRED, f"GPU {gpu.index} has a pending MIG-mode change; reset it first")
        if not gpu.mig_enabled:
            raise NvmlError(errors.NOT_SUPPORTED, f"MIG mode is disabled on GPU {gpu.index}")

    def _save(self) -> None:
        if self._path is None:
            return
        doc = {"version": STATE_VERSION, "simulation": True, "model": self.model.product,
               "gpus": [asdict(g) for g in self._gpus]}
        tmp = self._path.with_name(self._path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self._path)

    def _load(self, count: int) -> list[_Gpu]:
        assert self._path is not None
        try:
            doc = json.loads(self._path.read_text(encoding="utf-8"))
            if doc.get("version") != STATE_VERSION:
                raise ValueError(f"state version {doc.get('version')!r}, expected {STATE_VERSION}")
            if doc.get("model") != self.model.product:
                raise ValueError(f"state is for model {doc.get('model')!r}, not {self.model.product!r}")
            gpus = [
                _Gpu(**{**g, "instances": [_Instance(**i) for i in g["instances"]],
                        "processes": [_Process(**p) for p in g["processes"]]})
                for g in doc["gpus"]
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"simulated NVML state file {self._path}: {exc}") from exc
        if len(gpus) != count:
            raise ValueError(f"simulated NVML state file {self._path} holds {len(gpus)} GPUs, not {count}")
        return gpus


def _uuid(prefix: str, *parts: str) -> str:
    return f"{prefix}-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, '/'.join(('gpupack-sim',) + parts))}"

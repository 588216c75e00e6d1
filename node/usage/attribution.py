"""Per-pod, per-container GPU use from one poll: pure, so every rule is a table test.

One poll is the NVML snapshot (devices, MIG instances, processes, device utilisation),
the per-process utilisation samples (``node.usage.sampler``), dcgm-exporter's per-instance
activity (``node.base.dcgm``) and who owns what (``node.process_owners``: pods per
device, the pod of each GPU process). What each device's use is read from:

* **a whole GPU one pod holds** through ``nvidia.com/gpu``: the GPU's own counters
  (NVML device utilisation, memory used);
* **a MIG instance one pod holds**: the instance's engine activity from DCGM (NVML has
  no utilisation in MIG mode, ``node.base.dcgm``) and the memory of its processes;
* **a shared GPU** (MPS or time-slicing, or any GPU more than one pod holds): each pod's
  own processes, their SM samples summed (a process absent from the samples was idle:
  NVML returns only processes with non-zero use) and their memory summed.

Compute and memory are attributed each by its own rule, because NVML can name a process's
memory when it cannot name its SMs (under MPS only the MPS server has SM samples, while each
client's memory is reported as without MPS: benchmarks/nvml_usage_check.md):

* **compute** (``unattributed``, today's single reason) is the pod's when its SM time is read
  and none of it may be another's. It is not when the GPU failed or is lost; the device's
  utilisation is not reported (an instance without DCGM data, a GPU that does not support it);
  per-process samples could not be read (an NVML error) or do not exist (several pods
  time-slicing one MIG instance); a process of no known pod used the shared GPU's SMs (its
  work may be a pod's: under MPS, NVML counts clients' kernels to the MPS server); or the pod's
  memory is not its own (below).
* **memory** (``memory_unattributed``) is the pod's when every process of the pod is resolved
  to it: on a whole GPU or a MIG instance the pod holds alone, everything on the device; on a
  shared device, the pod's own processes' memory when it has at least one resolved process
  (all of a pod's processes share its cgroup, so they resolve alike), or 0 when it has none and
  no process there belongs to no known pod. It is not when the GPU failed or is lost, a whole
  GPU reports no memory, or the pod has no process of its own resolved while some process on
  its shared device belongs to no known pod (it may be the pod's: the pod is found from the
  cgroup of each process, which needs ``hostPID``). A pod no device is known for has neither.

A use that cannot be read is never guessed: an unattributed compute is never sized, and memory
that is unattributed is never sized either (``node.usage.publication``). Memory unattributed
implies compute unattributed, so ``unattributed`` empty still means the whole use is the pod's.

A pod's container is the one container asking for GPUs; a pod with several such
containers is reported under container ``""`` (the pod as a whole): which container
holds which device is not split from what the agent reads.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from node.base.dcgm import Activity
from node.base.pods import PodUse
from node.base.snapshot import GpuSnapshot, NodeSnapshot
from node.nvml.protocol import GpuInstance, GpuProcess, ProcessSample
from sharing.api.keys import WHOLE_RESOURCE

UseSource = Literal["device", "instance", "processes"]
"""Where a use was read: the GPU's own counters, a MIG instance's (DCGM), or the pod's processes."""

SampleRead = tuple[ProcessSample, ...] | str
"""A GPU's per-process samples of this poll, or why there are none (an NVML error)."""


@dataclass(frozen=True)
class PodGpuUse:
    """What one pod (one container) used of one GPU or MIG instance in this poll."""

    pod: str
    """``namespace/name``"""
    container: str
    """The pod's one container asking for GPUs; ``""`` for a pod with several."""
    gpu: int | None
    """NVML index of the GPU; None for a pod whose device is not known."""
    gpu_uuid: str
    gi_id: int | None
    """GPU-instance id for a MIG instance; None for a whole or shared GPU."""
    source: UseSource | None
    sm_percent: float | None
    """Share of time the pod's kernels ran, 0..100; None when it cannot be read."""
    memory_used_mib: int | None
    """GPU memory the pod's processes use (the whole GPU's for an exclusive GPU); None when unknown."""
    unattributed: str = ""
    """Why the pod's compute, and so its whole use, is not its measured use; empty when both are."""
    memory_unattributed: str = ""
    """Why the pod's memory is not its measured use; empty when it is (module docstring). Never
    set without ``unattributed``: a pod whose memory is unknown has no compute known either."""

    def __post_init__(self) -> None:
        if self.memory_unattributed and not self.unattributed:
            raise ValueError(f"{self.pod}: memory unattributed ({self.memory_unattributed}) but compute attributed")

    @property
    def attributed(self) -> bool:
        """Both compute and memory are the pod's measured use."""
        return not self.unattributed

    @property
    def memory_attributed(self) -> bool:
        return not self.memory_unattributed

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]

    @property
    def name(self) -> str:
        return self.pod.partition("/")[2]


@dataclass(frozen=True)
class Poll:
    """Everything one poll read, as attribution needs it."""

    snapshot: NodeSnapshot
    uses: Sequence[PodUse]
    pods_by_device: Mapping[str, Sequence[str]]
    """GPU or MIG UUID -> ``namespace/name`` of the pods holding it."""
    pods_by_pid: Mapping[int, str]
    """GPU process id -> its pod."""
    samples: Mapping[int, SampleRead]
    """GPU index -> its per-process samples (MIG-enabled GPUs have none)."""
    activity: Activity | None = None
    """dcgm-exporter's engine activity per (GPU UUID, GPU-instance id), when configured."""


def attribute(poll: Poll) -> tuple[PodGpuUse, ...]:
    """Every GPU use of the poll's pods, one per pod and device, sorted by pod and device."""
    containers = _gpu_containers(poll.uses)
    found: list[PodGpuUse] = []
    for gpu in poll.snapshot.gpus:
        devices: list[tuple[GpuInstance | None, Sequence[str]]] = (
            [(inst, poll.pods_by_device.get(inst.uuid, ())) for inst in gpu.instances] if gpu.info.mig_enabled
            else [(None, poll.pods_by_device.get(gpu.info.uuid, ()))])
        for inst, holders in devices:
            for use in _device_uses(poll, gpu, inst, holders):
                found.append(PodGpuUse(use.pod, containers.get(use.pod, ""), gpu.info.index, gpu.info.uuid,
                                       None if inst is None else inst.gi_id, use.source, use.sm_percent,
                                       use.memory_used_mib, use.unattributed, use.memory_unattributed))
    placed = {use.pod for use in found}
    for pod in sorted({u.key for u in poll.uses} - placed):
        nowhere = "no device of this node is known to be the pod's"
        found.append(PodGpuUse(pod, containers.get(pod, ""), None, "", None, None, None, None, nowhere, nowhere))
    return tuple(sorted(found, key=lambda u: (u.pod, -1 if u.gpu is None else u.gpu, u.gi_id or 0)))


@dataclass(frozen=True)
class _Use:
    pod: str
    source: UseSource
    sm_percent: float | None
    memory_used_mib: int | None
    unattributed: str = ""
    memory_unattributed: str = ""


def _device_uses(poll: Poll, gpu: GpuSnapshot, inst: GpuInstance | None, holders: Sequence[str]) -> list[_Use]:
    """The use of each pod holding one device: a whole or shared GPU (``inst`` None) or a MIG instance."""
    if not holders:
        return []
    source: UseSource = "processes" if inst is None else "instance"
    if gpu.error is not None:
        lost = f"GPU {gpu.info.index} unreadable: {gpu.error}"
        return [_Use(pod, source, None, None, lost, lost) for pod in holders]
    if inst is not None:
        return _instance_uses(poll, gpu, inst, holders)
    if len(holders) == 1 and WHOLE_RESOURCE in _resources(poll.uses, holders[0]):
        util = gpu.utilization
        if util is None or util.gpu_percent is None:
            memory = None if util is None else util.memory_used_mib
            silent = f"GPU {gpu.info.index} reports no utilisation"
            return [_Use(holders[0], "device", None, memory, silent, silent if memory is None else "")]
        return [_Use(holders[0], "device", _percent(util.gpu_percent), util.memory_used_mib)]
    return _process_uses(poll, gpu, holders)


def _instance_uses(poll: Poll, gpu: GpuSnapshot, inst: GpuInstance, holders: Sequence[str]) -> list[_Use]:
    processes = [p for p in gpu.processes if p.gi_id == inst.gi_id]
    if len(holders) > 1:
        # Time-sliced MIG instance: NVML samples no process in MIG mode, so the split is unknown.
        mine = _own_processes(poll, processes)
        strangers = [p.pid for p in processes if p.pid not in poll.pods_by_pid]
        unknown = (f"{len(holders)} pods share MIG instance {inst.gi_id} of GPU {gpu.info.index}; NVML samples "
                   "no process utilisation in MIG mode")
        uses = []
        for pod in holders:
            memory_unknown = _memory_unknown(gpu, mine.get(pod, []), strangers)
            uses.append(_Use(pod, "instance", None, None if memory_unknown else _memory(mine.get(pod, [])),
                             unknown, memory_unknown))
        return uses
    ratio = (poll.activity or {}).get((gpu.info.uuid, inst.gi_id))
    if ratio is None:
        return [_Use(holders[0], "instance", None, _memory(processes),
                     f"no activity for MIG instance {inst.gi_id} of GPU {gpu.info.index}: NVML has none in MIG "
                     "mode and dcgm-exporter gave none")]
    return [_Use(holders[0], "instance", _percent(100.0 * ratio), _memory(processes))]


def _process_uses(poll: Poll, gpu: GpuSnapshot, holders: Sequence[str]) -> list[_Use]:
    read = poll.samples.get(gpu.info.index, "not read")
    mine = _own_processes(poll, gpu.processes)
    strangers = [p.pid for p in gpu.processes if p.pid not in poll.pods_by_pid]
    uses = []
    for pod in holders:
        processes = mine.get(pod, [])
        memory_unknown = _memory_unknown(gpu, processes, strangers)
        memory = None if memory_unknown else _memory(processes)
        if isinstance(read, str):
            compute_unknown = f"per-process utilisation of GPU {gpu.info.index} unreadable: {read}"
        elif any(_sm_of(read, pid) > 0 for pid in strangers):
            # Whose work was it? Under MPS NVML counts the clients' kernels to the MPS server
            # (benchmarks/nvml_usage_check.md); their memory is still each client's own.
            compute_unknown = (f"a process on GPU {gpu.info.index} that belongs to no known pod used its SMs: "
                               "the split between pods is unknown")
        else:
            compute_unknown = memory_unknown
        if compute_unknown or isinstance(read, str):
            uses.append(_Use(pod, "processes", None, memory, compute_unknown, memory_unknown))
        else:
            uses.append(_Use(pod, "processes", _percent(sum(_sm_of(read, p.pid) for p in processes)), memory))
    return uses


def _memory_unknown(gpu: GpuSnapshot, processes: Sequence[GpuProcess], strangers: Sequence[int]) -> str:
    """Why a pod's memory on a shared device is not known (empty when it is): it has no process resolved
    while some process there belongs to no known pod, which may be the pod's (module docstring)."""
    if processes or not strangers:
        return ""
    return (f"{len(strangers)} process(es) on GPU {gpu.info.index} belong to no known pod, and none "
            "is known to be this pod's")


def _own_processes(poll: Poll, processes: Sequence[GpuProcess]) -> dict[str, list[GpuProcess]]:
    mine: dict[str, list[GpuProcess]] = defaultdict(list)
    for proc in processes:
        if proc.pid in poll.pods_by_pid:
            mine[poll.pods_by_pid[proc.pid]].append(proc)
    return mine


def _sm_of(samples: Sequence[ProcessSample], pid: int) -> float:
    """The process's mean SM share over the samples read (NVML may return several periods); 0 if absent."""
    own = [_percent(s.sm_percent) for s in samples if s.pid == pid]
    return sum(own) / len(own) if own else 0.0


def _memory(processes: Sequence[GpuProcess]) -> int:
    return sum(p.used_memory_mib for p in processes)


def _percent(value: float) -> float:
    return max(0.0, min(100.0, value))


def _resources(uses: Sequence[PodUse], pod: str) -> set[str]:
    return {u.resource for u in uses if u.key == pod}


def _gpu_containers(uses: Sequence[PodUse]) -> dict[str, str]:
    """Pod -> its one container asking for GPUs, or ``""`` when it has several (or none named)."""
    names: dict[str, set[str]] = defaultdict(set)
    for use in uses:
        names[use.key].update(use.containers)
    return {pod: next(iter(found)) if len(found) == 1 else "" for pod, found in names.items()}

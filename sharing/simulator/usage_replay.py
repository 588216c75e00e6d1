"""A usage trace replayed through the right-sizer: recommender, sizing, updater, step by step.

Each pod of the trace first asks for a whole GPU and lives from its first sample to its last;
its workload is its own unless the run maps pods to workloads. At every step (the trace's grid):

1. Pods that ended free their shares.
2. Pods that start ask for a whole GPU; in ``initial`` and ``recreate`` modes a pod whose
   workload has a recommendation asks for the recommended size instead (the webhook's part).
3. Every live pod's use is observed by the recommender (``sharing.usage.recommender``). Memory
   above the pod's limit is an OOM: recorded (it raises the recommendation at once), and the
   pod is observed at its limit, all it could hold.
4. In ``recreate`` mode the updater (``sharing.usage.updater``) picks pods far from their
   recommendation; each move is make-before-break: the replacement is seated at its new size
   while the old pod still holds its share, then the old share is freed. Every
   ``consolidate_every_s`` it also empties a GPU whose pods all fit elsewhere
   (``sharing.usage.consolidation``), within the same per-workload move budget.

``off`` recommends only: pods keep their whole GPUs (the run's figures are the baseline's).

Shares are the DRA backend's: a size (``sharing.usage.sizing``) is rounded by the release's
share policy (``sharing.dra.share_policy.SHARES``: 50 milli, 1 GiB), and a share that rounds to
more memory than a GPU serves, or to all its compute, takes the GPU whole. A share goes to the
GPU it fits (``sharing.usage.sizing.fits``: memory never over-committed) with the least memory
left after it, or to a new GPU: the cluster grows as needed and ``gpu_hours`` counts the GPUs
that hold a pod. The packing engine (``sharing.packing``) has no GPU-memory dimension yet, so
this best fit stands in for it here; it is the next thing to replace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from sharing.dra.share_policy import SHARES, SharePolicy
from sharing.rules.replicas import MAX_MILLI
from sharing.simulator.usage_figures import Seat, Seating
from sharing.usage.consolidation import Share, consolidation_moves
from sharing.usage.recommender import Recommender, RecommenderSettings, WorkloadKey
from sharing.usage.sizing import GpuLoad, Size, fits, size_for, whole_gpu
from sharing.usage.trace import PodUsage, UsageTrace
from sharing.usage.updater import Candidate, UpdaterSettings, choose_moves

Mode = Literal["off", "initial", "recreate"]
MODES: tuple[Mode, ...] = ("off", "initial", "recreate")


@dataclass(frozen=True)
class RightSizing:
    """A run's mode and the settings of its parts."""

    mode: Mode = "recreate"
    recommender: RecommenderSettings = field(default_factory=RecommenderSettings)
    updater: UpdaterSettings = field(default_factory=UpdaterSettings)
    shares: SharePolicy = SHARES
    compute_overcommit: float = 1.0
    consolidate_every_s: float | None = 3600.0
    """How often ``recreate`` tries to empty a GPU into the others' room (None: never)."""


def own_workloads(trace: UsageTrace) -> dict[str, WorkloadKey]:
    """Each pod its own workload of one replica (a trace names no owners; ``workloads`` maps some)."""
    return {p.pod: WorkloadKey("trace", "Pod", p.pod, "main") for p in trace.pods}


class _Cluster:
    """The GPUs a run holds: each one's load, and each pod's seat and size."""

    def __init__(self, gpu_memory_bytes: int, policy: RightSizing) -> None:
        self.gpu_memory = gpu_memory_bytes
        self.policy = policy
        self.loads: dict[int, GpuLoad] = {}
        self.seats: dict[str, tuple[int, Size]] = {}
        self.next_id = 0

    def share(self, size: Size) -> Size:
        """The share a size takes under the share policy: a whole GPU when its memory rounds past
        what a GPU serves, or when it rounds to all of a GPU's compute (a pod predicted to use a
        whole GPU gets one, over-commit or not: over-commit is only against predicted use)."""
        shares = self.policy.shares
        milli = shares.consumed_milli(size.milli)
        memory = shares.consumed_memory(size.memory_bytes)
        if milli >= MAX_MILLI or memory > shares.max_memory(self.gpu_memory):
            return whole_gpu(self.gpu_memory)
        return Size(milli, memory)

    def seat(self, pod: str, size: Size, avoid: int | None = None) -> None:
        """Seat ``pod`` at ``size`` (its old share, if any, still held: make-before-break), then free the old one."""
        best: tuple[int, int] | None = None  # (memory left after, GPU)
        for gpu, load in self.loads.items():
            if gpu != avoid and fits(load, size, self.gpu_memory, self.policy.compute_overcommit):
                left = self.gpu_memory - load.memory_bytes - size.memory_bytes
                if best is None or (left, gpu) < best:
                    best = (left, gpu)
        if best is None:
            gpu = self.next_id
            self.next_id += 1
            self.loads[gpu] = GpuLoad()
        else:
            gpu = best[1]
        self.place(pod, size, gpu)

    def place(self, pod: str, size: Size, gpu: int) -> None:
        """Seat ``pod`` on ``gpu`` (its old share still held while the new one is taken), then free the old."""
        self.loads[gpu] = self.loads[gpu].plus(size)
        self.leave(pod)
        self.seats[pod] = (gpu, size)

    def shares(self, owners: Mapping[str, WorkloadKey]) -> dict[int, list[Share]]:
        """Each GPU's shares, for consolidation."""
        out: dict[int, list[Share]] = {gpu: [] for gpu in self.loads}
        for pod, (gpu, size) in self.seats.items():
            out[gpu].append(Share(pod, owners[pod], size))
        return out

    def leave(self, pod: str) -> None:
        if pod in self.seats:
            gpu, size = self.seats.pop(pod)
            self.loads[gpu] = self.loads[gpu].minus(size)
            if self.loads[gpu] == GpuLoad():
                del self.loads[gpu]


def right_sizing_seatings(trace: UsageTrace, gpu_memory_bytes: int, policy: RightSizing,
                          workloads: Mapping[str, WorkloadKey] | None = None) -> Iterator[Seating]:
    """The run's seating at each step (module docstring)."""
    owners = {**own_workloads(trace), **(workloads or {})}
    recommender = Recommender(policy.recommender)
    cluster = _Cluster(gpu_memory_bytes, policy)
    moves: dict[WorkloadKey, list[float]] = {}
    by_start: dict[int, list[PodUsage]] = {}
    by_end: dict[int, list[PodUsage]] = {}
    for pod in trace.pods:
        by_start.setdefault(pod.first_step, []).append(pod)
        by_end.setdefault(pod.end_step, []).append(pod)
    live: dict[str, PodUsage] = {}

    def target(pod: str) -> Size | None:
        recommendation = recommender.recommend(owners[pod])
        return None if recommendation is None else cluster.share(size_for(recommendation, gpu_memory_bytes))

    for step in range(trace.steps):
        now = trace.start_s + step * trace.step_s
        for pod in by_end.get(step, []):
            cluster.leave(pod.pod)
            live.pop(pod.pod, None)
        for pod in by_start.get(step, []):
            size = target(pod.pod) if policy.mode != "off" else None
            cluster.seat(pod.pod, size or whole_gpu(gpu_memory_bytes))
            live[pod.pod] = pod
        # The step's use happens in these seats; the updater's moves take effect from the next step.
        seating = {name: Seat(gpu, size.memory_bytes) for name, (gpu, size) in cluster.seats.items()}
        for name, pod in live.items():
            used = pod.memory_bytes[step - pod.first_step]
            limit = cluster.seats[name][1].memory_bytes
            if used > limit:
                recommender.record_oom(owners[name], now, limit)
            recommender.observe(owners[name], now, pod.duty_percent[step - pod.first_step], min(used, limit))
        if policy.mode == "recreate":
            horizon = now - policy.updater.interval_s
            recent = {key: sum(1 for t in times if t > horizon) for key, times in moves.items()}
            candidates = [Candidate(name, owners[name], cluster.seats[name][1], wanted)
                          for name in live if (wanted := target(name)) is not None]
            for move in choose_moves(candidates, recent, policy.updater):
                cluster.seat(move.pod, move.target, avoid=cluster.seats[move.pod][0])
                moves.setdefault(move.workload, []).append(now)
            every = policy.consolidate_every_s
            if every is not None and step % max(1, round(every / trace.step_s)) == 0:
                budget = {key: policy.updater.max_moves_per_interval - sum(1 for t in times if t > horizon)
                          for key, times in moves.items()}
                budget = {key: budget.get(key, policy.updater.max_moves_per_interval) for key in set(owners.values())}
                for drain in consolidation_moves(cluster.shares(owners), gpu_memory_bytes, budget,
                                                 policy.compute_overcommit):
                    cluster.place(drain.pod, cluster.seats[drain.pod][1], drain.to_gpu)
                    moves.setdefault(drain.workload, []).append(now)
        yield seating

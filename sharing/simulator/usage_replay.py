"""A usage trace replayed through the right-sizer: recommender, sizing, updater, step by step.

Each pod of the trace first asks for a whole GPU and lives from its first sample to its last;
its workload is its own unless the run maps pods to workloads. At every step (the trace's grid):

1. Pods that ended free their shares.
2. Pods that start ask for a whole GPU; in ``initial`` and ``recreate`` modes a pod whose
   workload has a recommendation asks for the recommended size instead (the webhook's part).
3. Every live pod's use is observed by the recommender (``sharing.usage.recommender``). Memory
   above the pod's limit is an OOM: recorded (it raises the recommendation at once), and the
   pod is observed at its limit, all it could hold. A pod on a share (less than a whole GPU) is
   an MPS client, whose compute the node agent cannot read (NVML gives its SM samples to the
   MPS server, benchmarks/nvml_usage_check.md): only its memory is observed, as the agent
   publishes it, unless the run says shared compute is observed (what per-client attribution
   would give).
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

``backend="device-plugin"`` models the live device-plugin path instead, as a live usage replay
runs it (``gpupack replay usage``, one GPU per node): a GPU is split into equal replicas for the
first pod it takes (``sharing.packing.replica_gpus``), a size is not rounded (the webhook asks
what the recommendation says) and takes a whole GPU when no split into two replicas holds it
(``sharing.rules.replicas.needs_whole_gpu``), and nothing consolidates (the live controller has
no consolidation moves). ``publish_every_s`` models the agents' publication: the recommender
sees a pod's use only as of the last publication (every 300 s by default), not as it happens.

**Observation noise** (``observation_seed``): a live run's agents do not observe the trace as this
replay does. Each node's agent publishes at its own phase, not all at one step, and an agent whose
poll (its tick plus ``poll_seconds``) takes longer than a trace step misses that step's sample (at
a replay's time scale a 57 s step lasts well under a second of wall time). With a seed, each GPU's
agent publishes at a phase drawn for it, and each pod-step sample of use is missed with
probability ``missed_samples`` (an OOM is never missed: the workload's restart is seen whatever
the poll). Small perturbations move few pods (an 80 GB GPU pairs two pods of 36-37 GB, not of
40), but each such pod holds or frees a GPU for hours, so on a few pods the saving is a
distribution, not a number: ``sharing.simulator.usage.run_usage_draws`` reports it over seeds.
Without a seed (the default) nothing is drawn: every sample is seen and every agent publishes at
step 0 of the grid, as before.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from sharing.dra.share_policy import SHARES, SharePolicy
from sharing.rules.replicas import MAX_MILLI
from sharing.simulator.usage_figures import Seat, Seating
from sharing.packing.replica_gpus import ReplicaGpus
from sharing.packing.shared_gpus import FitRule, SharedGpus
from sharing.usage.consolidation import consolidation_moves
from sharing.usage.recommender import Recommender, RecommenderSettings, WorkloadKey
from sharing.usage.sizing import Size, replica_share_of, size_for, whole_gpu
from sharing.usage.trace import PodUsage, UsageTrace
from sharing.usage.updater import Candidate, UpdaterSettings, choose_moves

Mode = Literal["off", "initial", "recreate"]
MODES: tuple[Mode, ...] = ("off", "initial", "recreate")
Backend = Literal["dra", "device-plugin"]
BACKENDS: tuple[Backend, ...] = ("dra", "device-plugin")


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
    max_drains: int = 1
    """GPUs one consolidation may empty."""
    duty_quantile: float | None = None
    """Admit a share while the GPU's predicted duty sum stays at most 100 % at this quantile
    (``sharing.packing.duty_sum``; with ``compute_overcommit`` above 1); None: caps only."""
    shared_compute_observed: bool = False
    """Observe the compute of pods on shares too. The product cannot (MPS: module docstring, step 3);
    True measures what it would give."""
    backend: Backend = "dra"
    """Whose shares: the DRA pool's exact ones, or the device plugin's equal replicas (module docstring)."""
    publish_every_s: float | None = None
    """The recommender sees use as of the last publication, every this many seconds (the agents'
    ``usage_publish_seconds``); None: as it happens."""
    observation_seed: int | None = None
    """Draw each GPU's publication phase and the samples missed from this seed (module docstring,
    "Observation noise"); None: nothing is drawn."""
    missed_samples: float = 0.0
    """With ``observation_seed``: the probability that a pod-step sample of use is not observed."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.missed_samples < 1.0:
            raise ValueError(f"missed_samples must be at least 0 and below 1, got {self.missed_samples}")
        if self.missed_samples and self.observation_seed is None:
            raise ValueError("missed_samples needs an observation_seed (the draws are seeded)")


def own_workloads(trace: UsageTrace) -> dict[str, WorkloadKey]:
    """Each pod its own workload of one replica (a trace names no owners; ``workloads`` maps some)."""
    return {p.pod: WorkloadKey("trace", "Pod", p.pod, "main") for p in trace.pods}


def share_of(size: Size, gpu_memory_bytes: int, shares: SharePolicy) -> Size:
    """The share a size takes under the share policy: a whole GPU when its memory rounds past
    what a GPU serves, or when it rounds to all of a GPU's compute (a pod predicted to use a
    whole GPU gets one, over-commit or not: over-commit is only against predicted use). Placed by
    the predicted duty sum, such pods still take whole GPUs: on the GenTD26 half their bursts
    come together (docs/usage.md), which a sum of independent profiles does not see."""
    milli = shares.consumed_milli(size.milli)
    memory = shares.consumed_memory(size.memory_bytes)
    if milli >= MAX_MILLI or memory > shares.max_memory(gpu_memory_bytes):
        return whole_gpu(gpu_memory_bytes)
    return Size(milli, memory)


def right_sizing_seatings(trace: UsageTrace, gpu_memory_bytes: int, policy: RightSizing,
                          workloads: Mapping[str, WorkloadKey] | None = None) -> Iterator[Seating]:
    """The run's seating at each step (module docstring)."""
    owners = {**own_workloads(trace), **(workloads or {})}
    recommender = Recommender(policy.recommender)
    rule = FitRule(gpu_memory_bytes, policy.compute_overcommit, policy.duty_quantile)
    device_plugin = policy.backend == "device-plugin"
    cluster = ReplicaGpus(rule) if device_plugin else SharedGpus(rule)
    # (GPU observed on, "oom"|"use"|"memory", workload, time, duty, memory), in the order observed
    unpublished: list[tuple[int, str, WorkloadKey, float, float, int]] = []
    publish_steps = None if policy.publish_every_s is None else max(1, round(policy.publish_every_s / trace.step_s))
    draws = None if policy.observation_seed is None else random.Random(policy.observation_seed)
    phases: dict[int, int] = {}  # GPU -> the step of the publication grid its agent publishes at
    moves: dict[WorkloadKey, list[float]] = {}
    by_start: dict[int, list[PodUsage]] = {}
    by_end: dict[int, list[PodUsage]] = {}
    for pod in trace.pods:
        by_start.setdefault(pod.first_step, []).append(pod)
        by_end.setdefault(pod.end_step, []).append(pod)
    live: dict[str, PodUsage] = {}
    killed: set[str] = set()  # pods OOM-killed since they were seated

    def target(pod: str) -> Size | None:
        recommendation = recommender.recommend(owners[pod])
        if recommendation is None:
            return None
        size = size_for(recommendation, gpu_memory_bytes)
        if device_plugin:
            return replica_share_of(size, gpu_memory_bytes)
        return share_of(size, gpu_memory_bytes, policy.shares)

    def phase(gpu: int) -> int:
        if gpu not in phases:
            phases[gpu] = 0 if draws is None or publish_steps is None else draws.randrange(publish_steps)
        return phases[gpu]

    def publish(step: int) -> None:
        kept = []
        for entry in unpublished:
            gpu, kind, key, at, duty, memory = entry
            if publish_steps is not None and (step - phase(gpu)) % publish_steps:
                kept.append(entry)  # its agent publishes at another step of the grid
            elif kind == "oom":
                recommender.record_oom(key, at, memory)
            elif kind == "memory":  # a share's compute is not observed (MPS)
                recommender.observe_memory(key, at, memory)
            else:
                recommender.observe(key, at, duty, memory)
        unpublished[:] = kept

    for step in range(trace.steps):
        now = trace.start_s + step * trace.step_s
        for pod in by_end.get(step, []):
            killed.discard(pod.pod)
            cluster.leave(pod.pod)
            live.pop(pod.pod, None)
        for pod in by_start.get(step, []):
            size = target(pod.pod) if policy.mode != "off" else None
            cluster.seat(pod.pod, size or whole_gpu(gpu_memory_bytes), recommender.duty_profile(owners[pod.pod]))
            live[pod.pod] = pod
        # The step's use happens in these seats; the updater's moves take effect from the next step.
        seating = {name: Seat(gpu, size.memory_bytes) for name, (gpu, size) in cluster.seats.items()}
        for name, pod in live.items():
            used = pod.memory_bytes[step - pod.first_step]
            gpu, seat = cluster.seats[name]
            limit = seat.memory_bytes
            if used > limit:
                unpublished.append((gpu, "oom", owners[name], now, 0.0, limit))
                killed.add(name)
            if draws is not None and policy.missed_samples and draws.random() < policy.missed_samples:
                continue  # its agent's poll skipped this step
            compute = policy.shared_compute_observed or seat.milli >= MAX_MILLI
            unpublished.append((gpu, "use" if compute else "memory", owners[name], now,
                                pod.duty_percent[step - pod.first_step], min(used, limit)))
        publish(step)
        if policy.mode == "recreate":
            horizon = now - policy.updater.interval_s
            recent = {key: sum(1 for t in times if t > horizon) for key, times in moves.items()}
            candidates = [Candidate(name, owners[name], cluster.seats[name][1], wanted, name in killed)
                          for name in live if (wanted := target(name)) is not None]
            for move in choose_moves(candidates, recent, policy.updater):
                killed.discard(move.pod)
                cluster.seat(move.pod, move.target, recommender.duty_profile(move.workload),
                             avoid=cluster.seats[move.pod][0])
                moves.setdefault(move.workload, []).append(now)
            every = None if device_plugin else policy.consolidate_every_s
            if every is not None and step % max(1, round(every / trace.step_s)) == 0:
                budget = {key: policy.updater.max_moves_per_interval - sum(1 for t in times if t > horizon)
                          for key, times in moves.items()}
                budget = {key: budget.get(key, policy.updater.max_moves_per_interval) for key in set(owners.values())}
                for name in live:  # the pool predicts sums from the profiles as they are now
                    cluster.set_duty(name, recommender.duty_profile(owners[name]))
                for drain in consolidation_moves(cluster, owners, budget, policy.max_drains):
                    cluster.place(drain.pod, cluster.seats[drain.pod][1], drain.to_gpu, cluster.duties.get(drain.pod))
                    moves.setdefault(drain.workload, []).append(now)
        yield seating

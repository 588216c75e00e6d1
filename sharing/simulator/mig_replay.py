"""MIG variant of the simulator: openb pods, with their real arrival and departure times,
replayed onto MIG-capable GPUs under a layout strategy (``sharing.packing.mig_layouts``).

Each GPU pod asks for the smallest profile covering its compute and a matching
share of memory (``profile_for``); a whole-GPU pod asks for ``q`` whole-GPU
instances on one node. Under a static layout a pod may use any free instance whose profile covers
its own (compute and memory), the smallest first; under a dynamic strategy
only its own profile (what it asks the device plugin for). Among GPUs, the one
with the most instances already in use wins (so idle GPUs stay idle and
reshapable). A pod that
finds nothing waits (FIFO per request class) until a departure or a reshape
frees something; it then runs for its traced duration. Reshaping an idle GPU
takes ``reshape_delay_s`` (mig-manager plus device-plugin restart), during which
the GPU offers nothing. CPU-only pods and GPU-model constraints are ignored:
the cluster is ``gpus`` GPUs of one model, ``gpus_per_node`` per node.

The clock is the trace's: no wall time is read, so runs repeat exactly.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from mig.model import GpuModel
from sharing.packing.mig_layouts import Layout, LayoutStrategy, full_profile, profile_for
from sharing.packing.specs import PodSpec

DEPART, RESHAPED, ARRIVE = 0, 1, 2
"""Event kinds, in the order they are handled at equal times."""

IDLE_RESERVE = 0.125
"""Share of idle GPUs below which the adaptive strategy stops giving small pods big instances."""

RECENT_DECAY = 0.99
"""Weight kept by the recent-request histogram per arrival (a ~100-arrival memory)."""


@dataclass(frozen=True)
class MigRunResult:
    strategy: str
    model: str
    gpus: int
    pods: int
    placed: int
    never_placed: int
    mean_wait_s: float
    allocation_percent: float
    """Time-averaged GPU compute asked by running pods, % of the cluster's GPUs."""
    reshapes: int


@dataclass(frozen=True)
class _Need:
    profile: str
    count: int  # instances, one per GPU; >1 only for multi-GPU pods (whole-GPU profile)


class MigCluster:
    """Per-GPU layout, free instances and reconfiguration state."""

    def __init__(self, model: GpuModel, gpus: int, gpus_per_node: int, layout: Layout, oversize: str = "any") -> None:
        self.model = model
        self.gpus_per_node = gpus_per_node
        self.layout: list[Layout] = [layout] * gpus
        self.free: list[Counter[str]] = [Counter(layout) for _ in range(gpus)]
        self.in_use: list[int] = [0] * gpus
        self.reshaping: list[bool] = [False] * gpus
        self.free_total: Counter[str] = Counter({p: n * gpus for p, n in Counter(layout).items()})
        profiles = {p.name: p for p in model.profiles}
        # covers[p] = profiles whose instances can serve a request for p, smallest first
        self.covers: dict[str, tuple[str, ...]] = {
            p.name: tuple(
                q.name
                for q in sorted(model.profiles, key=lambda q: (q.compute_slices, q.memory_slices, q.media_extensions))
                if q.compute_slices >= p.compute_slices and q.memory_mib >= p.memory_mib
            )
            for p in profiles.values()
        }
        if oversize == "never":
            self.covers = {p: (p,) for p in self.covers}
        self.busy_only = oversize == "busy"
        self.adaptive = oversize == "adaptive"
        self.allow_larger = True
        """For ``adaptive``: set by the replay, True while the cluster has slack."""
        self.idle = gpus

    def set_free(self, gpu: int, free: Counter[str]) -> None:
        self.free_total.subtract(self.free[gpu])
        self.free_total.update(free)
        self.free[gpu] = free

    def find(self, need: _Need) -> list[tuple[int, str]] | None:
        """Instances for ``need``: (gpu, profile) pairs, or None."""
        if need.count == 1:
            for prof in self.covers[need.profile]:
                if self.free_total[prof] <= 0:
                    continue
                best = -1
                larger = prof != need.profile
                if larger and self.adaptive and not self.allow_larger:
                    break
                for g, f in enumerate(self.free):
                    if f[prof] > 0 and (best < 0 or self.in_use[g] > self.in_use[best]):
                        if larger and self.busy_only and self.in_use[g] == 0:
                            continue  # an idle GPU is better reshaped than spent on a small pod
                        best = g
                if best >= 0:
                    return [(best, prof)]
            return None
        full = need.profile
        if self.free_total[full] < need.count:
            return None
        for start in range(0, len(self.free), self.gpus_per_node):
            gpus = [g for g in range(start, min(start + self.gpus_per_node, len(self.free))) if self.free[g][full] > 0]
            if len(gpus) >= need.count:
                return [(g, full) for g in gpus[: need.count]]
        return None

    def take(self, instances: list[tuple[int, str]]) -> None:
        for g, prof in instances:
            self.free[g][prof] -= 1
            self.free_total[prof] -= 1
            self.idle -= self.in_use[g] == 0
            self.in_use[g] += 1

    def give_back(self, instances: list[tuple[int, str]]) -> None:
        for g, prof in instances:
            self.free[g][prof] += 1
            self.free_total[prof] += 1
            self.in_use[g] -= 1
            self.idle += self.in_use[g] == 0


def replay_mig(
    pods: Sequence[PodSpec],
    created: Sequence[int | None],
    deleted: Sequence[int | None],
    model: GpuModel,
    strategy: LayoutStrategy,
    gpus: int = 64,
    gpus_per_node: int = 8,
    reshape_delay_s: float = 60.0,
) -> MigRunResult:
    """Replay the GPU pods of a trace (creation/deletion times required) under ``strategy``."""
    if gpus < 1 or gpus_per_node < 1:
        raise ValueError("need at least one GPU and one GPU per node")
    full = full_profile(model).name
    cluster = MigCluster(model, gpus, gpus_per_node, strategy.initial(model), strategy.oversize)
    events: list[tuple[float, int, int, int]] = []
    needs: dict[int, _Need] = {}
    duration: dict[int, float] = {}
    for i, pod in enumerate(pods):
        if pod.gpu_count == 0:
            continue
        c, d = created[i], deleted[i]
        if c is None or d is None:
            raise ValueError(f"pod {pod.name!r} has no creation/deletion time; the MIG variant needs both")
        if pod.gpu_count > gpus_per_node:
            continue  # can never fit one node; counted as never placed below
        profile = full if pod.is_whole else profile_for(model, pod.gpu_milli).name
        needs[i] = _Need(profile, pod.gpu_count if pod.is_whole else 1)
        duration[i] = float(max(d - c, 0))
        heapq.heappush(events, (float(c), ARRIVE, i, i))
    total_gpu_pods = sum(1 for p in pods if p.gpu_count)
    waiting: dict[str, deque[int]] = {}
    arrived_at: dict[int, float] = {}
    running: dict[int, list[tuple[int, str]]] = {}
    recent: dict[str, float] = {}
    pending_layouts: dict[int, Layout] = {}
    waits: list[float] = []
    reshapes = 0
    busy_milli = 0
    area = 0.0
    last_t: float | None = None
    first_t: float | None = None

    def start(i: int, t: float, inst: list[tuple[int, str]]) -> None:
        nonlocal busy_milli
        cluster.take(inst)
        running[i] = inst
        waits.append(t - arrived_at[i])
        busy_milli += pods[i].gpu_total_milli
        heapq.heappush(events, (t + duration[i], DEPART, i, i))

    def slack() -> bool:
        # Adaptive oversize: a small pod may take a bigger free instance only while nobody
        # waits and at least IDLE_RESERVE of the GPUs are idle; under pressure pods take
        # their own profile and idle GPUs are reshaped to pack them densely.
        return not waiting and cluster.idle >= IDLE_RESERVE * gpus

    def drain(t: float) -> None:
        # Serve waiting classes in order of their oldest pod; within a class FIFO.
        cluster.allow_larger = False  # someone waits: no slack
        for key in sorted(waiting, key=lambda k: waiting[k][0] if waiting[k] else 1 << 62):
            queue = waiting[key]
            while queue:
                inst = cluster.find(needs[queue[0]])
                if inst is None:
                    break
                start(queue.popleft(), t, inst)
        for key in [k for k, q in waiting.items() if not q]:
            del waiting[key]

    def plan(t: float) -> None:
        nonlocal reshapes
        if not waiting:
            return
        missing: Counter[str] = Counter()
        for queue in waiting.values():
            for i in queue:
                missing[needs[i].profile] += needs[i].count
        for layout in pending_layouts.values():
            missing -= Counter(layout)
        if not missing:
            return
        idle = [(g, cluster.layout[g]) for g in range(gpus) if cluster.in_use[g] == 0 and not cluster.reshaping[g]]
        if not idle:
            return
        for change in strategy.plan(model, idle, missing, recent):
            g = change.gpu
            if cluster.in_use[g] or cluster.reshaping[g]:
                raise AssertionError(f"strategy {strategy.name} reshaped GPU {g}, which is not idle")
            cluster.reshaping[g] = True
            cluster.set_free(g, Counter())
            cluster.layout[g] = change.layout
            pending_layouts[g] = change.layout
            reshapes += 1
            heapq.heappush(events, (t + reshape_delay_s, RESHAPED, g, g))

    while events:
        t, kind, _, i = heapq.heappop(events)
        if first_t is None:
            first_t = t
        if last_t is not None:
            area += busy_milli * (t - last_t)
        last_t = t
        if kind == DEPART:
            cluster.give_back(running.pop(i))
            busy_milli -= pods[i].gpu_total_milli
        elif kind == RESHAPED:
            cluster.reshaping[i] = False
            cluster.set_free(i, Counter(pending_layouts.pop(i)))
        else:
            arrived_at[i] = t
            prof = needs[i].profile
            for k in recent:
                recent[k] *= RECENT_DECAY
            recent[prof] = recent.get(prof, 0.0) + 1.0
            cluster.allow_larger = slack()
            inst = cluster.find(needs[i]) if not waiting.get(prof) else None
            if inst is not None:
                start(i, t, inst)
            else:
                waiting.setdefault(prof if needs[i].count == 1 else f"{prof}x{needs[i].count}", deque()).append(i)
        if not events or events[0][0] > t:
            drain(t)
            plan(t)
    never = total_gpu_pods - len(waits)
    span = (last_t - first_t) if first_t is not None and last_t is not None else 0.0
    return MigRunResult(
        strategy=strategy.name,
        model=model.product,
        gpus=gpus,
        pods=total_gpu_pods,
        placed=len(waits),
        never_placed=never,
        mean_wait_s=(sum(waits) / len(waits)) if waits else 0.0,
        allocation_percent=(100.0 * area / (span * gpus * 1000)) if span > 0 else 0.0,
        reshapes=reshapes,
    )

"""Priorities in the product model: who preempts whom when a pod fits nowhere, and the figures per class.

``gpupack simulate --model product --priority qos`` gives each openb pod the priority of its
``qos`` column (``sharing.rules.priority.qos_priority``). The protocol's other rules stay
(``sharing.simulator.product``): pods arrive in the seeded order and never leave on their own.
A pod that fits nowhere may now preempt placed pods of strictly lower priority:

- **who chooses the victims** follows the live system: a pod the packing engine places (a
  fractional pod on the engine live path, whole-GPU rewrites included) gets
  ``sharing.packing.preemption.engine_preemption`` under ``--preemption engine``; a pod
  kube-scheduler places (CPU-only pods, ``nvidia.com/gpu`` pods, and every pod under
  ``--preemption scheduler``) gets kube-scheduler's default,
  ``sharing.packing.preemption.scheduler_preemption``, which dry-runs kube's
  ``max(10 %, 100)`` candidate nodes from an offset drawn from the seed's own stream;
- **victims leave** the cluster at once and count as not placed (failed). They are not
  re-queued: the protocol drops a pod that fits nowhere and never retries it, and in a run
  where nothing leaves on its own nothing but another preemption frees a place, so a re-queued
  victim could only come back by preempting a pod of lower priority still;
- a node left with no GPU pod is idle again (``FRESH``): the controller may split or switch it.
- with preemption on, the engine places a GPU pod first among the nodes that hold no GPU pod of
  another priority (:meth:`Preempting.unmixed`, ``sharing.packing.priority_affinity``), then anywhere.

Figures (:class:`PriorityFigures`): per class (the pod's PriorityClass name, here its ``qos``),
the percentage of the class's arrived milli that is placed, at each arrived-demand level as
``alloc_at`` is read (``sharing.simulator.metrics.mean_by_level``) and at the end; the
preemptions, pods and milli preempted, their reasons; and two checks that must stay 0: victims
of equal or higher priority than their preemptor, and loops (a victim that later preempts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import numpy as np

from sharing.api.priority import PodPriority
from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.fragmentation import FragmentationModel
from sharing.packing.node_sharing import FRESH
from sharing.packing.preemption import PreemptionPlan, candidate_count, engine_preemption, scheduler_preemption
from sharing.packing.priority_affinity import no_lower_nodes, unmixed_nodes
from sharing.packing.specs import PodPlacement, PodSpec
from sharing.packing.typical import TypicalPods
from sharing.packing.victims import PlacedPods, Victim
from sharing.rules.replicas import largest_replicas, most_replicas
from sharing.simulator.metrics import MAX_LEVEL, arrival_levels, mean_by_level
from sharing.simulator.tally import ArrivalTally
from sharing.simulator.workload import trace_name

PreemptionMode = Literal["none", "engine", "scheduler"]
PREEMPTION_MODES: Final[tuple[PreemptionMode, ...]] = ("engine", "scheduler")
"""``--preemption``'s choices (``none`` is ``--priority none``: no pod preempts)."""

PREEMPTION_STREAM: Final = 0x707265
"""Second word of the seed of kube-scheduler's dry-run offsets (a stream apart from the others)."""


def own_size(pod: PodSpec, view: PodSpec, live_path: str) -> int:
    """The replica count a fractional pod fits, as ``engine_preemption`` takes its ``own_size``: the most
    replicas its share allows where the engine places it, else the largest replica its share fits; 0
    when ``view`` (the pod as the engine sees it) is not fractional."""
    if not view.is_shared:
        return 0
    if pod.is_shared and live_path == "engine":
        return most_replicas(((pod.gpu_milli, None),), 0)
    return largest_replicas(pod.gpu_milli)


class Replay(Protocol):
    """What preemption needs of the product model's replay (``sharing.simulator.product.ProductReplay``)."""

    cluster: ClusterState
    modes: IntArray
    used: IntArray
    last_placement: PodPlacement | None
    last_replica: bool

    @property
    def policy(self) -> object: ...

    @property
    def live_path(self) -> str: ...

    def place_at(self, pod: PodSpec, node: int, gpus: tuple[int, ...], replicas: int | None = None) -> float: ...


@dataclass(frozen=True)
class PriorityFigures:
    """What a run with classes reports beside ``alloc_at`` (module docstring)."""

    preemption: PreemptionMode
    alloc_at_by_class: dict[str, dict[int, float | None]]
    placed_by_class: dict[str, float]
    """Per class, the percentage of its arrived milli placed at the end."""
    milli_by_class: dict[str, tuple[int, int]]
    """Per class, its milli arrived and placed at the end."""
    preemptions: int = 0
    """Pods that preempted."""
    preempted_pods: int = 0
    preempted_milli: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    """Preemptions per plan reason (``sharing.packing.preemption.REASONS``)."""
    equal_or_higher: int = 0
    """Victims whose priority was not below their preemptor's (must be 0)."""
    loops: int = 0
    """Victims that later preempted (must be 0)."""
    paired_engine_milli: int = 0
    """Milli the engine's preemptions took, over those where kube-scheduler's default could make room too."""
    paired_scheduler_milli: int = 0
    """Milli kube-scheduler's default would have preempted for the same pods on the same states."""
    scheduler_could_not: int = 0
    """Engine preemptions for which kube-scheduler's default found no candidate (it cannot reshape)."""


@dataclass(frozen=True)
class _Event:
    preemptor: str
    priority: int
    victims: tuple[Victim, ...]
    reason: str


class ClassTally:
    """Per class, the milli arrived and placed after every arrival (placed pods preempted are taken off)."""

    def __init__(self, count: int, classes: Sequence[str]) -> None:
        self.classes = tuple(sorted(set(classes)))
        self._index = {c: i for i, c in enumerate(self.classes)}
        self.arrived = np.zeros(len(self.classes), dtype=np.int64)
        self.placed = np.zeros(len(self.classes), dtype=np.int64)
        self.percent = np.full((count, len(self.classes)), np.nan)

    def record(self, i: int, cls: str, milli: int, placed: bool) -> None:
        c = self._index[cls]
        self.arrived[c] += milli
        if placed:
            self.placed[c] += milli
        with np.errstate(invalid="ignore", divide="ignore"):
            self.percent[i] = np.where(self.arrived > 0, np.round(100.0 * self.placed / self.arrived, 2), np.nan)

    def withdraw(self, cls: str, milli: int) -> None:
        self.placed[self._index[cls]] -= milli

    def by_level(self, arrived: np.ndarray, total_gpus: int) -> dict[str, dict[int, float | None]]:
        levels = arrival_levels(arrived, total_gpus)
        out = {}
        for c, name in enumerate(self.classes):
            valid = ~np.isnan(self.percent[:, c])
            out[name] = mean_by_level(levels[valid], self.percent[valid, c], MAX_LEVEL)
        return out

    def final(self) -> dict[str, float]:
        return {name: round(100.0 * float(self.placed[c]) / float(self.arrived[c]), 2) if self.arrived[c] else 100.0
                for c, name in enumerate(self.classes)}


class Preempting:
    """One run's priorities: each pod's, the placed-pods index and the preemptions (module docstring)."""

    def __init__(self, replay: Replay, priorities: Mapping[str, PodPriority], mode: PreemptionMode,
                 arrivals: Sequence[PodSpec], seed: int) -> None:
        if mode not in ("none", *PREEMPTION_MODES):
            raise ValueError(f"unknown preemption {mode!r}; choose one of none, {', '.join(PREEMPTION_MODES)}")
        self.replay = replay
        self.mode: PreemptionMode = mode
        self.priorities = priorities
        missing = [p.name for p in arrivals if trace_name(p.name) not in priorities]
        if missing:
            raise ValueError(f"no priority for pod {missing[0]!r} ({len(missing)} pods without one)")
        self.classes = ClassTally(len(arrivals), [self.of(p).class_name for p in arrivals])
        self.placed = PlacedPods(len(replay.cluster))
        self.held: dict[str, float] = {}
        self.events: list[_Event] = []
        self.paired: list[tuple[int, int | None]] = []
        """Per engine preemption: its milli, and what kube-scheduler's default would preempt on the same
        state (None: it could not make room)."""
        self.offsets = np.random.default_rng([seed, PREEMPTION_STREAM])
        self._fragmentation: tuple[TypicalPods, FragmentationModel] | None = None

    def of(self, pod: PodSpec) -> PodPriority:
        return self.priorities[trace_name(pod.name)]

    def unmixed(self, pod: PodSpec) -> BoolArray:
        """The nodes the engine places ``pod`` among first: no GPU pod of another priority there."""
        return unmixed_nodes(self.placed, self.of(pod).value)

    def no_lower(self, pod: PodSpec) -> BoolArray:
        """The nodes kube-scheduler places ``pod`` among first (gpupack's prioritize extender): no GPU pod
        of lower priority there."""
        return no_lower_nodes(self.placed, self.of(pod).value)

    # ------------------------------------------------------------------ per arrival
    def make_room(self, pod: PodSpec, view: PodSpec, tally: ArrivalTally) -> float | None:
        """Preempt for ``pod`` (``view``: as the engine sees it), which fits nowhere, and place it; the GPU
        milli it occupies, or None."""
        if self.mode == "none":
            return None
        replay = self.replay
        priority = self.of(pod)
        engine_places = pod.is_shared and replay.live_path == "engine"
        own = own_size(pod, view, replay.live_path)
        plan: PreemptionPlan | None = None
        if not (engine_places and self.mode == "engine"):
            plan = self._scheduler(view, priority, own)
        if plan is None and self.mode == "engine" and view.gpu_count:
            # gpupack's controller sees a GPU pod kube-scheduler could not make room for (it cannot
            # reshape) as it sees the pods it gates, and preempts for it with the engine's rules.
            plan = engine_preemption(replay.cluster, replay.modes, replay.used, self.placed, view, priority, own,
                                     self._fragmentation_model())
            if plan is not None:
                # kube-scheduler's default on the same state, for the paired comparison.
                would = self._scheduler(view, priority, own)
                self.paired.append((plan.preempted_milli, None if would is None else would.preempted_milli))
        if plan is None:
            return None
        for victim in plan.victims:
            self._evict(victim, tally)
        self.events.append(_Event(pod.name, priority.value, plan.victims, plan.reason))
        return replay.place_at(view, plan.node, plan.gpus, plan.replicas)

    def _scheduler(self, view: PodSpec, priority: PodPriority, own: int) -> PreemptionPlan | None:
        replay = self.replay
        n = len(replay.cluster)
        return scheduler_preemption(replay.cluster, replay.modes, replay.used, self.placed, view, priority, own,
                                    offset=int(self.offsets.integers(n)), max_candidates=candidate_count(n))

    def record(self, i: int, pod: PodSpec, taken: float | None) -> None:
        """Log arrival ``i`` per class and, when placed, index it as a possible victim."""
        priority = self.of(pod)
        self.classes.record(i, priority.class_name, pod.gpu_total_milli, taken is not None)
        if taken is None or self.mode == "none":
            return
        placement = self.replay.last_placement
        assert placement is not None
        self.placed.add(Victim(pod.name, priority.value, pod.gpu_total_milli, placement,
                               replica=self.replay.last_replica, started=float(i)))
        self.held[pod.name] = taken

    def _evict(self, victim: Victim, tally: ArrivalTally) -> None:
        replay = self.replay
        cluster = replay.cluster
        self.placed.remove(victim.key)
        cluster.remove(victim.placement)
        node = victim.node
        if victim.replica:
            replay.used[node, victim.placement.gpus[0]] -= 1
        if cluster.pod_kinds[node].sum() == 0:
            replay.modes[node] = FRESH  # no GPU pod left: the node is idle, the controller may reshape it
        tally.withdraw(victim.milli, self.held.pop(victim.key))
        self.classes.withdraw(self.priorities[trace_name(victim.key)].class_name, victim.milli)

    def _fragmentation_model(self) -> FragmentationModel | None:
        """FGD's model of the engine's current typical pods (None for a policy without them, e.g. BestFit)."""
        typical = getattr(self.replay.policy, "typical", None)
        if not isinstance(typical, TypicalPods):
            return None
        if self._fragmentation is None or self._fragmentation[0] is not typical:
            self._fragmentation = (typical, FragmentationModel(typical, self.replay.cluster.models))
        return self._fragmentation[1]

    # ------------------------------------------------------------------ figures
    def figures(self, tally: ArrivalTally, total_gpus: int) -> PriorityFigures:
        victims = [(e, v) for e in self.events for v in e.victims]
        preemptors = {e.preemptor: n for n, e in enumerate(self.events)}
        loops = sum(1 for n, e in enumerate(self.events) for v in e.victims if preemptors.get(v.key, -1) > n)
        return PriorityFigures(
            preemption=self.mode,
            alloc_at_by_class=self.classes.by_level(tally.arrived, total_gpus),
            placed_by_class=self.classes.final(),
            milli_by_class={c: (int(self.classes.arrived[i]), int(self.classes.placed[i]))
                            for i, c in enumerate(self.classes.classes)},
            preemptions=len(self.events),
            preempted_pods=len(victims),
            preempted_milli=sum(v.milli for _, v in victims),
            reasons=dict(Counter(e.reason for e in self.events)),
            equal_or_higher=sum(1 for e, v in victims if v.priority >= e.priority),
            loops=loops,
            paired_engine_milli=sum(e for e, k in self.paired if k is not None),
            paired_scheduler_milli=sum(k for _, k in self.paired if k is not None),
            scheduler_could_not=sum(1 for _, k in self.paired if k is None),
        )

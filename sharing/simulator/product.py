"""The product model: a trace replayed under the live rules of the device-plugin backend.

``gpupack simulate --model product`` (the FGD paper's protocol is ``--model
fgd``; the DRA backend's rules, ``--backend dra``, are ``sharing.simulator.dra``).
What a fractional pod occupies, and who chooses its node, follow what
the live system does (docs/simulator.md, "Product model"):

- **Node-wide replicas.** A node is fresh, whole or shared with ``r`` replicas
  per GPU (``sharing.packing.node_sharing``); a pod of ``m`` milli fits a
  replica when ``r * m <= 1000`` (``sharing.rules.replicas``), takes one replica and
  occupies ``1000 / r``. Whole-GPU pods never land on a shared node, and a
  shared node never takes a whole-GPU pod.
- **Who places what**, by live path:

  ``engine`` (gpupack today): every fractional pod is gated by the webhook and
  placed by the packing engine (``--policy``) under the rules of
  ``sharing.packing.node_sharing``: a pod above half a GPU gets a plain whole
  GPU on a fresh or whole node; a smaller one takes a replica on the shared
  node that wastes the least (largest ``r <= k``), and only when none has one
  does the controller split an idle node into ``k`` (a policy may split first
  and waste last; where whole-GPU pods go and which node is split are the
  policy's choice). The order is ``sharing.packing.shared_sequence``'s, the
  live planner's too; a split is sized by ``sharing.rules.replicas``
  (``replicas_for_demand``) for the pod alone, as the model sees no backlog.

  ``scheduler`` (gpupack before the product model; kept to measure what the
  engine path recovers): fractional pods are ungated and scored by
  kube-scheduler; a pod above half a GPU takes a node split into one replica;
  the controller switches the smallest idle node when no shared node fits.

  Whole-GPU and CPU-only pods are scored by kube-scheduler in both (MostAllocated
  with the weights ``manifests/`` ships: ``sharing.packing.kube_scoring``).
- **openb's GPUs** are not MIG-capable (``mig.openb_gpus`` maps
  openb's types onto GPU products, the one mapping for every openb replay), so
  every fractional pod is an MPS share; openb pods state no GPU memory, so the
  memory half of the replica rule never binds (as for a pod that gives no
  ``gpupack.io/gpu-memory`` under a policy without a default). A node list with
  a MIG-capable type is refused: MIG placement is ``--mig``'s replay.

Each pod is decided against the state the pods before it left, so a burst never strands pods
in a mode here; the live webhook decides from the GPUNodes' last reported status, and the
controller re-admits the pods a burst left in a mode with no room (``controller.planning.readmit``).

The protocol's other rules hold: pods arrive in the seeded order and never
leave, a pod that fits nowhere is dropped (with priorities it may first preempt pods of lower
priority: ``sharing.simulator.preempting``), allocation counts the milli pods
asked for (``occupied`` counts what their replicas reserve).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

import numpy as np

from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.kube_scoring import MostAllocatedWeights, most_allocated
from sharing.simulator.scheduler_config import load_priority_extender
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodPlacement, PodSpec
from sharing.packing.node_sharing import (
    FRESH, WHOLE, exact_replicas, place_whole, shared_candidates, switch_choice,
    switch_for, waste_first,
)
from sharing.packing.policy import Policy, decide
from sharing.packing.registry import canonical_policy_name, make_policy
from sharing.packing.typical import NO_GPU_POD, TypicalCounts, TypicalPods, TypicalRule, check_typical_rule, same_table
from sharing.packing.shared_sequence import EXACT, ReplicaStep, place_shared
from sharing.rules.replicas import Ask, largest_replicas, most_replicas, replica_milli, replicas_for_demand, takes_whole_gpu
from sharing.simulator.replay import Clock, _continue_stream
from sharing.simulator.arrivals import plan_run, refuse_mig_capable
from sharing.simulator.preempting import Preempting, PreemptionMode, PriorityFigures
from sharing.simulator.tally import ArrivalTally
from sharing.api.priority import PodPriority

SCHEDULER_TIES_STREAM: Final = 0x6B7562
"""Second word of the seed of the generator kube-scheduler's ties are drawn from (a stream apart
from the arrivals' and the policy's, so drawing ties changes neither)."""

DEFAULT_TYPICAL_EVERY: Final = 50
"""Arrivals one planning cycle plans with one policy under the ``present`` rule (the DRA model's
``sharing.simulator.dra.DEFAULT_TYPICAL_EVERY`` too): the policy is rebuilt once per batch."""

LivePath = Literal["engine", "scheduler"]
LIVE_PATHS: Final[tuple[LivePath, ...]] = ("engine", "scheduler")


@dataclass(frozen=True)
class CapacitySplit:
    """Where a run's GPU capacity went at its end, in percent of all GPU milli."""

    requested: float
    """Milli the placed pods asked for (the allocation figure)."""
    replica_rounding: float
    """Reserved beyond the ask: a pod of m milli in a replica of 1000/r."""
    free_on_shared: float
    """Replicas left free on shared nodes (no arriving pod fitted their r, CPU or memory)."""
    free_on_whole: float
    """GPUs left free on whole-GPU nodes."""
    free_on_fresh: float
    """GPUs of nodes never used by a GPU pod (CPU or memory taken by other pods, or nothing fitted)."""


@dataclass(frozen=True)
class ProductRun:
    """One seed's run under the product model."""

    policy: str
    live_path: LivePath
    seed: int
    pods: int
    failed_pods: int
    alloc_at: dict[int, float | None]
    occupied_at: dict[int, float | None]
    decision_us_median: float
    final_alloc_percent: float
    split: CapacitySplit
    node_modes: dict[str, int]
    """Nodes per final state: ``fresh``, ``whole``, ``r2``, ``r3``, ..."""
    priority: PriorityFigures | None = None
    """Figures per class and of preemption (``sharing.simulator.preempting``); None: the run had no classes."""
    divergences: tuple[Divergence, ...] = ()
    """Run that follows a live run (``follow``): the pods whose live outcome the model would not
    choose even when its ties fall the live run's way (empty: it can make every live choice)."""


@dataclass(frozen=True)
class Divergence:
    """A pod the model places other than the live run did, with its ties broken toward the live choice."""

    index: int
    """Position in the arrival order."""
    pod: str
    live: str | None
    """The node the live run bound it to (None: never placed)."""
    model: str | None


class ProductReplay:
    """The cluster under the live rules, one pod at a time."""

    def __init__(self, cluster: ClusterState, policy: Policy, weights: MostAllocatedWeights, live_path: LivePath,
                 scheduler_ties: np.random.Generator | None = None) -> None:
        """``scheduler_ties``: kube-scheduler's ties between equally scored nodes fall at random, as
        live (it samples one of them uniformly); without it, by the cluster's ``tie_rank``, as the
        engine's do. A node whose ``tie_rank`` is below 0 wins its ties either way (how a run
        follows a live one)."""
        if live_path not in LIVE_PATHS:
            raise ValueError(f"unknown live path {live_path!r}; choose one of {', '.join(LIVE_PATHS)}")
        self.cluster = cluster
        self.policy = policy
        self.weights = weights
        self.live_path = live_path
        self.scheduler_ties = scheduler_ties
        self.last_node: int | None = None
        """The node :meth:`place` last placed a pod on (None: it dropped the pod)."""
        self.last_placement: PodPlacement | None = None
        """What the engine's state holds for the pod last placed (a replica's share for a replica)."""
        self.last_replica = False
        """The pod last placed took a replica of a shared node."""
        self.modes: IntArray = np.full(len(cluster), FRESH, dtype=np.int64)
        """FRESH, WHOLE, or the node's replica count."""
        self.used: IntArray = np.zeros((len(cluster), cluster.width), dtype=np.int64)
        """Replicas taken per GPU of shared nodes."""
        self.prefer: Callable[[PodSpec], BoolArray] | None = None
        """The nodes the engine looks among first for a pod (``sharing.packing.priority_affinity``, with
        priorities); None: every node at once."""
        self.scheduler_prefer: Callable[[PodSpec], BoolArray] | None = None
        """The nodes kube-scheduler looks among first for a pod: gpupack's prioritize extender (``webhook``,
        configured in ``manifests/scheduler``) scores them above every other node
        (``priority_affinity.no_lower_nodes``); None: no extender, every node at once."""

    # ------------------------------------------------------------------ queries
    def free_replicas(self) -> IntArray:
        per_gpu = np.where(self.cluster.gpu_present, self.modes[:, None] - self.used, 0)
        out: IntArray = np.where(self.modes > 0, per_gpu.sum(axis=1), 0)
        return out

    # ------------------------------------------------------------------ placing
    def place(self, pod: PodSpec) -> float | None:
        """Place ``pod`` as the live system would; the GPU milli it occupies, or None (dropped).
        ``last_node`` is then the node it went to."""
        self.last_node = self.last_placement = None
        if pod.gpu_count == 0:
            return self._by_scheduler(pod, self.cluster.feasible(pod), None)
        if not pod.is_shared:
            return self._whole_by_scheduler(pod)
        if self.live_path == "engine":
            if takes_whole_gpu(pod.gpu_milli):
                return self._whole_by_engine(as_whole(pod))
            return self._shared_by_engine(pod)
        return self._shared_by_scheduler(pod)

    def _scheduler_pick(
        self, pod: PodSpec, nodes: IntArray, gpu_req: IntArray | None, gpu_alloc: IntArray | None, gpu_weight: int
    ) -> int:
        return scheduler_pick(self.cluster, pod, nodes, self.weights, gpu_req, gpu_alloc, gpu_weight, self.scheduler_ties)

    def _scheduler_first(self, pod: PodSpec, candidates: BoolArray) -> BoolArray:
        """The nodes kube-scheduler chooses ``pod``'s node among: those :attr:`scheduler_prefer` names when
        any of them is a candidate. The extender's score (its weight times 10 for a preferred node, 0 for
        any other) outranks the sum of every plugin's score, so MostAllocated only ranks nodes within a
        tier."""
        if self.scheduler_prefer is None:
            return candidates
        first = candidates & self.scheduler_prefer(pod)
        return first if first.any() else candidates

    def _by_scheduler(self, pod: PodSpec, candidates: BoolArray, gpu: tuple[IntArray, IntArray, int] | None) -> float | None:
        c = self.cluster
        nodes = np.flatnonzero(self._scheduler_first(pod, candidates))
        if nodes.size == 0:
            return None
        if gpu is None:
            node = self._scheduler_pick(pod, nodes, None, None, 0)
        else:
            gpu_req, gpu_alloc, gpu_weight = gpu
            node = self._scheduler_pick(pod, nodes, gpu_req[nodes], gpu_alloc[nodes], gpu_weight)
        free = np.flatnonzero(c.gpu_free[node] == GPU_MILLI)[: pod.gpu_count]
        return self.place_at(pod, node, tuple(int(g) for g in free))

    def _whole_by_scheduler(self, pod: PodSpec) -> float | None:
        c = self.cluster
        candidates = c.feasible(pod) & (self.modes <= FRESH)
        used_gpus = c.gpu_count - c.full_count
        return self._by_scheduler(pod, candidates, (used_gpus + pod.gpu_count, c.gpu_count, self.weights.gpu))

    def _whole_by_engine(self, pod: PodSpec) -> float | None:
        whole, idle = self.modes == WHOLE, self.modes == FRESH
        outcome = None
        if self.prefer is not None:
            outcome = place_whole(self.policy, self.cluster, pod, whole & self.prefer(pod), idle)
        if not isinstance(outcome, PodPlacement):
            outcome = place_whole(self.policy, self.cluster, pod, whole, idle)
        if not isinstance(outcome, PodPlacement):
            return None
        return self.place_at(pod, outcome.node, outcome.gpus)

    def place_at(self, pod: PodSpec, node: int, gpus: tuple[int, ...], replicas: int | None = None) -> float:
        """Commit ``pod`` (as the engine sees it) on ``node``: a replica of ``gpus[0]`` for a fractional pod
        (the node split into ``replicas`` first when given), else ``gpus`` whole (the node becomes a
        whole-GPU node) or none; the GPU milli it occupies."""
        if replicas is not None:
            self.modes[node] = replicas
        if pod.is_shared:
            return self._take_replica(pod, node, gpus[0])
        self.last_placement = self.cluster.place(pod, node, gpus)
        self.last_node, self.last_replica = node, False
        if pod.gpu_count == 0:
            return 0.0
        self.modes[node] = WHOLE
        return float(pod.gpu_total_milli)

    def _shared_by_engine(self, pod: PodSpec) -> float | None:
        if self.prefer is not None:
            taken = place_shared(_EngineSteps(self, pod, self.prefer(pod)), self.policy)
            if taken is not None:
                return taken
        return place_shared(_EngineSteps(self, pod), self.policy)

    def _replica_by_policy(self, pod: PodSpec, nodes: BoolArray) -> float:
        outcome = decide(self.cluster, pod, self.policy, nodes)
        assert isinstance(outcome, PodPlacement)
        return self._take_replica(pod, outcome.node, outcome.gpus[0])

    def _shared_by_scheduler(self, pod: PodSpec) -> float | None:
        c = self.cluster
        k = largest_replicas(pod.gpu_milli)
        feasible = c.feasible(pod)
        candidates = feasible & shared_candidates(self.modes, self.free_replicas(), k)
        if candidates.any():
            nodes = np.flatnonzero(self._scheduler_first(pod, candidates))
            node = self._scheduler_pick(
                pod, nodes, self.used[nodes].sum(axis=1) + 1, c.gpu_count[nodes] * self.modes[nodes], self.weights.gpu_shared
            )
        else:
            switched = switch_choice(feasible & (self.modes == FRESH), c.gpu_count, c.tie_rank)
            if switched is None:
                return None
            node = switched
            self.modes[node] = k
        # The device plugin hands out the first free replica.
        gpu = int(np.flatnonzero((self.used[node] < self.modes[node]) & c.gpu_present[node])[0])
        return self._take_replica(pod, node, gpu)

    def _take_replica(self, pod: PodSpec, node: int, gpu: int) -> float:
        c = self.cluster
        r = int(self.modes[node])
        self.used[node, gpu] += 1
        # The engine sees a replica-split GPU as 1000 milli of which (free replicas) * 1000 // r are free.
        taken = int(c.gpu_free[node, gpu] - (r - self.used[node, gpu]) * GPU_MILLI // r)
        self.last_placement = c.place(PodSpec(pod.name, pod.cpu_milli, pod.memory_mib, 1, taken), node, (gpu,))
        self.last_node, self.last_replica = node, True
        return replica_milli(r)

    # ------------------------------------------------------------------ summary
    def split(self, requested_milli: int, occupied_milli: float) -> CapacitySplit:
        c = self.cluster
        total = float(c.total_gpus * GPU_MILLI)
        free = c.gpu_free.sum(axis=1)
        shared_free = float(sum(self.free_replicas()[self.modes > 0] * GPU_MILLI / self.modes[self.modes > 0]))
        return CapacitySplit(
            requested=100.0 * requested_milli / total,
            replica_rounding=100.0 * (occupied_milli - requested_milli) / total,
            free_on_shared=100.0 * shared_free / total,
            free_on_whole=100.0 * float(free[self.modes == WHOLE].sum()) / total,
            free_on_fresh=100.0 * float(free[self.modes == FRESH].sum()) / total,
        )

    def node_modes(self) -> dict[str, int]:
        values, counts = np.unique(self.modes, return_counts=True)
        names = {FRESH: "fresh", WHOLE: "whole"}
        return {names.get(int(v), f"r{int(v)}"): int(n) for v, n in zip(values, counts)}


class _EngineSteps:
    """The product model's steps of ``shared_sequence.place_shared`` for one pod: its masks over the
    model's arrays. It sees no backlog, so a split is sized for the pod alone, and it has no
    capacity in flight (a split takes effect at once)."""

    def __init__(self, replay: ProductReplay, pod: PodSpec, among: BoolArray | None = None) -> None:
        """``among``: the nodes whose free replicas it may take (None: every node); an idle node may always be split."""
        self.replay = replay
        self.pod = pod
        # openb pods state no GPU memory: the memory half of the replica rule never binds.
        self.asks: tuple[Ask, ...] = ((pod.gpu_milli, None),)
        self.own_size = most_replicas(self.asks, 0)
        cluster = replay.cluster
        self.feasible = cluster.feasible(pod)
        self.candidates = self.feasible & shared_candidates(replay.modes, replay.free_replicas(), self.own_size)
        if among is not None:
            self.candidates &= among

    def replica(self, step: ReplicaStep) -> float | None:
        modes = self.replay.modes
        nodes = exact_replicas(self.candidates, modes, self.own_size) if step == EXACT else waste_first(self.candidates, modes)
        return self.replay._replica_by_policy(self.pod, nodes) if nodes.any() else None

    def coming(self) -> float | None:
        return None

    def idle_split(self, small_only: bool) -> int | None:
        replay = self.replay
        idle = self.feasible & (replay.modes == FRESH)
        return switch_for(replay.policy, replay.cluster, self.pod, idle, self.own_size, small_only=small_only)

    def split(self, choice: int) -> float:
        replay = self.replay
        cluster = replay.cluster
        replay.modes[choice] = replicas_for_demand([self.asks], gpus=int(cluster.gpu_count[choice]), gpu_memory_bytes=0)
        return replay._take_replica(self.pod, choice, replay.policy.choose_gpus(cluster, self.pod, choice)[0])


def scheduler_pick(
    cluster: ClusterState,
    pod: PodSpec,
    nodes: IntArray,
    weights: MostAllocatedWeights,
    gpu_req: IntArray | None = None,
    gpu_alloc: IntArray | None = None,
    gpu_weight: int = 0,
    ties: np.random.Generator | None = None,
) -> int:
    """kube-scheduler's choice among ``nodes`` (MostAllocated; ``gpu_*`` per node in ``nodes``,
    None for a pod that asks for no extended GPU resource); ties go to a node drawn uniformly by ``ties``
    (kube-scheduler's own rule) or, without it, to the lowest ``tie_rank``; a tied node ranked below 0
    wins either way.
    Every backend's model scores the pods gpupack does not place with it (CPU-only pods)."""
    c = cluster
    scores = most_allocated(
        c.cpu_total[nodes] - c.cpu_free[nodes] + pod.cpu_milli, c.cpu_total[nodes],
        c.mem_total[nodes] - c.mem_free[nodes] + pod.memory_mib, c.mem_total[nodes],
        gpu_req, gpu_alloc, gpu_weight, weights,
    )
    tied = nodes[scores == scores.max()]
    ranks = c.tie_rank[tied]
    if ties is None or tied.size == 1 or ranks.min() < 0:
        return int(tied[np.argmin(ranks)])
    return int(tied[ties.integers(tied.size)])


class PresentPods:
    """The ``present`` rule's typical pods: the GPU pods placed so far and the arriving one, as the
    engine sees them (:func:`engine_view`). Live, the controller builds its policy each cycle from
    the GPU pods that exist (``controller.planning.sharedplan.typical_pods``); a replay submits one pod at a
    time and deletes a pod never placed, so those are the placed ones and the one waiting."""

    def __init__(self, live_path: LivePath) -> None:
        self.live_path = live_path
        self._counts = TypicalCounts()

    def _view(self, pod: PodSpec) -> PodSpec:
        return engine_view([pod], self.live_path)[0]

    def placed(self, pod: PodSpec) -> None:
        if pod.gpu_count:
            self._counts.add(self._view(pod))

    def with_arriving(self, pods: Sequence[PodSpec]) -> TypicalPods:
        """The table with the arriving ``pods`` counted too (CPU-only pods add nothing)."""
        counts = self._counts.counts()
        for pod in pods:
            if pod.gpu_count:
                counts[self._view(pod).fgd_key] += 1
        return TypicalPods.from_counts(counts) if counts else TypicalPods.from_pods([NO_GPU_POD])


def as_whole(pod: PodSpec) -> PodSpec:
    """A fractional pod above half a GPU, as gpupack's webhook rewrites it: one whole GPU."""
    return replace(pod, gpu_milli=GPU_MILLI)


def engine_view(pods: Sequence[PodSpec], live_path: LivePath) -> list[PodSpec]:
    """The requests as the packing engine sees them (its typical pods): rewritten on the engine path."""
    if live_path != "engine":
        return list(pods)
    return [as_whole(p) if p.is_shared and takes_whole_gpu(p.gpu_milli) else p for p in pods]


def run_product(
    nodes: Sequence[NodeSpec],
    trace_pods: Sequence[PodSpec],
    policy_name: str,
    seed: int,
    weights: MostAllocatedWeights,
    live_path: LivePath = "engine",
    inflate: float = 1.3,
    clock: Clock = time.perf_counter_ns,
    policy_factory: Callable[[str, np.random.Generator, TypicalPods], Policy] | None = None,
    max_nodes: int | None = None,
    typical: TypicalRule = "present",
    follow: Sequence[str | None] | None = None,
    typical_every: int = DEFAULT_TYPICAL_EVERY,
    scheduler_draw: int = 0,
    stop_after: int | None = None,
    priorities: Mapping[str, PodPriority] | None = None,
    preemption: PreemptionMode = "none",
    scheduler_prefers: bool | None = None,
) -> ProductRun:
    """One (workload, seed, policy) run: the protocol's arrivals under the live rules, on the seed's
    sample of ``max_nodes`` nodes when given (``sharing.simulator.arrivals.plan_run``).

    ``typical``: what FGD and gpupack measure fragmentation against (module docstring, "Typical
    pods"): ``present``, the live controller's rule, or ``workload``, the FGD protocol's.
    ``typical_every``: under ``present``, the arrivals one planning cycle plans with one policy (the
    policy is rebuilt at the start of each batch, from the pods placed so far and the batch's GPU
    pods: a cycle sees every pod pending in it); 1 for a replay, which submits one pod at a time.
    ``scheduler_draw``: which of the seed's draws of kube-scheduler's random ties (0, 1, ...): the
    same arrivals and policy, another way its ties fall, as another live run of the same plan.

    ``follow``: a live run's outcome per pod in arrival order (the node name it was bound to, or
    None), to check the live system against the model. Before each pod the live node is ranked
    first among equals, for the engine and for kube-scheduler alike, so wherever the live choice
    is one the model's rules score best the model makes it too and the two runs stay in the same
    state; every pod placed otherwise is a :class:`Divergence` (then the states differ, and later
    pods are judged from the model's). A live run that follows the model's rules has none, and
    its allocation is the model's own.

    ``stop_after``: replay only the first ``stop_after`` arrivals, as a live run stopped early
    submitted them (``follow`` then has that many outcomes); the levels past them are None.

    ``policy_factory`` builds the engine's policy instead of the registry (an
    ablation, as ``benchmarks/product_ablation.py`` runs); ``policy_name`` still
    names the registered policy the run reports.

    ``priorities``: each trace pod's priority by name (clones take their pod's), for figures per
    class; ``preemption`` (``engine`` or ``scheduler``, with ``priorities``) lets a pod that fits
    nowhere preempt pods of lower priority (``sharing.simulator.preempting``); ``none``, the
    default, is the protocol's run, bit for bit. With priorities, ``scheduler_prefers`` says whether
    kube-scheduler places by gpupack's prioritize extender (:meth:`ProductReplay._scheduler_first`);
    None: as ``manifests/scheduler/kube-scheduler-config.yaml`` configures it
    (``sharing.simulator.scheduler_config.load_priority_extender``)."""
    name = canonical_policy_name(policy_name)
    check_typical_rule(typical)
    if typical_every < 1:
        raise ValueError(f"typical_every must be at least 1, got {typical_every}")
    refuse_mig_capable(nodes, "the product model replays MPS sharing only")
    plan = plan_run(nodes, trace_pods, seed, inflate, max_nodes)
    ordered = plan.by_name
    total_gpus = plan.gpus
    workload = plan.workload
    if stop_after is not None and not 1 <= stop_after <= len(workload.pods):
        raise ValueError(f"stop_after must be between 1 and the plan's {len(workload.pods)} arrivals, got {stop_after}")
    arrivals = workload.pods if stop_after is None else workload.pods[:stop_after]
    present = PresentPods(live_path)
    table = TypicalPods.from_pods(engine_view(workload.originals, live_path)) if typical == "workload" else None

    def build(table: TypicalPods) -> Policy:
        return make_policy(name, rng=stream, typical=table) if policy_factory is None else policy_factory(name, stream, table)

    # The engine's ties go to the first node by name, as the live controller's do; kube-scheduler's
    # fall at random, as it samples among equal scores, from a generator of the seed's own.
    cluster = ClusterState(ordered)
    rng = np.random.default_rng(seed)
    stream = _continue_stream(rng, workload)
    current: TypicalPods | None = None
    if table is None:
        current = present.with_arriving(arrivals[:typical_every])
        policy = build(current)
    else:
        policy = build(table)
    replay = ProductReplay(cluster, policy, weights, live_path,
                           scheduler_ties=np.random.default_rng([seed, SCHEDULER_TIES_STREAM, scheduler_draw]))
    count = len(arrivals)
    tally = ArrivalTally(count)
    if follow is not None and len(follow) != count:
        raise ValueError(f"follow: {len(follow)} outcomes for {count} pods")
    if preemption != "none" and priorities is None:
        raise ValueError(f"preemption {preemption!r} needs the pods' priorities")
    classes = None if priorities is None else Preempting(replay, priorities, preemption, arrivals, seed)
    if classes is not None and preemption != "none":
        replay.prefer = classes.unmixed
        extender = load_priority_extender() if scheduler_prefers is None else scheduler_prefers
        if extender:
            replay.scheduler_prefer = classes.no_lower
    position = {n.name: i for i, n in enumerate(ordered)}
    by_name = cluster.tie_rank.copy()
    divergences: list[Divergence] = []
    for i, pod in enumerate(arrivals):
        live_node = None if follow is None else follow[i]
        if follow is not None:
            cluster.tie_rank[:] = by_name
            if live_node is not None:
                if live_node not in position:
                    raise ValueError(f"follow: pod {pod.name} was bound to {live_node!r}, not a node of the run")
                cluster.tie_rank[position[live_node]] = -1  # first among equals, for the engine and kube-scheduler
        start = clock()
        if current is not None and i % typical_every == 0 and any(p.gpu_count for p in arrivals[i:i + typical_every]):
            now = present.with_arriving(arrivals[i:i + typical_every])
            if not same_table(now, current):
                # Live, the policy is built anew each planning cycle from the pods that exist.
                current = now
                replay.policy = build(now)
        taken = replay.place(pod)
        if taken is None and classes is not None:
            taken = classes.make_room(pod, engine_view([pod], live_path)[0], tally)
        tally.record(i, pod, taken, clock() - start)
        if classes is not None:
            classes.record(i, pod, taken)
        if follow is not None:
            model_node = None if replay.last_node is None else ordered[replay.last_node].name
            if model_node != live_node:
                divergences.append(Divergence(i, pod.name, live_node, model_node))
        if taken is not None:
            present.placed(pod)
    return ProductRun(
        policy=name,
        live_path=live_path,
        seed=seed,
        pods=count,
        split=replay.split(tally.allocated, tally.reserved),
        node_modes=replay.node_modes(),
        divergences=tuple(divergences),
        priority=None if classes is None else classes.figures(tally, total_gpus),
        **tally.figures(total_gpus),
    )

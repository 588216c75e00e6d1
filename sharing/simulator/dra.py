"""The product model for the DRA backend: a trace replayed under the rules of consumable capacity.

``gpupack simulate --model product --backend dra`` (the device-plugin backend's
rules are ``sharing.simulator.product``). On a DRA node pool gpupack's driver
publishes one device per GPU with ``allowMultipleAllocations`` and a ``milli``
capacity whose request policy has a step (``share_unit``, 50 milli by
default); the packing engine steers the allocator, so it chooses node and GPU
(docs/simulator.md, "The DRA backend"):

- **Exact shares, rounded to the request policy's step.** A fractional pod of
  ``m`` milli claims ``ceil(m / unit) * unit`` milli of one GPU (``claimed_milli``),
  on any GPU with that much capacity left: no node-wide ``r``, no split
  between shared and whole-GPU nodes, and pods above half a GPU share too (a
  600 and a 400 fit one GPU). A share rounded up to 1000 claims the whole GPU.
- **Whole GPUs.** A whole-GPU pod (1000 milli per GPU, one or several GPUs)
  claims GPUs with no share on them; a GPU taken whole takes no share.
- **Who places what.** Every GPU pod is placed by the packing engine
  (``--policy``), with the same replay machinery as the FGD protocol
  (``sharing.packing.policy.schedule``): the difference to that protocol is
  the rounding, and who places CPU-only pods (below). The pod the engine places, and the typical pods its
  scorers measure fragmentation against, carry the rounded share, so FGD's
  and gpupack's scores see what a GPU will really hold.
- **CPU-only pods** ask gpupack for nothing: live, kube-scheduler places them
  (``cpu_pods="scheduler"``, the default), scored as in the device-plugin
  model (``sharing.simulator.product.scheduler_pick``, the weights
  ``manifests/`` ships). ``cpu_pods="engine"`` gives them to the engine's
  policy as the FGD protocol does: what gpupack would reach if it steered
  them too (the issue's measurement of per-pod shares assumed it). With
  ``share_unit=1``, ``cpu_pods="engine"`` and ``typical="workload"`` the
  model is the FGD protocol.
- **kube-scheduler unguided** (``gpu_pods="scheduler"``): what the same
  slices give without gpupack's pins, the baseline the engine must beat.
  kube-scheduler filters the nodes on which the claim can be allocated
  (``ClusterState.feasible``: CPU, memory, the product a ``gpu_spec`` asks
  for, a device with the share's capacity left or enough untouched devices
  for whole GPUs), scores them as it scores every pod
  (``scheduler_pick``: MostAllocated on CPU and memory with the weights
  ``manifests/`` ships; the DynamicResources plugin adds no score), and its
  DRA allocator takes the **first** devices on that node that fit, in the
  order the slice lists them: GPU 0 first (``first_fit_gpus``). CPU-only
  pods are kube-scheduler's too, and no typical pods are read.
- **Typical pods.** FGD and gpupack measure fragmentation against typical
  pods (``sharing.packing.typical``). ``typical="present"`` (the default) is
  the live controller's rule (``controller.planning.draplan`` builds them, every
  planning cycle, from the DRA GPU pods that exist: placed and pending, each
  pod's first claimed share, no CPU-only pod): here the GPU pods arrived so
  far and the arriving one, as claimed (the protocol's pods never leave, and
  a dropped pod stays pending live, so it counts too). The policy is rebuilt
  only when the table (its keys and probabilities) changes, which is nearly
  every GPU pod, and gpupack's rebuild solves its LP of packing prices again
  (``sharing.packing.dual_prices``); so ``typical_every=K`` (default
  ``DEFAULT_TYPICAL_EVERY``) rebuilds it at most once per K arrivals, from
  every GPU pod up to the end of that batch. That is the controller's
  batching: it plans all the pods pending in a cycle with one policy built
  from all of them, so K is the pods that arrive per planning cycle
  (``typical_every=1``: one pod per cycle, as at openb's own pace and in the
  demo's agreement runs; docs/simulator.md, "The DRA backend", says what K
  changes). ``typical="workload"`` is the FGD protocol's rule: the whole
  run's pods, known in advance.
- **openb's GPUs** map onto products as in every openb replay
  (``mig.openb_gpus``); none is MIG-capable, so MIG
  placements (partitionable devices) are not exercised by this model, and a
  node list with a MIG-capable type is refused. openb pods state no GPU
  memory, so the device's memory capacity never binds.

The protocol's other rules hold: the same seeded arrivals as every other model
(``sharing.simulator.arrivals.plan_run``), pods never leave, a pod that
fits nowhere is dropped, allocation counts the milli pods asked for and
``occupied`` what their claims reserve.

The step lives here until the DRA driver's request policy has one reading the
simulator can call; the rule is the API's (``CapacityRequestPolicyRange``): a
capacity request is rounded up to the next ``min + n * step``, here with
``min = step = share_unit``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

import numpy as np

from sharing.dra.model import DraModelError
from sharing.dra.share_policy import DEFAULT_MILLI_STEP, SharePolicy
from sharing.packing.cluster import BoolArray, ClusterState
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.policy import Policy, schedule
from sharing.packing.registry import canonical_policy_name, make_policy
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodPlacement, PodSpec, Refusal
from sharing.packing.typical import TYPICAL_RULES as TYPICAL_RULES  # re-exported: the simulator's CLI reads it here
from sharing.packing.typical import TypicalRule as TypicalRule
from sharing.packing.typical import NO_GPU_POD as NO_GPU_POD  # re-exported: its tests read it here
from sharing.packing.typical import TypicalCounts, TypicalPods, check_typical_rule, same_table
from sharing.simulator.product import DEFAULT_TYPICAL_EVERY as DEFAULT_TYPICAL_EVERY  # one batch rule, re-exported
from sharing.simulator.product import scheduler_pick
from sharing.simulator.replay import Clock, _continue_stream
from sharing.simulator.arrivals import plan_run, refuse_mig_capable
from sharing.simulator.tally import ArrivalTally

CpuPods = Literal["scheduler", "engine"]
CPU_PODS: Final[tuple[CpuPods, ...]] = ("scheduler", "engine")

GpuPods = Literal["engine", "scheduler"]
GPU_PODS: Final[tuple[GpuPods, ...]] = ("engine", "scheduler")
"""Who chooses a GPU pod's node and devices: gpupack's engine, its choice pinned in the claim
(the product), or kube-scheduler unguided (``gpu_pods="scheduler"``: no pins, the module docstring)."""



TYPICAL_POLICIES: Final = ("FGD", "gpupack")
"""The policies that read typical pods (``sharing.packing.registry.make_policy``); the others
are never rebuilt."""

DEFAULT_SHARE_UNIT: Final = DEFAULT_MILLI_STEP
"""The ``milli`` capacity's request-policy step, in milli of a GPU: the one the DRA device
model publishes (``sharing.dra.share_policy``)."""


def check_share_unit(unit: int, name: str = "the share unit") -> int:
    """``unit`` when the DRA device model can publish it as its request-policy step
    (``sharing.dra.share_policy.SharePolicy``: divides 1000, at most 500); ValueError saying
    which rule ``name`` breaks otherwise."""
    try:
        SharePolicy(milli_step=unit)
    except DraModelError as exc:
        raise ValueError(str(exc).replace("the share unit", name, 1)) from None
    return unit


def claimed_milli(milli: int, unit: int) -> int:
    """What a claim for ``milli`` of a GPU reserves: the request policy's rounding (the API's)."""
    return SharePolicy(milli_step=unit).consumed_milli(milli)


def as_claimed(pod: PodSpec, unit: int) -> PodSpec:
    """``pod`` as its claim reserves it: a fractional share rounded up to ``unit``; others unchanged."""
    if not pod.is_shared:
        return pod
    return replace(pod, gpu_milli=claimed_milli(pod.gpu_milli, unit))


@dataclass(frozen=True)
class DraCapacitySplit:
    """Where a run's GPU capacity went at its end, in percent of all GPU milli (sums to 100)."""

    requested: float
    """Milli the placed pods asked for (the allocation figure)."""
    share_rounding: float
    """Reserved beyond the ask: shares rounded up to the request policy's step."""
    free_on_shared_gpus: float
    """Capacity left on GPUs that hold shares (no arriving pod fitted it, or its node's CPU or memory)."""
    free_gpus: float
    """GPUs with nothing on them (their node's CPU or memory taken, a GPU type no pod asked for, or nothing fitted)."""


@dataclass(frozen=True)
class DraRun:
    """One seed's run under the DRA backend's rules."""

    policy: str
    seed: int
    share_unit: int
    cpu_pods: CpuPods
    pods: int
    failed_pods: int
    alloc_at: dict[int, float | None]
    occupied_at: dict[int, float | None]
    decision_us_median: float
    final_alloc_percent: float
    split: DraCapacitySplit
    gpu_modes: dict[str, int]
    """GPUs per final state: ``shared`` (holds shares), ``whole`` (claimed whole), ``idle``."""
    typical: TypicalRule
    typical_every: int
    """Arrivals per rebuild at most under ``present`` (1: before every pod whose arrival changes the table)."""
    policy_builds: int
    """Policies built in the run (1 under ``workload`` and for policies that read no typical pods)."""
    gpu_pods: GpuPods = "engine"


class PresentTypical:
    """The live controller's typical pods as a run's pods arrive (``typical="present"``).

    ``advance(i)`` before arrival ``i``: at the start of each batch of ``every``
    arrivals it counts the batch's pods the engine places, GPU pods as claimed,
    and says whether the table changed; ``table`` is then the typical pods of
    every such pod up to the batch's end (``NO_GPU_POD`` while there is none).

    The pods the engine places are its GPU pods and, with ``cpu_pods="engine"``,
    the pods that ask for no GPU as well: live, the controller places those (labelled
    ``gpupack.io/backend=dra``) and counts them among its typical pods
    (``controller.planning.draplan``), as the FGD protocol's table counts every pod. Left
    out, the scores ignore what CPU the CPU-only pods will want, which cost
    gpupack 0.6 and 0.9 points on default and cpu200 (seed 42, docs/simulator.md).
    """

    def __init__(self, pods: Sequence[PodSpec], share_unit: int, every: int = 1,
                 cpu_pods: CpuPods = "scheduler") -> None:
        if every < 1:
            raise ValueError(f"typical_every must be at least 1, got {every}")
        self._pods = pods
        self._unit = share_unit
        self._count_cpu_pods = cpu_pods == "engine"
        self.every = every
        self._counts = TypicalCounts()
        self._counted = 0
        self.table = TypicalPods.from_pods([NO_GPU_POD])

    def advance(self, i: int) -> bool:
        if i < self._counted:
            return False
        end = min(len(self._pods), (i // self.every + 1) * self.every)
        for pod in self._pods[self._counted:end]:
            if pod.gpu_count or self._count_cpu_pods:
                self._counts.add(as_claimed(pod, self._unit))
        self._counted = end
        if not len(self._counts):
            return False
        table = self._counts.table()
        if same_table(table, self.table):
            return False
        self.table = table
        return True


def first_fit_gpus(cluster: ClusterState, claim: PodSpec, node: int) -> tuple[int, ...]:
    """The devices kube-scheduler's DRA allocator gives ``claim`` on ``node`` unguided: the first
    that fit in the slice's order (GPU 0 first): a share takes the first GPU with its capacity
    left, a whole-GPU claim the first untouched GPUs. ValueError if they are not there."""
    free = cluster.gpu_free[node, : cluster.gpu_count[node]]
    fits = np.flatnonzero(free == GPU_MILLI) if claim.is_whole else np.flatnonzero(free >= claim.gpu_milli)
    need = claim.gpu_count
    if fits.size < need:
        raise ValueError(f"node {cluster.nodes[node].name!r} has no room for {claim.name!r}")
    return tuple(int(g) for g in fits[:need])


class DraReplay:
    """The cluster under consumable capacity, one pod at a time."""

    def __init__(
        self,
        cluster: ClusterState,
        policy: Policy,
        weights: MostAllocatedWeights,
        share_unit: int,
        cpu_pods: CpuPods = "scheduler",
        gpu_pods: GpuPods = "engine",
    ) -> None:
        if cpu_pods not in CPU_PODS:
            raise ValueError(f"unknown placement of CPU-only pods {cpu_pods!r}; choose one of {', '.join(CPU_PODS)}")
        if gpu_pods not in GPU_PODS:
            raise ValueError(f"unknown placement of GPU pods {gpu_pods!r}; choose one of {', '.join(GPU_PODS)}")
        if gpu_pods == "scheduler" and cpu_pods == "engine":
            raise ValueError("CPU-only pods cannot be the engine's when kube-scheduler places the GPU pods unguided")
        self.cpu_pods = cpu_pods
        self.gpu_pods = gpu_pods
        self.cluster = cluster
        self.policy = policy
        self.weights = weights
        self.share_unit = check_share_unit(share_unit)
        self.whole: BoolArray = np.zeros(cluster.gpu_free.shape, dtype=bool)
        """GPUs claimed whole (a claim of all of a device's capacity)."""

    def place(self, pod: PodSpec) -> int | None:
        """Place ``pod`` as the DRA path would; the GPU milli its claim reserves, or None (dropped)."""
        c = self.cluster
        if pod.gpu_count == 0 and self.cpu_pods == "scheduler":
            node = self._scheduler_node(pod)
            if node is None:
                return None
            c.place(pod, node, ())
            return 0
        claim = as_claimed(pod, self.share_unit)
        if self.gpu_pods == "scheduler":
            node = self._scheduler_node(claim)
            if node is None:
                return None
            outcome: PodPlacement | Refusal = c.place(claim, node, first_fit_gpus(c, claim, node))
        else:
            outcome = schedule(c, claim, self.policy)
        if not isinstance(outcome, PodPlacement):
            return None
        if claim.is_whole:
            self.whole[outcome.node, list(outcome.gpus)] = True
        return claim.gpu_total_milli

    def _scheduler_node(self, pod: PodSpec) -> int | None:
        """kube-scheduler's node for ``pod``: its filter, then its MostAllocated score; None if no node passes."""
        nodes = np.flatnonzero(self.cluster.feasible(pod))
        return None if nodes.size == 0 else scheduler_pick(self.cluster, pod, nodes, self.weights)

    def _shared_gpus(self) -> BoolArray:
        c = self.cluster
        out: BoolArray = c.gpu_present & (c.gpu_free < GPU_MILLI) & ~self.whole
        return out

    def split(self, requested_milli: int, occupied_milli: float) -> DraCapacitySplit:
        c = self.cluster
        total = float(c.total_gpus * GPU_MILLI)
        idle = c.gpu_present & (c.gpu_free == GPU_MILLI)
        return DraCapacitySplit(
            requested=100.0 * requested_milli / total,
            share_rounding=100.0 * (occupied_milli - requested_milli) / total,
            free_on_shared_gpus=100.0 * float(c.gpu_free[self._shared_gpus()].sum()) / total,
            free_gpus=100.0 * float(c.gpu_free[idle].sum()) / total,
        )

    def gpu_modes(self) -> dict[str, int]:
        c = self.cluster
        return {
            "shared": int(self._shared_gpus().sum()),
            "whole": int(self.whole.sum()),
            "idle": int((c.gpu_present & (c.gpu_free == GPU_MILLI)).sum()),
        }


def run_dra(
    nodes: Sequence[NodeSpec],
    trace_pods: Sequence[PodSpec],
    policy_name: str,
    seed: int,
    weights: MostAllocatedWeights,
    share_unit: int = DEFAULT_SHARE_UNIT,
    cpu_pods: CpuPods = "scheduler",
    inflate: float = 1.3,
    clock: Clock = time.perf_counter_ns,
    typical: TypicalRule = "present",
    typical_every: int = DEFAULT_TYPICAL_EVERY,
    max_nodes: int | None = None,
    gpu_pods: GpuPods = "engine",
) -> DraRun:
    """One (workload, seed, policy) run: the protocol's arrivals under the DRA backend's rules,
    FGD and gpupack measuring fragmentation against the ``typical`` rule's pods (module docstring),
    on the seed's sample of ``max_nodes`` nodes when given (``sharing.simulator.arrivals.plan_run``)."""
    name = canonical_policy_name(policy_name)
    check_share_unit(share_unit)
    check_typical_rule(typical)
    refuse_mig_capable(nodes, "the DRA model replays consumable-capacity shares only, not MIG placements")
    plan = plan_run(nodes, trace_pods, seed, inflate, max_nodes)
    ordered = plan.by_name
    total_gpus = plan.gpus
    workload = plan.workload
    # The scorers measure fragmentation against what the typical pods' claims reserve.
    present = PresentTypical(workload.pods, share_unit, typical_every, cpu_pods)
    if typical == "workload":
        table = TypicalPods.from_pods([as_claimed(p, share_unit) for p in workload.originals])
    else:
        table = present.table
    tracked = typical == "present" and name in TYPICAL_POLICIES and gpu_pods == "engine"
    cluster = ClusterState(ordered, tie_rank=workload.tie_rank)
    rng = _continue_stream(np.random.default_rng(seed), workload)
    # Unguided no engine policy is consulted: BestFit (no typical pods, no prices to solve) stands in.
    engine = make_policy(name if gpu_pods == "engine" else "BestFit", rng=rng, typical=table)
    replay = DraReplay(cluster, engine, weights, share_unit, cpu_pods, gpu_pods)
    builds = 1
    count = len(workload.pods)
    tally = ArrivalTally(count)
    for i, pod in enumerate(workload.pods):
        start = clock()
        if tracked and present.advance(i):
            # Live, the policy is built anew each planning cycle; its cost is part of the decision.
            replay.policy = make_policy(name, rng=rng, typical=present.table)
            builds += 1
        taken = replay.place(pod)
        tally.record(i, pod, taken, clock() - start)
    return DraRun(
        policy=name,
        seed=seed,
        share_unit=share_unit,
        cpu_pods=cpu_pods,
        pods=count,
        split=replay.split(tally.allocated, tally.reserved),
        gpu_modes=replay.gpu_modes(),
        typical=typical,
        typical_every=typical_every,
        policy_builds=builds,
        gpu_pods=gpu_pods,
        **tally.figures(total_gpus),
    )

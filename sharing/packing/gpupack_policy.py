"""gpupack's own node and GPU choice: FGD's fragmentation gradient, plus what packing is worth.

gpupack keeps FGD's model of the workload (the typical-pod distribution, which an
online scheduler may know) and FGD's integer node score
``trunc(100 * sigmoid(x / 1000))`` with ties to the node rank, and changes three
things (measurements and every variant tried: docs/simulator.md):

1. **Regret of the packing prices.** FGD asks, one typical pod at a time, whether
   a gap is too small for it; it does not see that a 210-milli gap left beside a
   470 is worth less than a 360 gap beside a 320, where a third 320 still fits.
   The dual of the LP that packs the typical pods' fractional sizes onto GPUs
   prices each size in GPU shares (about 1/2 for 470, 1/3 for 320, 2/3 for 650,
   a whole GPU for 810) and values every gap by the best set of sizes that fits
   in it (``sharing.packing.dual_prices``). Putting a pod of size ``s`` in a gap
   ``h`` regrets ``value[h] - price(s) - value[h - s]``, the part of the gap's
   worth the placement throws away; it is 0 for placements that follow an
   optimal packing pattern. For a fractional pod each device's regret, times
   ``v`` (= 10) GPU milli, is subtracted from FGD's exact change ``dF`` before the
   sigmoid, so a placement without regret beats one with, and FGD's gradient
   chooses among equals.
2. **CPU stranding.** FGD asks whether each typical pod fits a node, but it does
   not see GPU capacity that will be stranded because the node's CPU runs out
   first. With ``r`` the typical pods' CPU milli per GPU milli, a node's
   stranded GPU is ``S = max(0, G - C / r)`` (free GPU milli ``G`` that the free
   CPU ``C`` cannot feed at the workload's usual ratio); a fractional pod's
   argument also loses ``w * max(dS, 0)`` (``w`` = 8). Only growth is penalised,
   and only for fractional pods: applying it to whole-GPU pods, or rewarding a
   shrinking ``S``, pushed small pods onto the empty nodes that 8-GPU pods need.
3. **GPU choice inside the node.** Among the devices with the best score (with
   the regret, as for the node), the one with the least free milli, so whole
   GPUs stay whole for whole-GPU and multi-GPU pods. (FGD takes the lowest index.)

4. **Which idle node becomes shared** (the product model and the live
   controller, where GPUs are split into node-wide replicas:
   ``sharing.packing.node_sharing``): among the nodes whose CPU can feed
   their replicas at the typical shared pod's CPU (the typical pods carry no
   memory figure), then the fewest GPUs, the one the score above prefers
   for the pod; a replica no pod can be given CPU for is capacity lost.
5. **Where whole-GPU pods go** under node-wide replicas: to a whole-GPU node
   already in use when one fits, and else to the idle node whose leftover
   CPU could feed the fewest replicas (``node_sharing.least_feedable``), so
   the idle nodes that sharing needs stay idle. Among those nodes FGD's score
   decides, measured against the typical pods a whole-GPU node can take
   (shared pods never go there). FGD and BestFit take the best-scored node
   among all of them.
6. **A replica of the pod's own size before a larger one**: a pod fitting
   ``k`` replicas takes a replica of a node split into exactly ``k``; when none
   has room the idle node item 4 prefers is split into ``k`` if that split is
   small (at most 16 replicas on the node: ``node_sharing.small_splits``), and
   only otherwise does it take a larger replica (the smallest), or, when there
   is none, split a node however large. FGD and BestFit take the smallest free
   replica first and split only when there is none.

Otherwise whole-GPU and CPU-only pods are scored exactly as FGD scores them. The policy
uses nothing an online scheduler would not know at decision time (the cluster
state and the request distribution) and never refuses a pod that fits.
"""

from __future__ import annotations

import numpy as np

from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.dual_prices import DualPrices
from sharing.packing.fgd import FgdPolicy, fragmentation_delta
from sharing.packing.fragmentation import FloatArray, fgd_score
from sharing.packing.specs import GPU_MILLI, PodPlacement, PodSpec, Refusal
from sharing.packing.node_sharing import least_feedable, most_feedable, small_splits
from sharing.packing.policy import decide
from sharing.packing.state_cache import RequestKey, StateCache
from sharing.packing.typical import TypicalPods
from sharing.rules.replicas import largest_replicas

STRANDING_WEIGHT = 8.0
"""Milli of fragmentation one milli of newly stranded GPU counts as (w above).

Chosen on the openb traces among 0.5..16 (docs/simulator.md): with the regret
term, 8 and 12 do about equally well; 2 loses 0.07 points on multigpu40."""

REGRET_WEIGHT = 10.0
"""Milli of fragmentation one milli of regretted GPU share counts as (v above).

At 10 even a small regret (1/12 of a GPU: 833 milli) outweighs nearly any
difference in ``dF``, so the regret decides first and FGD's gradient among
equals. Chosen on the openb traces among 0.1..50 (docs/simulator.md): 10, 20 and
50 give the same allocation; 0.1-4 gain less."""


def _cpu_per_gpu_milli(typical: TypicalPods) -> float:
    cpu = np.asarray(typical.cpu_milli, dtype=np.float64)
    milli = np.asarray(typical.gpu_milli, dtype=np.float64)
    count = np.maximum(np.asarray(typical.gpu_count, dtype=np.float64), 1.0)
    p = np.asarray(typical.probability, dtype=np.float64)
    gpu_pods = milli > 0
    gpu_milli = float((p * milli * count * gpu_pods).sum())
    cpu_milli = float((p * cpu * gpu_pods).sum())
    return cpu_milli / gpu_milli if gpu_milli > 0 and cpu_milli > 0 else 0.0


def _typical_shared_pod(typical: TypicalPods) -> tuple[float, float]:
    """Mean CPU milli and mean GPU milli of the typical pods that share a GPU (at most half of one)."""
    weight = cpu = gpu = 0.0
    for p, milli, count, c in zip(typical.probability, typical.gpu_milli, typical.gpu_count, typical.cpu_milli):
        if count == 1 and 0 < 2 * milli <= GPU_MILLI:
            weight += p
            cpu += p * c
            gpu += p * milli
    return (cpu / weight, gpu / weight) if weight > 0 else (0.0, GPU_MILLI / 2)


class GpupackPolicy(FgdPolicy):
    """FGD's score with a CPU-stranding penalty, and the tightest-GPU device choice."""

    name = "gpupack"
    splits_before_wasting = True
    """Under node-wide replicas, split an idle node into the pod's own replica size before
    using a larger replica (``node_sharing``, rule 2; item 6 above)."""
    stranding_weight = STRANDING_WEIGHT
    regret_weight = REGRET_WEIGHT

    def __init__(self, typical: TypicalPods) -> None:
        super().__init__(typical)
        # Fixed for the run (it depends only on the typical pods), and read on
        # every node evaluation: computed once here.
        self._cpu_per_gpu_milli = _cpu_per_gpu_milli(typical)
        self.prices = DualPrices.from_typical(typical)
        self._shared_cpu, shared_milli = _typical_shared_pod(typical)
        self._shared_replicas = largest_replicas(max(1, round(shared_milli)))
        # Whole-GPU pods are scored as FGD scores them, against the typical pods
        # a whole-GPU node can take (item 5).
        self._whole_scorer = FgdPolicy(typical.without_shared())

    def cpu_per_gpu_milli(self) -> float:
        """The typical GPU pods' CPU milli per GPU milli (about 10 on openb)."""
        return self._cpu_per_gpu_milli

    def _evaluate(self, cache: StateCache, sids: IntArray, key: RequestKey) -> FloatArray:
        delta = fragmentation_delta(self.model, cache.cpu[sids], cache.free[sids], cache.model[sids], cache.base[sids], key)
        pod_cpu, milli, count = key
        if count == 1 and 0 < milli < GPU_MILLI:  # both terms apply to fractional pods only
            ratio = self._cpu_per_gpu_milli
            if ratio > 0:
                cpu = cache.cpu[sids].astype(np.float64)
                gpu = cache.free[sids].sum(axis=1).astype(np.float64)
                before = np.maximum(0.0, gpu - cpu / ratio)
                after = np.maximum(0.0, gpu - milli - (cpu - pod_cpu) / ratio)
                growth = np.maximum(after - before, 0.0)
                delta = np.where(np.isneginf(delta), -np.inf, delta - self.stranding_weight * growth[:, None])
            delta = delta - self._regret_milli(cache.free[sids], milli)
        score: FloatArray = fgd_score(delta).max(axis=1).astype(np.float64)
        return score

    def device_deltas(self, cluster: ClusterState, pod: PodSpec, node: int) -> FloatArray:
        """FGD's per-device change, less the regret of each device's gap (the stranding term
        is the same for every device of a node, so it cannot change the device)."""
        delta = super().device_deltas(cluster, pod, node)
        adjusted: FloatArray = delta - self._regret_milli(cluster.gpu_free[node], pod.gpu_milli)
        return adjusted

    def _regret_milli(self, free: IntArray, milli: int) -> FloatArray:
        # inf where the pod does not fit (where the delta is already -inf); kept
        # apart from the weight so that a weight of 0 never makes 0 * inf = nan.
        regret = self.prices.regret(free, milli)
        missing = np.isinf(regret)
        weighted: FloatArray = np.where(missing, np.inf, self.regret_weight * GPU_MILLI * np.where(missing, 0.0, regret))
        return weighted

    def switch_choice(
        self, cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: int | IntArray,
        small_only: bool = False,
    ) -> int | None:
        """The idle node to split into ``replicas``: among those that strand the fewest replicas
        (then the fewest GPUs), the one the score prefers for ``pod``; with ``small_only``, only
        if those are small splits (a split whose CPU would strand replicas is no better than a
        larger replica)."""
        nodes = most_feedable(cluster, candidates, replicas, self._shared_cpu)
        if small_only:
            nodes = small_splits(nodes, cluster.gpu_count, replicas)
        outcome = decide(cluster, pod, self, nodes)
        return outcome.node if isinstance(outcome, PodPlacement) else None

    def place_whole(self, cluster: ClusterState, pod: PodSpec, in_use: BoolArray, idle: BoolArray) -> PodPlacement | Refusal:
        """A whole-GPU pod: on a whole-GPU node in use if one fits, else on the idle node that
        sharing would use worst; FGD's score against the non-shared typical pods chooses among them."""
        outcome = decide(cluster, pod, self._whole_scorer, in_use)
        if isinstance(outcome, PodPlacement):
            return outcome
        worst_fed = least_feedable(cluster, pod, idle & cluster.feasible(pod), self._shared_replicas, self._shared_cpu)
        return decide(cluster, pod, self._whole_scorer, worst_fed)

    def best_device(self, scores: IntArray, free: IntArray) -> int:
        """Among the devices with the best score, the one with the least free milli."""
        candidates = np.flatnonzero(scores == scores.max())
        return int(candidates[np.argmin(free[candidates])])

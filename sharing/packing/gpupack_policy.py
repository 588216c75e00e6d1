"""gpupack's own node and GPU choice: FGD's fragmentation gradient, plus CPU stranding.

gpupack keeps FGD's model of the workload (the typical-pod distribution, which an
online scheduler may know) and FGD's integer node score
``trunc(100 * sigmoid(x / 1000))`` with ties to the node rank, and changes two
things (measurements and every variant tried: docs/simulator.md):

1. **CPU stranding.** FGD asks whether each typical pod fits a node, but it does
   not see GPU capacity that will be stranded because the node's CPU runs out
   first. With ``r`` the typical pods' CPU milli per GPU milli, a node's
   stranded GPU is ``S = max(0, G - C / r)`` (free GPU milli ``G`` that the free
   CPU ``C`` cannot feed at the workload's usual ratio). For a fractional pod the
   score's argument is ``dF - w * max(dS, 0)``: FGD's exact fragmentation change
   minus ``w`` times the stranding the placement adds (``w`` = 4). Only growth is
   penalised, and only for fractional pods: applying it to whole-GPU pods, or
   rewarding a shrinking ``S``, pushed small pods onto the empty nodes that
   8-GPU pods need and cost up to 0.9 points at mid demand on multigpu40.
2. **GPU choice inside the node.** FGD takes the lowest-indexed device among
   those with the best (truncated) score, which often opens a fully free GPU
   next to a partly used one that scores the same; gpupack takes, among the
   best-scoring devices, the one with the least free milli, so whole GPUs stay
   whole for whole-GPU and multi-GPU pods. (The stranding term depends on the
   node's totals only, so it does not change which device is best.)

It uses nothing an online scheduler would not know at decision time: the
cluster state and the request distribution. It never refuses a pod that fits.
"""

from __future__ import annotations

import numpy as np

from sharing.packing.cluster import ClusterState, IntArray
from sharing.packing.dual_prices import DualPrices
from sharing.packing.fgd import FgdPolicy, fragmentation_delta
from sharing.packing.fragmentation import FloatArray, fgd_score
from sharing.packing.model import GPU_MILLI, PodSpec
from sharing.packing.state_cache import RequestKey, StateCache
from sharing.packing.typical import TypicalPods

STRANDING_WEIGHT = 8.0
"""Milli of fragmentation one milli of newly stranded GPU counts as (w above).

Chosen on the openb traces among 0.5..8 (docs/simulator.md); 4 was the best
setting that never fell below FGD by more than 0.05 points at any demand level."""


REGRET_WEIGHT = 10.0
"""Milli of fragmentation per milli of regretted GPU share (a regret of 1/6 GPU = 1,667 milli
of dF at 10): large enough that a placement with no regret always wins over one with,
and FGD's gradient (with the stranding term) chooses among the regret-free ones.
Chosen on the openb traces among 0.1..50 (docs/simulator.md)."""


def _cpu_per_gpu_milli(typical: TypicalPods) -> float:
    cpu = np.asarray(typical.cpu_milli, dtype=np.float64)
    milli = np.asarray(typical.gpu_milli, dtype=np.float64)
    count = np.maximum(np.asarray(typical.gpu_count, dtype=np.float64), 1.0)
    p = np.asarray(typical.probability, dtype=np.float64)
    gpu_pods = milli > 0
    gpu_milli = float((p * milli * count * gpu_pods).sum())
    cpu_milli = float((p * cpu * gpu_pods).sum())
    return cpu_milli / gpu_milli if gpu_milli > 0 and cpu_milli > 0 else 0.0


class GpupackPolicy(FgdPolicy):
    """FGD's score with a CPU-stranding penalty, and the tightest-GPU device choice."""

    name = "gpupack"
    stranding_weight = STRANDING_WEIGHT
    regret_weight = REGRET_WEIGHT

    def __init__(self, typical: TypicalPods) -> None:
        super().__init__(typical)
        # Fixed for the run (it depends only on the typical pods), and read on
        # every node evaluation: computed once here.
        self._cpu_per_gpu_milli = _cpu_per_gpu_milli(typical)
        self.prices = DualPrices.from_typical(typical)

    def cpu_per_gpu_milli(self) -> float:
        """The typical GPU pods' CPU milli per GPU milli (about 10 on openb)."""
        return self._cpu_per_gpu_milli

    def _evaluate(self, cache: StateCache, sids: IntArray, key: RequestKey) -> FloatArray:
        delta = fragmentation_delta(self.model, cache.cpu[sids], cache.free[sids], cache.model[sids], cache.base[sids], key)
        pod_cpu, milli, count = key
        ratio = self._cpu_per_gpu_milli
        if count == 1 and 0 < milli < GPU_MILLI and ratio > 0:
            cpu = cache.cpu[sids].astype(np.float64)
            gpu = cache.free[sids].sum(axis=1).astype(np.float64)
            before = np.maximum(0.0, gpu - cpu / ratio)
            after = np.maximum(0.0, gpu - milli - (cpu - pod_cpu) / ratio)
            growth = np.maximum(after - before, 0.0)
            delta = np.where(np.isneginf(delta), -np.inf, delta - self.stranding_weight * growth[:, None])
        if count == 1 and 0 < milli < GPU_MILLI:
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
        # inf where the pod does not fit, where the delta is already -inf.
        regret: FloatArray = self.regret_weight * GPU_MILLI * self.prices.regret(free, milli)
        return regret

    def best_device(self, scores: IntArray, free: IntArray) -> int:
        """Among the devices with the best score, the one with the least free milli."""
        candidates = np.flatnonzero(scores == scores.max())
        return int(candidates[np.argmin(free[candidates])])

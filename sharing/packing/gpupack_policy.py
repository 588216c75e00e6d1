"""gpupack's own node and GPU choice: FGD's fragmentation gradient, made exact.

FGD scores ``trunc(100 * sigmoid(dF / 1000))``: one score point is ~40 GPU
milli of fragmentation near dF = 0, so many nodes tie and the tie goes to an
arbitrary node rank; inside a node, the first device reaching the truncated
score wins, which often opens a fully free GPU next to a partly used one that
would have served just as well. gpupack keeps FGD's model of the workload (the
typical-pod distribution, which an online scheduler may know) but

1. ranks nodes by the exact fragmentation change ``dF`` (no sigmoid, no truncation);
2. breaks remaining ties by best fit: least free GPU milli, then least free CPU,
   left after placement, so partly used nodes fill before empty ones;
3. places a fractional pod on the device with the best exact ``dF``, ties to
   the device with the least free milli (keeps whole GPUs whole for
   multi-GPU and whole-GPU pods).

It uses nothing an online scheduler would not know at decision time.
"""

from __future__ import annotations

import numpy as np

from sharing.packing.cluster import ClusterState, IntArray
from sharing.packing.fgd import FgdPolicy, fragmentation_delta
from sharing.packing.fragmentation import FloatArray
from sharing.packing.model import GPU_MILLI, PodSpec
from sharing.packing.policy import first_free_gpus
from sharing.packing.state_cache import RequestKey, StateCache
from sharing.packing.typical import TypicalPods

DELTA_RESOLUTION = 1e-3
"""dF is rounded to this many GPU milli so float noise cannot beat the tie-breakers."""


class GpupackPolicy(FgdPolicy):
    """Exact fragmentation gradient with best-fit tie-breaking (see module docstring)."""

    name = "gpupack"

    def __init__(self, typical: TypicalPods, tie_weight: float = 1e-4) -> None:
        super().__init__(typical)
        self.tie_weight = tie_weight

    def _evaluate(self, cache: StateCache, sids: IntArray, key: RequestKey) -> FloatArray:
        delta = fragmentation_delta(self.model, cache.cpu[sids], cache.free[sids], cache.model[sids], cache.base[sids], key)
        best = np.round(delta.max(axis=1) / DELTA_RESOLUTION) * DELTA_RESOLUTION
        # Best-fit secondary key in [0, 1): fuller nodes (GPU first, then CPU) score higher.
        pod_cpu, milli, count = key
        gpu_left = cache.free[sids].sum(axis=1) - milli * count
        cpu_left = cache.cpu[sids] - pod_cpu
        width = cache.free.shape[1] * GPU_MILLI
        fit = 1.0 - (gpu_left / (width + 1.0)) - (cpu_left / (cache.cpu.max() + 1.0)) / (width + 1.0)
        result: FloatArray = best + self.tie_weight * DELTA_RESOLUTION * fit
        return result

    def choose_gpus(self, cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if not pod.is_shared:
            return first_free_gpus(cluster, pod, node)
        delta = np.round(self.device_deltas(cluster, pod, node) / DELTA_RESOLUTION)
        row = cluster.gpu_free[node]
        candidates = np.flatnonzero(delta == delta.max())
        return (int(candidates[np.argmin(row[candidates])]),)

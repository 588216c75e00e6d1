"""Fragmentation Gradient Descent (FGD): the published policy, re-implemented.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023. A node's score is how much
placing the pod *reduces* (or least increases) the node's expected
fragmentation against the workload's typical pods:
``trunc(100 * sigmoid((F(node) - F(node')) / 1000))``; a fractional pod takes
the device that maximises that score (lowest index on ties).
"""

from __future__ import annotations

import numpy as np

from sharing.packing.cluster import ClusterState, IntArray
from sharing.packing.fragmentation import FloatArray, FragmentationModel, fgd_score
from sharing.packing.specs import PodSpec
from sharing.packing.policy import first_free_gpus
from sharing.packing.state_cache import RequestKey, StateCache
from sharing.packing.typical import TypicalPods


def fragmentation_delta(
    fm: FragmentationModel, cpu: IntArray, free: IntArray, model: IntArray, base: FloatArray, key: RequestKey
) -> FloatArray:
    """F - F' per state and device, (M, W); for CPU-only and whole-GPU pods every column is equal.

    ``free`` must hold the devices in ascending order when the pod is whole-GPU,
    so that the fully free devices are the last ones (only their count matters to F).
    """
    pod_cpu, milli, count = key
    if count == 1 and milli < 1000:
        return fm.delta_shared(cpu, free, model, base, pod_cpu, milli)
    taken = np.zeros(free.shape, dtype=bool)
    if count:
        taken[:, free.shape[1] - count :] = True
    delta = fm.delta_whole(cpu, free, model, base, pod_cpu, taken)
    return np.repeat(delta[:, None], free.shape[1], axis=1)


class FgdPolicy:
    """FGD node scoring and FGD GPU selection (the published ``-gpusel FGD``)."""

    name = "FGD"

    def __init__(self, typical: TypicalPods) -> None:
        self.typical = typical
        self._cache: StateCache | None = None
        self._fm: FragmentationModel | None = None

    def cache(self, cluster: ClusterState) -> StateCache:
        """The state cache for ``cluster`` (rebuilt when a different state object is passed)."""
        if self._cache is None or self._cache.cluster is not cluster:
            self._fm = FragmentationModel(self.typical, cluster.models)
            self._cache = StateCache(cluster, self._fm.frag)
        else:
            self._cache.sync()
        return self._cache

    @property
    def model(self) -> FragmentationModel:
        assert self._fm is not None, "cache() first"
        return self._fm

    def _evaluate(self, cache: StateCache, sids: IntArray, key: RequestKey) -> FloatArray:
        delta = fragmentation_delta(self.model, cache.cpu[sids], cache.free[sids], cache.model[sids], cache.base[sids], key)
        best: FloatArray = fgd_score(delta).max(axis=1).astype(np.float64)
        return best

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> FloatArray:
        cache = self.cache(cluster)
        values: FloatArray = cache.values(nodes, (pod.cpu_milli, pod.gpu_milli, pod.gpu_count), self._evaluate)
        return values

    def device_deltas(self, cluster: ClusterState, pod: PodSpec, node: int) -> FloatArray:
        """F - F' of placing fractional ``pod`` on each device of ``node`` (-inf where it does not fit)."""
        cache = self.cache(cluster)
        sid = cache.node_state[node : node + 1]
        row = cluster.gpu_free[node : node + 1]
        delta: FloatArray = self.model.delta_shared(
            cluster.cpu_free[node : node + 1], row, cluster.model_idx[node : node + 1], cache.base[sid],
            pod.cpu_milli, pod.gpu_milli,
        )[0]
        return delta

    def choose_gpus(self, cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if not pod.is_shared:
            return first_free_gpus(cluster, pod, node)
        scores = fgd_score(self.device_deltas(cluster, pod, node))
        return (self.best_device(scores, cluster.gpu_free[node]),)

    def best_device(self, scores: IntArray, free: IntArray) -> int:
        """Among a node's devices scored for a fractional pod (``-inf`` where it does
        not fit), the one to use: FGD takes the first with the maximum score."""
        return int(np.argmax(scores))

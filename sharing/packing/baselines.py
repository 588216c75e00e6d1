"""The five non-FGD policies of the FGD paper's openb experiment.

Each follows the scoring rule the public simulator uses (documented in the
traces' ``PROTOCOL.md`` §4): integer scores in 0..100, computed on the node state
before placement. Normalisation constants are the cluster's largest node (CPU
128,000 milli and 8 GPUs on openb), which is what the simulator's ``-norm max``
option means.
"""

from __future__ import annotations

import numpy as np

from sharing.packing.cluster import ClusterState, IntArray
from sharing.packing.specs import GPU_MILLI, PodSpec
from sharing.packing.policy import best_fit_gpu, first_free_gpus


def _norms(cluster: ClusterState) -> tuple[float, float]:
    return float(cluster.cpu_total.max()), float(cluster.gpu_count.max() * GPU_MILLI)


class RandomPolicy:
    """A uniformly random feasible node and a uniformly random fitting GPU."""

    name = "Random"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> IntArray:
        out = np.zeros(nodes.size, dtype=np.int64)
        out[self.rng.integers(nodes.size)] = 100
        return out

    def choose_gpus(self, cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
        if pod.gpu_count == 0:
            return ()
        if pod.is_whole:
            return first_free_gpus(cluster, pod, node)
        fits = np.flatnonzero(cluster.gpu_free[node] >= pod.gpu_milli)
        return (int(fits[self.rng.integers(fits.size)]),)


class BestFitGpuChoice:
    """Within the chosen node, the GPU the pod fits best: the public simulator's rule for the four scorers below."""

    def choose_gpus(self, cluster: ClusterState, pod: PodSpec, node: int) -> tuple[int, ...]:
        return best_fit_gpu(cluster, pod, node)


class DotProductPolicy(BestFitGpuChoice):
    """Alignment of the pod's (CPU, GPU) demand with the node's free (CPU, GPU)."""

    name = "DotProd"

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> IntArray:
        cpu_norm, gpu_norm = _norms(cluster)
        d = (cluster.cpu_free[nodes] / cpu_norm) * (pod.cpu_milli / cpu_norm) + (
            cluster.gpu_free_sum[nodes] / gpu_norm
        ) * (pod.gpu_total_milli / gpu_norm)
        return np.trunc(100.0 * (1.0 - d / 2.0)).astype(np.int64)


class GpuClusteringPolicy(BestFitGpuChoice):
    """Prefer nodes that already hold only pods of the same kind, then fuller nodes."""

    name = "GpuClustering"

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> IntArray:
        if pod.gpu_count == 0:
            return np.zeros(nodes.size, dtype=np.int64)
        _, gpu_norm = _norms(cluster)
        tag = 0 if pod.is_shared else pod.gpu_count
        present = cluster.pod_kinds[nodes] > 0
        kinds = present.sum(axis=1)
        has = present[:, tag]
        base = np.where(has & (kinds == 1), 75, np.where(has, 50, np.where(kinds == 0, 25, 0)))
        free = cluster.gpu_free_sum[nodes]
        return (base + (25 * (int(gpu_norm) - free)) // int(gpu_norm)).astype(np.int64)


class GpuPackingPolicy(BestFitGpuChoice):
    """Prefer partly used GPUs, then partly used nodes, then empty nodes."""

    name = "GpuPacking"

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> IntArray:
        if pod.gpu_count == 0:
            return np.zeros(nodes.size, dtype=np.int64)
        full = cluster.full_count[nodes]
        empty_node = full == cluster.gpu_count[nodes]
        empty_score = np.maximum(33 - full, full)
        if pod.is_whole:
            other = np.full(nodes.size, max(50 - pod.gpu_count, 33))
        else:
            rows = cluster.gpu_free[nodes]
            chosen = np.where(rows >= pod.gpu_milli, rows, GPU_MILLI + 1).min(axis=1)
            packed = np.maximum(100 - (chosen * 100 // GPU_MILLI) // 10, 50)
            other = np.where(chosen == GPU_MILLI, max(50 - 1, 33), packed)
        return np.where(empty_node, empty_score, other).astype(np.int64)


class BestFitPolicy(BestFitGpuChoice):
    """The node left with the least free CPU and GPU (equal weights) after placement."""

    name = "BestFit"

    def scores(self, cluster: ClusterState, pod: PodSpec, nodes: IntArray) -> IntArray:
        cpu_norm, gpu_norm = _norms(cluster)
        s = 0.5 * (cluster.cpu_free[nodes] - pod.cpu_milli) / cpu_norm + 0.5 * (
            cluster.gpu_free_sum[nodes] - pod.gpu_total_milli
        ) / gpu_norm
        return np.trunc(100.0 * (1.0 - s)).astype(np.int64)

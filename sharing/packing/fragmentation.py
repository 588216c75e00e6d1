"""FGD's node fragmentation ``F`` and its change under a hypothetical placement.

For typical pod k (probability p_k) a node's fragment is its free GPU milli that
k cannot use: the free milli of devices too small for k when k fits the node
(CPU and enough devices with f >= mu_k), otherwise all free milli ``G``; a
CPU-only or inaccessible k counts ``G``. ``F = sum_k p_k * frag_k`` (GPU milli;
memory is ignored, as in the paper's simulator).

Everything is vectorised over a batch of node states ``(C, f[0..W), model)``
and, for a fractional pod, over every candidate device at once: placing mu on
device j changes only that device, so each typical pod's count of big-enough
devices and sum of too-small ones move by a delta instead of being recomputed.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sharing.packing.typical import TypicalPods

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class FragmentationModel:
    """Typical pods bound to a cluster's GPU-model list, ready for batch evaluation."""

    def __init__(self, typical: TypicalPods, models: tuple[str, ...]) -> None:
        self.typical = typical
        self.cpu = np.array(typical.cpu_milli, dtype=np.int64)
        self.mu = np.array(typical.gpu_milli, dtype=np.int64)
        self.q = np.array(typical.gpu_count, dtype=np.int64)
        self.p = np.array(typical.probability, dtype=np.float64)
        self.access = typical.accessible(models)  # (models, K)

    def frag(self, cpu: IntArray, free: IntArray, model: IntArray) -> FloatArray:
        """F for each state: ``cpu`` (M,), ``free`` (M, W), ``model`` (M,) -> (M,)."""
        ge = free[:, :, None] >= self.mu[None, None, :]  # (M, W, K)
        cnt = ge.sum(axis=1)
        low = np.where(ge, 0, free[:, :, None]).sum(axis=1)
        total = free.sum(axis=1)
        fits = self.access[model] & (cpu[:, None] >= self.cpu[None, :]) & (cnt >= self.q[None, :])
        frag = np.where(fits, low, total[:, None])
        result: FloatArray = frag @ self.p
        return result

    def delta_shared(
        self, cpu: IntArray, free: IntArray, model: IntArray, base: FloatArray, pod_cpu: int, pod_milli: int
    ) -> FloatArray:
        """``F(node) - F(node')`` for a fractional pod on each device: (M, W); -inf where it does not fit."""
        mu = self.mu[None, None, :]
        ge = free[:, :, None] >= mu
        cnt = ge.sum(axis=1)  # (M, K)
        small = np.where(ge, 0, free[:, :, None])  # (M, W, K)
        low = small.sum(axis=1)
        after = free - pod_milli  # (M, W)
        ge_after = after[:, :, None] >= mu
        cnt2 = cnt[:, None, :] - ge + ge_after  # (M, W, K)
        low2 = low[:, None, :] - small + np.where(ge_after, 0, after[:, :, None])
        total2 = free.sum(axis=1) - pod_milli  # (M,)
        base_ok = self.access[model] & ((cpu - pod_cpu)[:, None] >= self.cpu[None, :])  # (M, K)
        fits = base_ok[:, None, :] & (cnt2 >= self.q[None, None, :])
        frag2 = np.where(fits, low2, total2[:, None, None])
        delta: FloatArray = base[:, None] - frag2 @ self.p
        return np.where(free >= pod_milli, delta, -np.inf)

    def delta_whole(
        self, cpu: IntArray, free: IntArray, model: IntArray, base: FloatArray, pod_cpu: int, gpus: IntArray
    ) -> FloatArray:
        """``F(node) - F(node')`` when the devices flagged in ``gpus`` (M, W) are taken whole (or none): (M,)."""
        after = np.where(gpus, 0, free)
        delta: FloatArray = base - self.frag(cpu - pod_cpu, after, model)
        return delta


def fgd_score(delta: FloatArray) -> IntArray:
    """The published integer score: trunc(100 * sigmoid(delta / 1000)); -1 where delta is -inf."""
    with np.errstate(over="ignore"):
        raw = 100.0 / (1.0 + np.exp(-delta / 1000.0))
    score: IntArray = np.where(np.isneginf(delta), -1, np.trunc(raw)).astype(np.int64)
    return score

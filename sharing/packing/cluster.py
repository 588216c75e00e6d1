"""Cluster state of the packing engine: what is free where, kept as numpy arrays.

One ``ClusterState`` holds every node's free CPU, memory and per-GPU milli, plus
the derived per-node figures the policies read on every decision (free GPU milli
``G``, fully free GPUs, largest free GPU, the kinds of GPU pods present).
``place``/``remove`` update one node's row in O(GPUs per node), so nothing is
recomputed for the rest of the cluster; each change bumps that node's
``version`` so caches held by policies (FGD's fragmentation) can refresh only
the nodes that changed.

The state is deliberately mutable (the one exception to the frozen-dataclass
rule in the engine): a replay changes it ~10^4 times per run, and copying 1,213
rows each time would cost more than the decisions. ``fork()`` gives an
independent copy for what-if questions, in the spirit of cluster-autoscaler's
``ClusterSnapshot``; the live controller builds one from Kubernetes objects per
cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sharing.packing.specs import GPU_MILLI, NodeSpec, PodPlacement, PodSpec

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

TAG_SHARED = 0
"""Column of ``pod_kinds`` counting shared (fractional) pods; column q counts q-GPU pods."""


class ClusterState:
    """Free resources of a fixed set of nodes, updated pod by pod."""

    def __init__(self, nodes: Sequence[NodeSpec], tie_rank: Sequence[int] | None = None) -> None:
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        n = len(self.nodes)
        self.models: tuple[str, ...] = tuple(sorted({nd.gpu_model for nd in self.nodes}))
        model_index = {m: i for i, m in enumerate(self.models)}
        self.width = max(1, max(nd.gpu_count for nd in self.nodes))
        self.cpu_total: IntArray = np.array([nd.cpu_milli for nd in self.nodes], dtype=np.int64)
        self.mem_total: IntArray = np.array([nd.memory_mib for nd in self.nodes], dtype=np.int64)
        self.gpu_count: IntArray = np.array([nd.gpu_count for nd in self.nodes], dtype=np.int64)
        self.model_idx: IntArray = np.array([model_index[nd.gpu_model] for nd in self.nodes], dtype=np.int64)
        self.gpu_present: BoolArray = np.arange(self.width)[None, :] < self.gpu_count[:, None]
        self.cpu_free: IntArray = self.cpu_total.copy()
        self.mem_free: IntArray = self.mem_total.copy()
        # Absent devices hold 0 free milli: they never satisfy f >= mu (mu > 0)
        # and add nothing to sums, so no mask is needed in the hot paths.
        self.gpu_free: IntArray = np.where(self.gpu_present, GPU_MILLI, 0).astype(np.int64)
        self.gpu_free_sum: IntArray = self.gpu_free.sum(axis=1)
        self.full_count: IntArray = self.gpu_count.copy()
        self.max_free: IntArray = self.gpu_free.max(axis=1)
        self.pod_kinds: IntArray = np.zeros((n, self.width + 1), dtype=np.int64)
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self.tie_rank: IntArray = (
            np.arange(n, dtype=np.int64) if tie_rank is None else np.asarray(tie_rank, dtype=np.int64)
        )
        if self.tie_rank.shape != (n,):
            raise ValueError("tie_rank needs one rank per node")
        self._model_masks: dict[tuple[str, ...], BoolArray] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    # ----------------------------------------------------------------- queries
    @property
    def total_gpus(self) -> int:
        return int(self.gpu_count.sum())

    @property
    def used_gpu_milli(self) -> int:
        """GPU milli allocated over the whole cluster (sum of placed pods' q*mu)."""
        return int(self.gpu_count.sum() * GPU_MILLI - self.gpu_free_sum.sum())

    def model_mask(self, models: tuple[str, ...]) -> BoolArray:
        """Nodes whose GPU model is one of ``models`` (all nodes when empty)."""
        mask = self._model_masks.get(models)
        if mask is None:
            if models:
                ok = np.array([m in models for m in self.models], dtype=bool)
                mask = ok[self.model_idx]
            else:
                mask = np.ones(len(self.nodes), dtype=bool)
            self._model_masks[models] = mask
        return mask

    def feasible(self, pod: PodSpec) -> BoolArray:
        """Nodes that can take ``pod`` now (the openb simulator's filter)."""
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        if pod.gpu_count == 0:
            return ok
        ok &= self.model_mask(pod.gpu_models)
        if pod.is_whole:
            ok &= self.full_count >= pod.gpu_count
        else:
            ok &= self.max_free >= pod.gpu_milli
        return ok

    def refusal_reasons(self, pod: PodSpec) -> tuple[str, ...]:
        """Why no node takes ``pod``: how many nodes fail each constraint."""
        n = len(self.nodes)
        reasons = []
        checks: list[tuple[str, BoolArray]] = [
            (f"CPU < {pod.cpu_milli}m", self.cpu_free < pod.cpu_milli),
            (f"memory < {pod.memory_mib}Mi", self.mem_free < pod.memory_mib),
        ]
        if pod.gpu_count:
            if pod.gpu_models:
                checks.append((f"GPU model not in {'|'.join(pod.gpu_models)}", ~self.model_mask(pod.gpu_models)))
            if pod.is_whole:
                checks.append((f"fewer than {pod.gpu_count} fully free GPUs", self.full_count < pod.gpu_count))
            else:
                checks.append((f"no GPU with {pod.gpu_milli} free milli", self.max_free < pod.gpu_milli))
        for text, failing in checks:
            count = int(failing.sum())
            if count:
                reasons.append(f"{count}/{n} nodes: {text}")
        return tuple(reasons) or ("no nodes",)

    # ----------------------------------------------------------------- changes
    def place(self, pod: PodSpec, node: int, gpus: Sequence[int]) -> PodPlacement:
        """Commit ``pod`` onto ``node`` using devices ``gpus``; raises ValueError if it does not fit."""
        gpus = tuple(int(g) for g in gpus)
        if len(gpus) != pod.gpu_count or len(set(gpus)) != len(gpus):
            raise ValueError(f"pod {pod.name!r} needs {pod.gpu_count} distinct GPUs, got {gpus}")
        if self.cpu_free[node] < pod.cpu_milli or self.mem_free[node] < pod.memory_mib:
            raise ValueError(f"pod {pod.name!r} does not fit CPU/memory of node {self.nodes[node].name!r}")
        for g in gpus:
            if not 0 <= g < self.gpu_count[node] or self.gpu_free[node, g] < pod.gpu_milli:
                raise ValueError(f"pod {pod.name!r} does not fit GPU {g} of node {self.nodes[node].name!r}")
        self.cpu_free[node] -= pod.cpu_milli
        self.mem_free[node] -= pod.memory_mib
        for g in gpus:
            self.gpu_free[node, g] -= pod.gpu_milli
        if pod.gpu_count:
            self.pod_kinds[node, TAG_SHARED if pod.is_shared else pod.gpu_count] += 1
        self._refresh(node)
        return PodPlacement(pod=pod, node=node, gpus=gpus)

    def remove(self, placement: PodPlacement) -> None:
        """Undo ``place``: give the pod's resources back to its node."""
        pod, node = placement.pod, placement.node
        self.cpu_free[node] += pod.cpu_milli
        self.mem_free[node] += pod.memory_mib
        for g in placement.gpus:
            self.gpu_free[node, g] += pod.gpu_milli
        if pod.gpu_count:
            self.pod_kinds[node, TAG_SHARED if pod.is_shared else pod.gpu_count] -= 1
        if (
            self.cpu_free[node] > self.cpu_total[node]
            or self.mem_free[node] > self.mem_total[node]
            or (self.gpu_free[node] > GPU_MILLI).any()
        ):
            raise ValueError(f"removing pod {pod.name!r} frees more than node {self.nodes[node].name!r} has")
        self._refresh(node)

    def _refresh(self, node: int) -> None:
        row = self.gpu_free[node]
        self.gpu_free_sum[node] = row.sum()
        self.full_count[node] = int((row == GPU_MILLI).sum())
        self.max_free[node] = row.max()
        self.version[node] += 1

    def fork(self) -> ClusterState:
        """An independent copy (what-if): changes to it leave this state alone."""
        other = ClusterState.__new__(ClusterState)
        for key, value in self.__dict__.items():
            other.__dict__[key] = value.copy() if isinstance(value, np.ndarray) else value
        other._model_masks = dict(self._model_masks)
        return other

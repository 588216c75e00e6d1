"""Per-node-state memo of policy values, refreshed only for nodes that changed.

Scoring a pod with FGD costs a fragmentation evaluation per node and candidate
device. Most of that is repeated work: a node's score for a pod depends only on
the node's *state* (free CPU, multiset of free GPU milli, GPU model) and on the
pod's request (cpu, gpu milli, gpu count), and between two decisions only one
node changes. So node states are interned to integer ids (identical empty nodes
share one id), and for every request key a column holds the value per state id,
NaN until first asked. A decision then costs one gather over the feasible nodes
plus the evaluation of states never seen for that request.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from sharing.packing.cluster import ClusterState, IntArray

FloatArray = npt.NDArray[np.float64]
RequestKey = tuple[int, int, int]
Evaluator = Callable[["StateCache", IntArray, RequestKey], FloatArray]


class StateCache:
    """Interned node states of one ``ClusterState`` and memoised values per request key."""

    def __init__(self, cluster: ClusterState, frag: Callable[[IntArray, IntArray, IntArray], FloatArray]) -> None:
        self.cluster = cluster
        self._frag = frag
        cap = max(1024, 4 * len(cluster))
        w = cluster.width
        self.cpu: IntArray = np.zeros(cap, dtype=np.int64)
        self.free: IntArray = np.zeros((cap, w), dtype=np.int64)
        self.model: IntArray = np.zeros(cap, dtype=np.int64)
        self.base: FloatArray = np.zeros(cap, dtype=np.float64)
        """F of each state."""
        self.size = 0
        self._ids: dict[tuple[int, int, bytes], int] = {}
        self.columns: dict[RequestKey, FloatArray] = {}
        self.node_state: IntArray = np.zeros(len(cluster), dtype=np.int64)
        self._seen: IntArray = np.full(len(cluster), -1, dtype=np.int64)
        self.sync()

    def sync(self) -> None:
        """Re-intern the nodes whose ``version`` moved since the last call."""
        c = self.cluster
        changed = np.flatnonzero(c.version != self._seen)
        if changed.size == 0:
            return
        sorted_free = np.sort(c.gpu_free[changed], axis=1)
        new_rows: list[int] = []
        for i, node in enumerate(changed):
            key = (int(c.cpu_free[node]), int(c.model_idx[node]), sorted_free[i].tobytes())
            sid = self._ids.get(key)
            if sid is None:
                sid = self._append(key[0], sorted_free[i], key[1])
                self._ids[key] = sid
                new_rows.append(sid)
            self.node_state[node] = sid
        if new_rows:
            rows = np.array(new_rows, dtype=np.int64)
            self.base[rows] = self._frag(self.cpu[rows], self.free[rows], self.model[rows])
        self._seen[changed] = c.version[changed]

    def _append(self, cpu: int, free: IntArray, model: int) -> int:
        if self.size == self.cpu.size:
            self._grow()
        sid = self.size
        self.cpu[sid] = cpu
        self.free[sid] = free
        self.model[sid] = model
        self.size += 1
        return sid

    def _grow(self) -> None:
        cap = 2 * self.cpu.size
        self.cpu = np.resize(self.cpu, cap)
        self.model = np.resize(self.model, cap)
        self.base = np.resize(self.base, cap)
        free = np.zeros((cap, self.free.shape[1]), dtype=np.int64)
        free[: self.free.shape[0]] = self.free
        self.free = free
        for key, col in self.columns.items():
            grown = np.full(cap, np.nan)
            grown[: col.size] = col
            self.columns[key] = grown

    def values(self, nodes: IntArray, key: RequestKey, evaluate: Evaluator) -> FloatArray:
        """Value of ``key`` on each of ``nodes``, evaluating only unseen states."""
        col = self.columns.get(key)
        if col is None:
            col = np.full(self.cpu.size, np.nan)
            self.columns[key] = col
        sids = self.node_state[nodes]
        vals = col[sids]
        missing = np.isnan(vals)
        if missing.any():
            todo = np.unique(sids[missing])
            col[todo] = evaluate(self, todo, key)
            vals = col[sids]
        return vals

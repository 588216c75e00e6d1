"""The placed pods preemption may choose from, indexed by node: :class:`Victim` and :class:`PlacedPods`.

A :class:`Victim` is a placed pod as the packing engine holds it: its key, priority, the GPU milli
it asked (what preempting it takes from the allocation) and its :class:`~sharing.packing.specs.PodPlacement`
in the engine's :class:`~sharing.packing.cluster.ClusterState` (for a replica of a node shared into
``r``, the share of the GPU the state counts for it), which is what removing it gives back.

:class:`PlacedPods` keeps them by node, and beside the records flat arrays (node, CPU, memory,
priority, GPUs freed, replica) so that :mod:`sharing.packing.preemption` can ask "what could the
pods below priority ``p`` free on each node" for the whole cluster in a few numpy operations,
instead of a Python loop over every node for every pod that fits nowhere (a replay asks it
thousands of times on 1,213 nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharing.packing.cluster import BoolArray, IntArray
from sharing.packing.specs import PodPlacement


@dataclass(frozen=True)
class Victim:
    """A placed pod that a preemptor of higher priority could remove."""

    key: str
    """The pod's identity (``namespace/name`` live, the trace's name in the simulator)."""
    priority: int
    milli: int
    """GPU milli the pod asked for (``q x mu``)."""
    placement: PodPlacement
    """Where the engine's state holds it, and what it holds there (removing it gives this back)."""
    replica: bool = False
    """It holds one replica of a node shared into replicas (else whole GPUs, or no GPU)."""
    started: float = 0.0
    """When it started (kube-scheduler prefers the node whose victims started last)."""
    violates_budget: bool = False
    """Preempting it would violate a PodDisruptionBudget (kube-scheduler reprieves those first)."""

    @property
    def node(self) -> int:
        return self.placement.node

    @property
    def whole_gpus(self) -> int:
        """GPUs removing it frees wholly (a whole-GPU pod's; a replica frees one replica, no GPU)."""
        return 0 if self.replica else self.placement.pod.gpu_count


class PlacedPods:
    """Placed pods by node, with flat arrays for cluster-wide sums (module docstring)."""

    def __init__(self, node_count: int) -> None:
        self.node_count = node_count
        self._by_node: list[dict[str, Victim]] = [{} for _ in range(node_count)]
        self._row: dict[str, int] = {}
        self._free_rows: list[int] = []
        size = 64
        self.node: IntArray = np.zeros(size, dtype=np.int64)
        self.cpu: IntArray = np.zeros(size, dtype=np.int64)
        self.mem: IntArray = np.zeros(size, dtype=np.int64)
        self.priority: IntArray = np.zeros(size, dtype=np.int64)
        self.milli: IntArray = np.zeros(size, dtype=np.int64)
        """GPU milli each asked (:attr:`Victim.milli`)."""
        self.gpus: IntArray = np.zeros(size, dtype=np.int64)
        """GPUs each frees wholly (:attr:`Victim.whole_gpus`)."""
        self.replica: BoolArray = np.zeros(size, dtype=bool)
        self.gpu_pod: BoolArray = np.zeros(size, dtype=bool)
        self.alive: BoolArray = np.zeros(size, dtype=bool)

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, key: str) -> bool:
        return key in self._row

    def on_node(self, node: int) -> list[Victim]:
        """The pods placed on ``node``, in the order they were added."""
        return list(self._by_node[node].values())

    def gpu_pods_on(self, node: int) -> int:
        return sum(1 for v in self._by_node[node].values() if v.placement.pod.gpu_count)

    def add(self, victim: Victim) -> None:
        if victim.key in self._row:
            raise ValueError(f"pod {victim.key!r} is placed already")
        if not 0 <= victim.node < self.node_count:
            raise ValueError(f"pod {victim.key!r}: node {victim.node} is not one of the {self.node_count} nodes")
        row = self._free_rows.pop() if self._free_rows else len(self._row)
        if row >= self.alive.size:
            self._grow()
        pod = victim.placement.pod
        self.node[row], self.cpu[row], self.mem[row] = victim.node, pod.cpu_milli, pod.memory_mib
        self.priority[row], self.milli[row] = victim.priority, victim.milli
        self.gpus[row], self.replica[row] = victim.whole_gpus, victim.replica
        self.gpu_pod[row], self.alive[row] = pod.gpu_count > 0, True
        self._row[victim.key] = row
        self._by_node[victim.node][victim.key] = victim

    def remove(self, key: str) -> Victim:
        """Forget pod ``key`` (it left or was preempted); KeyError if it is not placed."""
        row = self._row.pop(key)
        self.alive[row] = False
        self._free_rows.append(row)
        return self._by_node[int(self.node[row])].pop(key)

    def _grow(self) -> None:
        for name in ("node", "cpu", "mem", "priority", "milli", "gpus", "replica", "gpu_pod", "alive"):
            old = getattr(self, name)
            new = np.zeros(old.size * 2, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)

    def below(self, priority: int) -> BoolArray:
        """Rows of placed pods of priority strictly below ``priority``."""
        out: BoolArray = self.alive & (self.priority < priority)
        return out

    def per_node(self, rows: BoolArray, values: IntArray) -> IntArray:
        """Sum of ``values`` over ``rows``, per node."""
        out: IntArray = np.bincount(self.node[rows], weights=values[rows], minlength=self.node_count).astype(np.int64)
        return out

"""A usage trace on GPUs shared into replicas: what the device-plugin backend gives pods taking one replica each.

The stock NVIDIA device plugin shares every GPU of a node into ``r`` equal replicas, by MPS or
time-slicing (``sharing.rules.replicas``). Here each pod of a usage trace asks for one replica
and lives from its first sample to its last, on a pool of nodes of ``gpus_per_node`` GPUs that
grows as needed (so ``gpu_hours`` counts the GPUs the pods need):

* a pod goes to the first node, in the order nodes were opened, with a GPU holding fewer than
  ``r`` pods; on that node to the GPU with the fewest pods (the device plugin hands
  out the replicas of its least used GPU first), the lowest index on a tie; a new node when
  none has room;
* a pod never moves: nothing in the product moves a running pod off its replica;
* memory: **time-slicing** has no memory limit (a pod holds what it uses; the GPU overflows
  when its pods use more than it has); **MPS** gives each replica ``1 / r`` of the GPU's memory
  (the device plugin's even per-replica limit), a hard limit: use above it is an OOM.

Its figures are read by the same measuring stick as every usage run
(``sharing.simulator.usage_figures``); ``benchmarks/static_replicas_trace.py`` prints them for
every replica count. A driver that changed a node's ``r`` as the trace went (the replica loop,
measured this way and removed: benchmarks/controller.md) is in the project's history.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from sharing.simulator.usage_figures import Seat, Seating
from sharing.usage.trace import UsageTrace

Sharing = Literal["time-slicing", "mps"]
SHARINGS: tuple[Sharing, ...] = ("time-slicing", "mps")


@dataclass
class ReplicaReplay:
    """One run of a trace on GPUs shared into ``replicas`` (module docstring)."""

    trace: UsageTrace
    gpu_memory_bytes: int
    replicas: int
    sharing: Sharing = "time-slicing"
    gpus_per_node: int = 8
    nodes: list[list[list[str]]] = field(default_factory=list)
    """Per node opened, per GPU, the pods on it now."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be at least 1, got {self.gpus_per_node}")
        if self.sharing not in SHARINGS:
            raise ValueError(f"sharing must be one of {', '.join(SHARINGS)}, got {self.sharing!r}")

    def _place(self, pod: str) -> int:
        """The pod's GPU, numbered across the pool (module docstring)."""
        for index, gpus in enumerate(self.nodes):
            room = [g for g, pods in enumerate(gpus) if len(pods) < self.replicas]
            if room:
                gpu = min(room, key=lambda g: (len(gpus[g]), g))
                gpus[gpu].append(pod)
                return index * self.gpus_per_node + gpu
        self.nodes.append([[pod]] + [[] for _ in range(self.gpus_per_node - 1)])
        return (len(self.nodes) - 1) * self.gpus_per_node

    def seatings(self) -> Iterator[Seating]:
        """Each step's seating, for ``usage_figures.measure``."""
        limit = self.gpu_memory_bytes // self.replicas if self.sharing == "mps" else None
        seats: dict[str, Seat] = {}
        for step in range(self.trace.steps):
            for pod in self.trace.pods:
                if pod.end_step == step and pod.pod in seats:
                    gpu = seats.pop(pod.pod).gpu
                    self.nodes[gpu // self.gpus_per_node][gpu % self.gpus_per_node].remove(pod.pod)
            for pod in self.trace.pods:
                if pod.first_step == step:
                    seats[pod.pod] = Seat(self._place(pod.pod), limit)
            yield dict(seats)

"""A usage trace on GPUs shared into replicas: what the device-plugin backend gives pods taking one replica each.

The stock NVIDIA device plugin shares every GPU of a node into ``r`` equal replicas, by MPS or
time-slicing (``sharing.rules.replicas``). Here each pod of a usage trace asks for one replica
and lives from its first sample to its last, on a pool of nodes of ``gpus_per_node`` GPUs that
grows as needed (so ``gpu_hours`` counts the GPUs the pods need):

* a pod goes to the first node, in the order nodes were opened, with a GPU holding fewer pods
  than the node's ``r``; on that node to the GPU with the fewest pods (the device plugin hands
  out the replicas of its least used GPU first), the lowest index on a tie; a new node when
  none has room;
* a pod never moves: nothing in the product moves a running pod off its replica;
* memory: **time-slicing** has no memory limit (a pod holds what it uses; the GPU overflows
  when its pods use more than it has); **MPS** gives each replica ``1 / r`` of the GPU's memory,
  the ``r`` of the pod's node when the pod started (the limit a client gets when it starts).

Its figures are read by the same measuring stick as every usage run
(``sharing.simulator.usage_figures``). ``retune`` lets a driver change a node's ``r`` after
each step from what its GPUs did (the replica loop's benchmark); a changed ``r`` applies from
the next step, to pods placed from then on: pods already on a GPU keep their replica and their
limit, so a GPU may hold more pods than its node's new ``r`` (``oversubscribed_gpu_steps``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sharing.simulator.usage_figures import Seat, Seating
from sharing.usage.trace import UsageTrace

Sharing = Literal["time-slicing", "mps"]
SHARINGS: tuple[Sharing, ...] = ("time-slicing", "mps")
DUTY_CAPACITY = 100.0
"""The most busy time a GPU reports, in percent: NVML's utilisation of a GPU whose pods ask for
more is 100."""


@dataclass
class SharedNode:
    """One node of the pool: its replica count and, per GPU, the pods on it."""

    replicas: int
    gpus: list[list[str]]

    def busy_percent(self, duty: dict[str, float]) -> list[float]:
        """Per GPU, the busy percent its pods' duty cycles give it (capped as NVML caps it)."""
        return [min(DUTY_CAPACITY, sum(duty[p] for p in pods)) for pods in self.gpus]


Retune = Callable[[int, int, SharedNode, Sequence[float]], int]
"""``(step, node index, node, busy percent per GPU) -> the node's replica count from the next step``."""


@dataclass
class ReplicaReplay:
    """One run of a trace on GPUs shared into ``replicas`` (module docstring); counts as it goes."""

    trace: UsageTrace
    gpu_memory_bytes: int
    replicas: int
    sharing: Sharing = "time-slicing"
    gpus_per_node: int = 8
    retune: Retune | None = None
    nodes: list[SharedNode] = field(default_factory=list)
    replica_changes: int = 0
    oversubscribed_gpu_steps: int = 0
    """GPU-steps holding more pods than the node's replica count at that step."""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be at least 1, got {self.gpus_per_node}")
        if self.sharing not in SHARINGS:
            raise ValueError(f"sharing must be one of {', '.join(SHARINGS)}, got {self.sharing!r}")

    def _place(self, pod: str) -> tuple[int, int]:
        for index, node in enumerate(self.nodes):
            room = [g for g, pods in enumerate(node.gpus) if len(pods) < node.replicas]
            if room:
                gpu = min(room, key=lambda g: (len(node.gpus[g]), g))
                node.gpus[gpu].append(pod)
                return index, gpu
        self.nodes.append(SharedNode(self.replicas, [[] for _ in range(self.gpus_per_node)]))
        self.nodes[-1].gpus[0].append(pod)
        return len(self.nodes) - 1, 0

    def seatings(self) -> Iterator[Seating]:
        """Each step's seating, for ``usage_figures.measure``."""
        seats: dict[str, Seat] = {}
        where: dict[str, tuple[int, int]] = {}
        for step in range(self.trace.steps):
            for pod in self.trace.pods:
                if pod.end_step == step and pod.pod in where:
                    at, gpu = where.pop(pod.pod)
                    self.nodes[at].gpus[gpu].remove(pod.pod)
                    del seats[pod.pod]
            for pod in self.trace.pods:
                if pod.first_step == step:
                    at, gpu = where[pod.pod] = self._place(pod.pod)
                    replicas = self.nodes[at].replicas
                    limit = self.gpu_memory_bytes // replicas if self.sharing == "mps" else None
                    seats[pod.pod] = Seat(at * self.gpus_per_node + gpu, limit)
            self.oversubscribed_gpu_steps += sum(len(pods) > n.replicas for n in self.nodes for pods in n.gpus)
            yield dict(seats)
            if self.retune is not None:
                duty = {p.pod: p.duty_percent[step - p.first_step] for p in self.trace.pods if p.pod in where}
                for index, node in enumerate(self.nodes):
                    wanted = self.retune(step, index, node, node.busy_percent(duty))
                    if wanted != node.replicas:
                        node.replicas = wanted
                        self.replica_changes += 1

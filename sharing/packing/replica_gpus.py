"""GPUs shared as the device-plugin backend shares them: each split into equal replicas.

On a device-plugin node pool a shared GPU is ``r`` equal replicas, node-wide
(``sharing.rules.replicas``: a container fits a replica when ``r x milli <= 1000`` and
``r x memory <= the GPU's memory``), and ``r`` is chosen when an idle node is switched for the
pod that needs it: the most replicas that pod still fits (the controller's planner,
``controller/planning/sharedplan.py``; ``--policy`` picks among the nodes that fit). With one GPU
per node, as a live usage replay runs (``gpupack.replay.usage_stack``), that is per GPU.

:class:`ReplicaGpus` is :class:`sharing.packing.shared_gpus.SharedGpus` under that rule, so the
right-sizer's replay (``sharing.simulator.usage_replay``, ``backend="device-plugin"``) models what
the live device-plugin path does rather than the DRA pool's exact shares: a GPU holds at most
``r`` pods and each at most ``1/r`` of its memory and compute; a GPU left empty is idle again and
is split anew for the next pod it takes. Among the GPUs with a free replica that fits, a share
goes to the one with the fewest free replicas (lowest id on ties), else to a new GPU.
"""

from __future__ import annotations

from sharing.packing.duty_sum import DutyProfile
from sharing.packing.shared_gpus import FitRule, SharedGpus, Size
from sharing.rules.replicas import MAX_REPLICAS, fits_replicas, most_replicas


class ReplicaGpus(SharedGpus):
    """A growing pool of GPUs split into equal replicas (module docstring)."""

    def __init__(self, rule: FitRule, max_replicas: int = MAX_REPLICAS) -> None:
        super().__init__(rule)
        self.max_replicas = max_replicas
        self.replicas: dict[int, int] = {}
        """GPU -> its replica count, while it holds a pod."""

    def split_for(self, size: Size) -> int:
        """The replicas an idle GPU is split into for ``size``: the most it fits, at least 1 (whole)."""
        return max(1, most_replicas(((size.milli, size.memory_bytes),), self.rule.gpu_memory_bytes,
                                    maximum=self.max_replicas))

    def admits(self, gpu: int, size: Size, duty: DutyProfile | None = None) -> bool:
        replicas = self.replicas.get(gpu)
        if replicas is None:
            return gpu not in self.on  # an idle GPU is split for the share
        return (len(self.on.get(gpu, ())) < replicas
                and fits_replicas(replicas, size.milli, size.memory_bytes, self.rule.gpu_memory_bytes))

    def best_fit(self, size: Size, duty: DutyProfile | None = None, avoid: int | None = None) -> int | None:
        best: tuple[int, int] | None = None
        for gpu in sorted(self.on):
            free = self.replicas.get(gpu, 1) - len(self.on[gpu])
            if gpu != avoid and (best is None or (free, gpu) < best) and self.admits(gpu, size, duty):
                best = (free, gpu)
        return None if best is None else best[1]

    def place(self, pod: str, size: Size, gpu: int, duty: DutyProfile | None = None) -> None:
        if not self.on.get(gpu):
            self.replicas[gpu] = self.split_for(size)
        super().place(pod, size, gpu, duty)

    def leave(self, pod: str) -> None:
        gpu = self.seats[pod][0] if pod in self.seats else None
        super().leave(pod)
        if gpu is not None and gpu not in self.on:
            self.replicas.pop(gpu, None)

    def fork(self) -> ReplicaGpus:
        other = ReplicaGpus(self.rule, self.max_replicas)
        other.loads, other.seats, other.duties = dict(self.loads), dict(self.seats), dict(self.duties)
        other.on = {gpu: set(pods) for gpu, pods in self.on.items()}
        other.next_id, other.replicas = self.next_id, dict(self.replicas)
        return other

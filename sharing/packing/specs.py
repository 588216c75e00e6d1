"""Value types of the packing engine: nodes, pods, placements and refusals.

These are the engine's own frozen types, independent of Kubernetes objects: the
trace simulator builds them from CSV rows, the live controller from Node/Pod
objects. Units follow the openb traces and the FGD paper: CPU and GPU compute in
*milli* (1000 = one core / one whole GPU), memory in MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_MILLI = 1000
"""Compute of one whole GPU, in milli."""


@dataclass(frozen=True)
class NodeSpec:
    """A node's capacity: CPU, memory and ``gpu_count`` GPUs of one model."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str
    gpu_memory_mib: int = 0
    """Memory of one GPU (0 = unknown); used by the MIG variant, not by the openb policies."""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_count < 0:
            raise ValueError(f"node {self.name!r}: capacities must be non-negative")


@dataclass(frozen=True)
class PodSpec:
    """A pod's request.

    ``gpu_milli`` is the compute asked *per GPU* (the FGD paper's mu), clamped
    to 0..1000; ``gpu_count`` GPUs are asked (q). ``gpu_models`` lists the
    accepted GPU models (empty = any); ``gpu_spec`` is the verbatim constraint
    string, which FGD uses as part of a typical pod's identity.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] = ()
    gpu_spec: str = ""
    gpu_memory_mib: int = 0
    """GPU memory asked per GPU (0 = not stated); used by the MIG variant."""

    def __post_init__(self) -> None:
        if self.gpu_milli < 0 or self.gpu_milli > GPU_MILLI:
            raise ValueError(f"pod {self.name!r}: gpu_milli must be in 0..{GPU_MILLI}")
        if self.gpu_count < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"pod {self.name!r}: requests must be non-negative")
        if (self.gpu_count == 0) != (self.gpu_milli == 0):
            raise ValueError(f"pod {self.name!r}: gpu_count and gpu_milli must both be 0 or both positive")
        if self.gpu_count > 1 and self.gpu_milli != GPU_MILLI:
            raise ValueError(f"pod {self.name!r}: a multi-GPU pod must ask whole GPUs (gpu_milli=1000)")

    @property
    def gpu_total_milli(self) -> int:
        """Total GPU demand ``q * mu`` in milli."""
        return self.gpu_count * self.gpu_milli

    @property
    def is_shared(self) -> bool:
        """One GPU, less than all of it: packed onto a device with others."""
        return self.gpu_count == 1 and self.gpu_milli < GPU_MILLI

    @property
    def is_whole(self) -> bool:
        """Whole GPUs only (any count)."""
        return self.gpu_milli == GPU_MILLI

    @property
    def fgd_key(self) -> tuple[int, int, int, str]:
        """Identity of the pod's request for FGD's typical-pod table: (c, mu, q, spec)."""
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, self.gpu_spec)


@dataclass(frozen=True)
class PodPlacement:
    """Where a pod went: a node index and the device indices it uses."""

    pod: PodSpec
    node: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Refusal:
    """Why a pod fits nowhere: one human-readable reason per failed constraint."""

    pod: PodSpec
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return f"pod {self.pod.name!r} fits no node: " + "; ".join(self.reasons)

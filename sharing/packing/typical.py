"""FGD's "typical pods": the workload's request distribution as a small table.

Fragmentation Gradient Descent (Weng et al., USENIX ATC 2023) measures a node's
fragmentation *against the requests the workload is expected to make*. The table
is built from the whole (unshuffled) trace: count pods per request key
``(cpu, gpu milli, gpu count, gpu spec)``, sort by count then key (both
descending), keep the shortest prefix covering 95 % of the pods and normalise the
counts of that prefix to probabilities. Memory is not part of the key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from sharing.packing.specs import GPU_MILLI, PodSpec

TypicalRule = Literal["present", "workload"]
TYPICAL_RULES: Final[tuple[TypicalRule, ...]] = ("present", "workload")
"""``present``: the GPU pods that exist when a pod is placed (the live controller's rule, the
default); ``workload``: every pod of the run, known in advance (the FGD protocol's)."""


def check_typical_rule(typical: str) -> None:
    """ValueError unless ``typical`` is one of :data:`TYPICAL_RULES`."""
    if typical not in TYPICAL_RULES:
        raise ValueError(f"unknown typical-pods rule {typical!r}; choose one of {', '.join(TYPICAL_RULES)}")

NO_GPU_POD: Final = PodSpec("no-gpu-pod-yet", 0, 0, 1, GPU_MILLI // 2)
"""The typical pod while no GPU pod exists yet (under the ``present`` rule a table needs one): half a
GPU, no CPU. The live controller's engines and the simulator's models all start from it."""

COVERAGE_PERCENT = 95
"""Share of pods the kept prefix must cover (the published simulator's threshold)."""

FgdKey = tuple[int, int, int, str]
"""A request key: ``(cpu milli, gpu milli, gpu count, gpu spec)`` (``PodSpec.fgd_key``)."""


def parse_gpu_spec(spec: str) -> tuple[str, ...]:
    """GPU models a ``|``-separated constraint accepts (empty parts dropped; empty = any)."""
    return tuple(part for part in spec.split("|") if part)


@dataclass(frozen=True)
class TypicalPods:
    """Request keys and their probabilities, most frequent first."""

    cpu_milli: tuple[int, ...]
    gpu_milli: tuple[int, ...]
    gpu_count: tuple[int, ...]
    gpu_spec: tuple[str, ...]
    probability: tuple[float, ...]
    covered_pods: int
    """Pods of the source trace whose key is kept."""
    total_pods: int

    def __len__(self) -> int:
        return len(self.probability)

    @classmethod
    def from_pods(cls, pods: Iterable[PodSpec], coverage_percent: int = COVERAGE_PERCENT) -> TypicalPods:
        return cls.from_counts(Counter(p.fgd_key for p in pods), coverage_percent)

    @classmethod
    def from_counts(cls, counts: Mapping[FgdKey, int], coverage_percent: int = COVERAGE_PERCENT) -> TypicalPods:
        """The table of pods counted per request key (``PodSpec.fgd_key``): what ``from_pods``
        builds, for a caller that keeps the counts as pods arrive (``TypicalCounts``)."""
        total = sum(counts.values())
        if total == 0:
            raise ValueError("typical pods need at least one pod")
        ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        kept: list[tuple[FgdKey, int]] = []
        cumulative = 0
        for key, count in ordered:
            kept.append((key, count))
            cumulative += count
            # Integer comparison, as the published code does: cum*100 >= 95*rows.
            if cumulative * 100 >= coverage_percent * total:
                break
        return cls(
            cpu_milli=tuple(k[0] for k, _ in kept),
            gpu_milli=tuple(k[1] for k, _ in kept),
            gpu_count=tuple(k[2] for k, _ in kept),
            gpu_spec=tuple(k[3] for k, _ in kept),
            probability=tuple(c / cumulative for _, c in kept),
            covered_pods=cumulative,
            total_pods=total,
        )

    def without_shared(self) -> TypicalPods:
        """The typical pods a whole-GPU node can take: CPU-only and whole-GPU ones.

        Under node-wide replicas a shared pod never lands on a node that hands
        out whole GPUs, so fragmentation on such a node is measured against the
        others only (probabilities renormalised). When no such pod is typical
        the table is returned unchanged, so a score is still defined.
        """
        kept = [
            k for k in range(len(self))
            if self.gpu_milli[k] == 0 or self.gpu_milli[k] >= GPU_MILLI or self.gpu_count[k] > 1
        ]
        if not kept or len(kept) == len(self):
            return self
        weight = sum(self.probability[k] for k in kept)
        return TypicalPods(
            cpu_milli=tuple(self.cpu_milli[k] for k in kept),
            gpu_milli=tuple(self.gpu_milli[k] for k in kept),
            gpu_count=tuple(self.gpu_count[k] for k in kept),
            gpu_spec=tuple(self.gpu_spec[k] for k in kept),
            probability=tuple(self.probability[k] / weight for k in kept),
            covered_pods=self.covered_pods,
            total_pods=self.total_pods,
        )

    def accessible(self, models: tuple[str, ...]) -> npt.NDArray[np.bool_]:
        """(len(models), K): typical pod k can use a GPU of model m (CPU-only pods never)."""
        out = np.zeros((len(models), len(self)), dtype=bool)
        for k, spec in enumerate(self.gpu_spec):
            if self.gpu_milli[k] == 0:
                continue
            allowed = parse_gpu_spec(spec)
            for m, model in enumerate(models):
                out[m, k] = not allowed or model in allowed
        return out


class TypicalCounts:
    """The typical pods of the pods counted so far, kept as pods arrive.

    A rule that measures fragmentation against the pods that exist now (the
    live controller's: ``controller.planning.draplan``) needs a new table as each pod
    arrives; counting the keys once, here, spares recounting every pod each
    time. ``table()`` equals ``TypicalPods.from_pods`` of the pods added.
    """

    def __init__(self, coverage_percent: int = COVERAGE_PERCENT) -> None:
        self.coverage_percent = coverage_percent
        self._counts: Counter[FgdKey] = Counter()

    def __len__(self) -> int:
        """Pods counted."""
        return self._counts.total()

    def add(self, pod: PodSpec) -> None:
        self._counts[pod.fgd_key] += 1

    def counts(self) -> Counter[FgdKey]:
        """A copy of the counts per request key."""
        return Counter(self._counts)

    def table(self) -> TypicalPods:
        """The table of the pods counted (ValueError when none is)."""
        return TypicalPods.from_counts(self._counts, self.coverage_percent)


def same_table(a: TypicalPods, b: TypicalPods) -> bool:
    """Whether ``a`` and ``b`` hold the same keys with the same probabilities: all a policy reads
    (``covered_pods`` and ``total_pods`` only describe the source)."""
    return (a.cpu_milli, a.gpu_milli, a.gpu_count, a.gpu_spec, a.probability) == (
        b.cpu_milli, b.gpu_milli, b.gpu_count, b.gpu_spec, b.probability)

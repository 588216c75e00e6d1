"""GPUs shared by shares sized from use: the fit rule, and the pool a right-sizer packs.

A share is a compute cap and a memory limit on one GPU (:class:`Size`, the request API's
``gpupack.io/gpu-milli`` and ``gpupack.io/gpu-memory``). :class:`FitRule` says whether a share
joins a GPU:

* **memory is never over-committed**: the memory limits on one GPU sum to at most its memory (a
  GPU cannot lend memory; use past it is an OOM);
* compute caps sum to at most ``1000 x compute_overcommit`` milli (1.0, none, unless a policy
  allows more), and, with ``duty_quantile`` set, the GPU's pods' predicted duty-cycle *sum*
  (``sharing.packing.duty_sum``) stays at most 100 % at that quantile: over-commit only against
  predicted use.

:class:`SharedGpus` is the pool of such GPUs: each GPU's load, each pod's seat, and a best fit
(the GPU with the least memory left after the share, lowest id on ties, or a new GPU). The right-
sizer's replay (``sharing.simulator.usage_replay``) and its consolidation
(``sharing.usage.consolidation``) place through it, and so will the controller's right-sizer.

Why a module of its own rather than a dimension of :class:`sharing.packing.cluster.ClusterState`:
that state is the openb model (CPU, memory and per-GPU milli of a fixed node set, scored by FGD
and its peers, compared with the literature); it has no GPU memory, and adding one would change
every policy's feasibility for traces that state none. Shares sized from use need GPU memory as
the binding dimension, a per-pod duty distribution, and a pool that grows as a replay needs GPUs.
Mutable for the same reason as ``ClusterState``: a replay changes it every step; :meth:`fork`
gives an independent copy for what-if questions (a consolidation's trial).
"""

from __future__ import annotations

from dataclasses import dataclass

from sharing.packing.duty_sum import PERCENTS, DutyProfile, quantile, summed
from sharing.packing.specs import GPU_MILLI


@dataclass(frozen=True)
class Size:
    """A container's request: compute milli (1..1000) and a memory limit in bytes."""

    milli: int
    memory_bytes: int

    def __post_init__(self) -> None:
        if not 1 <= self.milli <= GPU_MILLI or self.memory_bytes < 0:
            raise ValueError(f"a size needs milli in 1..{GPU_MILLI} and memory >= 0, got {self}")


@dataclass(frozen=True)
class GpuLoad:
    """What the shares on one GPU add up to."""

    milli: int = 0
    memory_bytes: int = 0

    def plus(self, size: Size) -> GpuLoad:
        return GpuLoad(self.milli + size.milli, self.memory_bytes + size.memory_bytes)

    def minus(self, size: Size) -> GpuLoad:
        return GpuLoad(self.milli - size.milli, self.memory_bytes - size.memory_bytes)


def fits(load: GpuLoad, size: Size, gpu_memory_bytes: int, compute_overcommit: float = 1.0) -> bool:
    """Whether ``size`` joins a GPU holding ``load`` by memory and compute caps (module docstring)."""
    if compute_overcommit < 1.0:
        raise ValueError(f"compute_overcommit must be at least 1.0, got {compute_overcommit}")
    return (load.memory_bytes + size.memory_bytes <= gpu_memory_bytes
            and load.milli + size.milli <= GPU_MILLI * compute_overcommit)


@dataclass(frozen=True)
class FitRule:
    """Which shares a GPU of ``gpu_memory_bytes`` admits (module docstring)."""

    gpu_memory_bytes: int
    compute_overcommit: float = 1.0
    duty_quantile: float | None = None
    """With a quantile (e.g. 0.999), the predicted duty sum of the GPU's pods at that quantile must
    stay at most 100 %; a pod without a profile counts at its cap. None: caps only."""

    def __post_init__(self) -> None:
        if self.gpu_memory_bytes <= 0 or self.compute_overcommit < 1.0:
            raise ValueError(f"a fit rule needs GPU memory and compute_overcommit >= 1.0, got {self}")
        if self.duty_quantile is not None and not 0 < self.duty_quantile <= 1:
            raise ValueError(f"duty_quantile must be in (0, 1], got {self.duty_quantile}")


def _cap_profile(size: Size) -> DutyProfile:
    """A pod without a profile is predicted at its cap, always."""
    percent = min(100, -(-size.milli * 100 // GPU_MILLI))
    return tuple(1.0 if i == percent else 0.0 for i in range(PERCENTS))


class SharedGpus:
    """A growing pool of shared GPUs: loads, seats and best fit under one :class:`FitRule`."""

    def __init__(self, rule: FitRule) -> None:
        self.rule = rule
        self.loads: dict[int, GpuLoad] = {}
        self.seats: dict[str, tuple[int, Size]] = {}
        self.duties: dict[str, DutyProfile] = {}
        self.on: dict[int, set[str]] = {}
        self.next_id = 0

    def pods_on(self, gpu: int) -> list[str]:
        return sorted(self.on.get(gpu, ()))

    def admits(self, gpu: int, size: Size, duty: DutyProfile | None = None) -> bool:
        """Whether ``gpu`` takes a share of ``size`` (and ``duty``) beside the shares it holds."""
        load = self.loads.get(gpu, GpuLoad())
        others = self.pods_on(gpu)
        if not fits(load, size, self.rule.gpu_memory_bytes, self.rule.compute_overcommit):
            return False
        if self.rule.duty_quantile is None or not others:
            return True
        profiles = [self.duties.get(p) or _cap_profile(self.seats[p][1]) for p in others]
        profiles.append(duty or _cap_profile(size))
        return quantile(summed(profiles), self.rule.duty_quantile) <= 100

    def best_fit(self, size: Size, duty: DutyProfile | None = None, avoid: int | None = None) -> int | None:
        """The GPU that admits the share with the least memory left after it (lowest id on ties)."""
        best: tuple[int, int] | None = None
        for gpu, load in sorted(self.loads.items()):
            left = self.rule.gpu_memory_bytes - load.memory_bytes - size.memory_bytes
            if gpu != avoid and (best is None or (left, gpu) < best) and self.admits(gpu, size, duty):
                best = (left, gpu)
        return None if best is None else best[1]

    def seat(self, pod: str, size: Size, duty: DutyProfile | None = None, avoid: int | None = None) -> int:
        """Seat ``pod`` by best fit, or on a new GPU; its old share is held until then
        (make-before-break), then freed. Returns the GPU."""
        gpu = self.best_fit(size, duty, avoid)
        if gpu is None:
            gpu = self.next_id
            self.next_id += 1
        self.place(pod, size, gpu, duty)
        return gpu

    def place(self, pod: str, size: Size, gpu: int, duty: DutyProfile | None = None) -> None:
        """Seat ``pod`` on ``gpu`` (any id; a new one joins the pool), then free its old share."""
        self.loads[gpu] = self.loads.get(gpu, GpuLoad()).plus(size)
        self.on.setdefault(gpu, set())
        self.next_id = max(self.next_id, gpu + 1)
        self.leave(pod)
        self.seats[pod] = (gpu, size)
        self.on[gpu].add(pod)
        if duty is not None:
            self.duties[pod] = duty

    def set_duty(self, pod: str, duty: DutyProfile | None) -> None:
        """A seated pod's duty profile as its history now has it (None: predicted at its cap)."""
        if duty is None:
            self.duties.pop(pod, None)
        elif pod in self.seats:
            self.duties[pod] = duty

    def leave(self, pod: str) -> None:
        """Free ``pod``'s share; a GPU left empty leaves the pool."""
        if pod in self.seats:
            gpu, size = self.seats.pop(pod)
            self.duties.pop(pod, None)
            self.loads[gpu] = self.loads[gpu].minus(size)
            self.on[gpu].discard(pod)
            if not self.on[gpu]:
                del self.loads[gpu], self.on[gpu]

    def fork(self) -> SharedGpus:
        """An independent copy (what-if): changes to it leave this pool alone."""
        other = SharedGpus(self.rule)
        other.loads, other.seats, other.duties = dict(self.loads), dict(self.seats), dict(self.duties)
        other.on = {gpu: set(pods) for gpu, pods in self.on.items()}
        other.next_id = self.next_id
        return other

"""The two packings a usage-aware run is compared with: the oracle and the naive static packing.

Both are the issue's (35) definitions, kept here so every run reports them beside its own figures:

* **Oracle**: at every step, re-pack every live pod knowing its use at that step: first fit
  decreasing by memory used, a GPU taking a pod while the memory used sums to at most the GPU's
  and the duty cycles to at most 100 %. No limits, no cost for a move: the bound no online
  policy reaches, and the measure of the gap. **The peak oracle** packs the same way with each
  pod's memory its whole life's peak at every step: the bound of any packing that gives each pod
  a hard memory limit, however well it knows the pod.
* **Static**: each pod holds a whole GPU for its first ``warmup_s`` (6 h), then is sized once by
  the ``duty_percentile`` (95th) of its duty cycle and ``memory_margin`` (1.1) x its peak memory
  over those hours, and placed by first fit on a GPU whose limits and sizes leave room (limits
  summing to at most the GPU's memory, sizes to at most 100 %), where it stays. Its limit is
  hard: use above it is an OOM, counted by ``pod_minutes_over_limit_pct``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sharing.simulator.usage_figures import Seat, Seating
from sharing.usage.trace import PodUsage, UsageTrace

DUTY_CAPACITY = 100.0


@dataclass(frozen=True)
class Item:
    """Something to place: a pod, the memory and the duty cycle it takes."""

    pod: str
    memory_bytes: int
    duty_percent: float


def first_fit_decreasing(items: Sequence[Item], memory_capacity: int) -> dict[str, int]:
    """pod -> GPU index (0, 1, ...): items by decreasing memory, each on the first GPU with room."""
    loads: list[tuple[int, float]] = []
    out: dict[str, int] = {}
    for item in sorted(items, key=lambda i: (-i.memory_bytes, -i.duty_percent, i.pod)):
        for index, (memory, duty) in enumerate(loads):
            if memory + item.memory_bytes <= memory_capacity and duty + item.duty_percent <= DUTY_CAPACITY:
                loads[index] = (memory + item.memory_bytes, duty + item.duty_percent)
                out[item.pod] = index
                break
        else:
            out[item.pod] = len(loads)
            loads.append((item.memory_bytes, item.duty_percent))
    return out


def live(trace: UsageTrace, step: int) -> list[PodUsage]:
    return [p for p in trace.pods if p.first_step <= step < p.end_step]


def oracle_seatings(trace: UsageTrace, gpu_memory_bytes: int, *, by_peak: bool = False) -> Iterator[Seating]:
    """The oracle's seating at each step (module docstring); ``by_peak``: each pod takes its whole
    life's peak memory at every step, the bound of any packing by per-pod hard memory limits."""
    peaks = {p.pod: max(p.memory_bytes) for p in trace.pods}
    for step in range(trace.steps):
        items = [Item(p.pod, peaks[p.pod] if by_peak else p.memory_bytes[step - p.first_step],
                      p.duty_percent[step - p.first_step]) for p in live(trace, step)]
        yield {pod: Seat(gpu) for pod, gpu in first_fit_decreasing(items, gpu_memory_bytes).items()}


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


@dataclass(frozen=True)
class StaticRule:
    """The naive static sizing (module docstring); defaults are the issue's."""

    warmup_s: float = 6 * 3600.0
    duty_percentile: float = 95.0
    memory_margin: float = 1.1


def static_seatings(trace: UsageTrace, gpu_memory_bytes: int, rule: StaticRule = StaticRule()) -> Iterator[Seating]:
    """The naive static packing's seating at each step (module docstring)."""
    warmup = max(1, round(rule.warmup_s / trace.step_s))
    ids = iter(range(1 << 62))
    whole = {p.pod: next(ids) for p in trace.pods}  # the GPU each pod first asks for, whole
    loads: dict[int, tuple[int, float]] = {}  # shared GPU -> (limits, sizes) of the pods on it
    placed: dict[str, tuple[int, Item]] = {}  # pod -> (its shared GPU, its size)
    for step in range(trace.steps):
        for pod in trace.pods:
            if pod.end_step == step and pod.pod in placed:  # gone: its share frees
                gpu, item = placed.pop(pod.pod)
                memory, duty = loads[gpu]
                loads[gpu] = (memory - item.memory_bytes, duty - item.duty_percent)
        ready = [Item(p.pod, min(gpu_memory_bytes, math.ceil(rule.memory_margin * max(p.memory_bytes[:warmup]))),
                      percentile(p.duty_percent[:warmup], rule.duty_percentile))
                 for p in trace.pods if step == p.first_step + warmup and step < p.end_step]
        for item in sorted(ready, key=lambda i: (-i.memory_bytes, i.pod)):
            room = next((g for g, (m, d) in loads.items()
                         if m + item.memory_bytes <= gpu_memory_bytes and d + item.duty_percent <= DUTY_CAPACITY), None)
            if room is None:
                room = next(ids)
                loads[room] = (0, 0.0)
            memory, duty = loads[room]
            loads[room] = (memory + item.memory_bytes, duty + item.duty_percent)
            placed[item.pod] = (room, item)
        yield {p.pod: Seat(placed[p.pod][0], placed[p.pod][1].memory_bytes) if p.pod in placed else Seat(whole[p.pod])
               for p in live(trace, step)}

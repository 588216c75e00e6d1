"""The measuring stick of a usage replay: where each pod sat at each step, read into the issue-35 figures.

A run (a packing of a usage trace, ``sharing.simulator.usage``) says, for every grid step of the
trace and every pod alive then, the GPU it sits on and the memory limit it was given
(:class:`Seat`). One reading turns that into the figures every policy is compared by, so the
oracle, the naive static packing and the product's own modes are measured alike:

* ``gpu_hours_baseline``: one GPU per live pod (what the trace's pods held);
* ``gpu_hours``: the distinct GPUs holding a live pod, per step;
* ``saturated_gpu_minutes_pct``: GPU-steps whose pods' duty cycles sum above 100 %;
* ``gpu_memory_overflow_minutes``: GPU-minutes whose pods' memory sums above the GPU's. A pod
  with a hard limit holds at most its limit (beyond it, it is killed: an OOM, counted next);
* ``pod_minutes_over_limit_pct``: pod-steps whose use is above the pod's limit;
* ``evictions_per_pod_day``: moves (a live pod on another GPU than at its previous step) per
  pod-day; ``evictions_after_first_per_pod_day`` leaves out each pod's first move, the one off
  the whole GPU it first asked for (the target counts moves after a pod's first recommendation).

A step is the trace's sample interval (57 s in GenTD26): "minutes" in the names are steps,
and the one absolute figure (overflow) is converted to minutes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sharing.usage.trace import UsageTrace


@dataclass(frozen=True)
class Seat:
    """Where a pod sits at one step: a GPU of the run (any id) and its memory limit (None: no limit)."""

    gpu: int
    limit_bytes: int | None = None


Seating = Mapping[str, Seat]
"""pod -> its seat, for the pods alive at one step."""


@dataclass(frozen=True)
class UsageFigures:
    """One run's figures under the issue's JSON names (module docstring)."""

    pods: int
    gpu_hours_baseline: float
    gpu_hours: float
    gpu_hours_saved_pct: float
    saturated_gpu_minutes_pct: float
    gpu_memory_overflow_minutes: float
    pod_minutes_over_limit_pct: float
    evictions_per_pod_day: float
    evictions_after_first_per_pod_day: float


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def measure(trace: UsageTrace, gpu_memory_bytes: int, seatings: Iterable[Seating], *,
            from_step: int = 0) -> UsageFigures:
    """The figures of a run that seated ``trace``'s pods step by step (one seating per step, from
    step 0), counted from ``from_step`` on (a warm-up left out); every live pod must be seated."""
    step_hours = trace.step_s / 3600.0
    pod_steps = gpu_steps = saturated = overflow = over_limit = moves = first_moves = 0
    last_gpu: dict[str, int] = {}
    moved: set[str] = set()
    live_pods: set[str] = set()
    for step, seating in enumerate(seatings):
        duty: dict[int, float] = {}
        memory: dict[int, int] = {}
        for pod in trace.pods:
            if not pod.first_step <= step < pod.end_step:
                continue
            seat = seating.get(pod.pod)
            if seat is None:
                raise ValueError(f"pod {pod.pod} is alive at step {step} but the run seated it nowhere")
            used = pod.memory_bytes[step - pod.first_step]
            over = seat.limit_bytes is not None and used > seat.limit_bytes
            was = last_gpu.get(pod.pod)
            last_gpu[pod.pod] = seat.gpu
            if step < from_step:
                continue
            live_pods.add(pod.pod)
            pod_steps += 1
            over_limit += over
            if was is not None and was != seat.gpu:
                if pod.pod in moved:
                    moves += 1
                else:
                    first_moves += 1
                    moved.add(pod.pod)
            duty[seat.gpu] = duty.get(seat.gpu, 0.0) + pod.duty_percent[step - pod.first_step]
            held = used if seat.limit_bytes is None else min(used, seat.limit_bytes)
            memory[seat.gpu] = memory.get(seat.gpu, 0) + held
        gpu_steps += len(duty)
        saturated += sum(1 for d in duty.values() if d > 100.0 + 1e-9)
        overflow += sum(1 for m in memory.values() if m > gpu_memory_bytes)
    pod_days = pod_steps * trace.step_s / 86400.0
    return UsageFigures(
        pods=len(live_pods),
        gpu_hours_baseline=round(pod_steps * step_hours, 2),
        gpu_hours=round(gpu_steps * step_hours, 2),
        gpu_hours_saved_pct=_pct(pod_steps - gpu_steps, pod_steps),
        saturated_gpu_minutes_pct=_pct(saturated, gpu_steps),
        gpu_memory_overflow_minutes=round(overflow * trace.step_s / 60.0, 1),
        pod_minutes_over_limit_pct=_pct(over_limit, pod_steps),
        evictions_per_pod_day=round((moves + first_moves) / pod_days, 3) if pod_days else 0.0,
        evictions_after_first_per_pod_day=round(moves / pod_days, 3) if pod_days else 0.0,
    )

"""A GenTD26 usage trace read into per-pod series: GPU duty cycle (%) and GPU memory used (bytes).

The format is the public Alibaba ``cluster-trace-v2026-GenAI`` pair of CSV files,
``pod_gpu_duty_cycle_anon.csv`` and ``pod_gpu_memory_used_bytes_anon.csv``, one row per
sample with the columns ``value``, ``timestamp_anon`` and ``container_ip`` *in any order*
(the two published files order them differently, so columns are found by the header).
``container_ip`` names the pod and joins the two files.

Pure: this module parses lines it is given. Opening the files (refusing a FIFO or a device)
is the caller's edge (``gpupack.cli.load_usage_trace``), so ``gpupack simulate usage`` and the
node agent's simulated NVML (``sharing.usage.playback``) read the same trace through this one reader.

Rules for bad input, each counted in :class:`SignalCounts` so a run says what it dropped:

* A missing column, a row with the wrong number of fields, an empty ``container_ip`` or a
  timestamp that is not a finite number is an error (:class:`UsageTraceError`) naming the
  source and line: such a row cannot be placed, and guessing would move use between pods.
* A value that is not a number, NaN or infinite (``nan``), below zero (``negative``), or
  beyond what a GPU can report (``absurd``: a duty cycle above 100 %, memory above
  :data:`MAX_MEMORY_BYTES`) is dropped and treated as a missing sample.
* Timestamps are placed on one grid: its step is the most common gap between the trace's
  consecutive sample times (57 s in GenTD26), its origin the first sample time; a time off the
  grid goes to the nearest step. A second sample of a pod on one step is a ``duplicate``; the
  earlier one (at the same time, the one read first) is kept.
* A pod lives from its first sample to its last, in either file. A step of its life with no
  sample of a signal (a gap, or a dropped value) takes that signal's last value before it, or,
  before the signal's first sample, its first value (``filled``).
* A pod with no usable sample of one of the signals is left out (``UsageTrace.left_out``):
  its use cannot be attributed, so nothing may size it.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from mig.catalog import all_models

COLUMNS = ("value", "timestamp_anon", "container_ip")
DUTY_FILE = "pod_gpu_duty_cycle_anon.csv"
MEMORY_FILE = "pod_gpu_memory_used_bytes_anon.csv"
"""The trace folder's two files, as the published trace names them."""
Signal = Literal["duty", "memory"]
MAX_DUTY_PERCENT = 100.0
MAX_MEMORY_BYTES = max(model.memory_mib for model in all_models()) * 1024 * 1024
"""The largest GPU memory the catalog knows: a pod cannot use more than its GPU has."""


class UsageTraceError(ValueError):
    """A usage trace that cannot be read; the message names source, line and problem."""


@dataclass(frozen=True)
class SignalCounts:
    """What one file held and what its rules did to it (see the module docstring)."""

    rows: int = 0
    nan: int = 0
    negative: int = 0
    absurd: int = 0
    duplicate: int = 0
    filled: int = 0


@dataclass(frozen=True)
class PodUsage:
    """One pod's use, one value per grid step from ``first_step`` to its last sample."""

    pod: str
    first_step: int
    duty_percent: tuple[float, ...]
    memory_bytes: tuple[int, ...]

    @property
    def end_step(self) -> int:
        """The step after the pod's last one."""
        return self.first_step + len(self.duty_percent)


@dataclass(frozen=True)
class UsageTrace:
    """A whole trace: the grid (``start_s``, ``step_s``, ``steps``), its pods by name, the counts."""

    start_s: float
    step_s: float
    steps: int
    pods: tuple[PodUsage, ...]
    duty: SignalCounts
    memory: SignalCounts
    left_out: tuple[str, ...] = field(default=())


Samples = dict[str, dict[float, float]]
"""pod -> sample time -> value, as read (NaN when dropped)."""


def _read(lines: Iterable[str], source: str, signal: Signal) -> tuple[Samples, Counter[str]]:
    reader = csv.reader(lines)
    header = [name.strip() for name in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise UsageTraceError(f"{source}:1: missing column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)} "
                              "in any order")
    at = {name: header.index(name) for name in COLUMNS}
    samples: Samples = {}
    counts: Counter[str] = Counter()
    limit = MAX_DUTY_PERCENT if signal == "duty" else float(MAX_MEMORY_BYTES)
    try:
        for row in reader:
            line = reader.line_num
            if not row:
                continue  # a blank line holds no sample
            if len(row) != len(header):
                raise UsageTraceError(f"{source}:{line}: expected {len(header)} fields, got {len(row)}")
            pod = row[at["container_ip"]].strip()
            if not pod:
                raise UsageTraceError(f"{source}:{line}: empty container_ip")
            time_s = _number(row[at["timestamp_anon"]])
            if not math.isfinite(time_s):
                raise UsageTraceError(f"{source}:{line}: timestamp_anon must be a number, "
                                      f"got {row[at['timestamp_anon']]!r}")
            counts["rows"] += 1
            value = _number(row[at["value"]])
            if not math.isfinite(value):
                counts["nan"] += 1
                value = math.nan
            elif value < 0:
                counts["negative"] += 1
                value = math.nan
            elif value > limit:
                counts["absurd"] += 1
                value = math.nan
            per_pod = samples.setdefault(pod, {})
            if time_s in per_pod:
                counts["duplicate"] += 1
                continue
            per_pod[time_s] = value
    except csv.Error as exc:
        raise UsageTraceError(f"{source}: malformed CSV ({exc})") from None
    return samples, counts


def _number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        return math.nan


def _grid(times: set[float]) -> tuple[float, float]:
    """(origin, step): the first time and the most common gap between consecutive times."""
    ordered = sorted(times)
    gaps = Counter(round(b - a, 3) for a, b in zip(ordered, ordered[1:]))
    if not gaps:
        raise UsageTraceError("a usage trace needs samples at two different times at least")
    return ordered[0], gaps.most_common(1)[0][0]


def _series(samples: dict[float, float], origin: float, step: float, first: int, end: int,
            counts: Counter[str]) -> list[float] | None:
    """One signal over steps ``first .. end - 1``, gaps filled; None when no value is usable."""
    values: dict[int, float] = {}
    seen: set[int] = set()
    for time_s, value in sorted(samples.items()):
        index = round((time_s - origin) / step)
        if index in seen:
            counts["duplicate"] += 1
            continue
        seen.add(index)
        if not math.isnan(value):
            values[index] = value
    if not values:
        return None
    last = values[min(values)]  # before the signal's first sample: its first value
    out = []
    for index in range(first, end):
        if index in values:
            last = values[index]
        else:
            counts["filled"] += 1
        out.append(last)
    return out


def parse_usage(duty_lines: Iterable[str], memory_lines: Iterable[str], *, duty_source: str = "duty",
                memory_source: str = "memory") -> UsageTrace:
    """The trace of the two files' lines (header first); sources name them in errors."""
    duty, duty_counts = _read(duty_lines, duty_source, "duty")
    memory, memory_counts = _read(memory_lines, memory_source, "memory")
    times = {t for signal in (duty, memory) for per_pod in signal.values() for t in per_pod}
    origin, step = _grid(times)
    pods: list[PodUsage] = []
    left_out: list[str] = []
    for pod in sorted(set(duty) | set(memory)):
        steps = [round((t - origin) / step) for signal in (duty, memory) for t in signal.get(pod, {})]
        first, end = min(steps), max(steps) + 1
        duty_series = _series(duty.get(pod, {}), origin, step, first, end, duty_counts)
        memory_series = _series(memory.get(pod, {}), origin, step, first, end, memory_counts)
        if duty_series is None or memory_series is None:
            left_out.append(pod)
            continue
        pods.append(PodUsage(pod, first, tuple(duty_series), tuple(round(m) for m in memory_series)))
    if not pods:
        raise UsageTraceError(f"{duty_source}, {memory_source}: no pod has usable samples of both duty cycle "
                              "and memory")
    return UsageTrace(
        start_s=origin,
        step_s=step,
        steps=max(p.end_step for p in pods),
        pods=tuple(pods),
        duty=SignalCounts(**duty_counts),
        memory=SignalCounts(**memory_counts),
        left_out=tuple(left_out),
    )

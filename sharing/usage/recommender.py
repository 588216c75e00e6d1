"""The right-sizer's recommender: from observed GPU use to a size per workload and container.

One history per :class:`WorkloadKey` (an owner reference and a container name): every pod of the
workload adds its samples to it, as the Kubernetes VPA aggregates a workload's containers.

* **Compute** is the ``duty_percentile`` of a decaying histogram of the duty cycle
  (``sharing.usage.histogram``), times ``1 + duty_margin``, at most 100 %.
* **Memory** is the peak over a sliding window (``sharing.usage.peaks``), times one plus a margin
  that starts at ``first_memory_margin`` and shrinks to ``memory_margin`` as the history grows
  (:meth:`Recommender.memory_margin`). GPU memory is not elastic: use above a limit is an OOM, so
  memory is sized from its peak rather than a percentile.
* **An OOM or memory-limit hit raises the memory at once** (Google Autopilot's method, which VPA
  follows): the memory the container was allowed, times ``oom_bump_ratio`` and at least
  ``oom_min_bump_bytes`` more, is a peak sample the margin applies to, as in VPA (or, without
  ``margin_over_oom``, a floor of the recommendation for the window).
* **Confidence** grows with observed time: the lesser of the history's span and its samples
  times ``sample_interval_s``, in days (VPA's measure). No recommendation is made before
  ``min_observed_s`` of history: a pod keeps what it asked for until then.
* **Duty profile**: the histogram's shares of time per whole percent
  (:meth:`Recommender.duty_profile`), from which placement predicts the *sum* of a GPU's pods'
  duty cycles (``sharing.packing.duty_sum``).

Pure and clock-free: callers pass sample times, so the simulator replays a trace and a live
recommender its scrapes through the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sharing.packing.duty_sum import PERCENTS, DutyProfile, profile
from sharing.usage.histogram import DecayingHistogram, HistogramOptions
from sharing.usage.peaks import PeakOptions, WindowedPeak

MIB = 1024 * 1024
DAY_S = 24 * 3600.0


@dataclass(frozen=True, order=True)
class WorkloadKey:
    """A workload's container: its owner reference (namespace, kind, name) and the container's name."""

    namespace: str
    kind: str
    name: str
    container: str


@dataclass(frozen=True)
class RecommenderSettings:
    """How use becomes a recommendation; every field's unit and reason in its docstring."""

    duty_percentile: float = 0.99
    """Share (0..1) of the decayed duty-cycle weight the compute recommendation covers: bursts from
    0 % are the norm in inference, and at 0.95 shared GPUs saturate in 0.1-0.6 % of minutes on
    the GenTD26 half (docs/usage.md)."""
    duty_margin: float = 0.15
    """Compute headroom over the percentile (VPA's safety margin, 15 %)."""
    memory_margin: float = 0.05
    """Memory headroom over the window's peak once the history is settled (``margin_settle_s``).
    5 %: on the GenTD26 half two pods share an 80 GB GPU only when their peaks with the margin sum
    to at most its memory; knowing their lifetime peaks, 26 pairs of the 63 long-lived pods form at
    5 % and 19 at 10 %. The OOMs a small margin costs are bounded by ``first_memory_margin`` and the
    OOM bump (docs/usage.md)."""
    oom_bump_ratio: float = 1.1
    """After an OOM, memory is at least 1.1 x what the container was allowed. VPA bumps by 1.2; on
    the GenTD26 half 1.2 lifts a 37 GiB pod to 44 GiB, past what pairs on an 80 GB GPU (2 points
    of GPU-hours on H100), while 1.1 keeps OOMs under the target because an OOM-killed pod moves
    at once (``sharing.usage.updater``)."""
    margin_over_oom: bool = True
    """Whether an OOM's bumped memory counts as a peak, the margin then applying on top of the bump
    (VPA's way, and the one the agents' compact histories carry: ``sharing.usage.compact`` keeps
    peaks), or only as a floor of the recommendation, the bump being the OOM's own margin. The
    floor measured 1.1 points more GPU-hours saved on 80 GB GPUs on the GenTD26 half
    (docs/usage.md), but the compact form does not carry it yet (``compact.merged`` does)."""
    oom_min_bump_bytes: int = 100 * MIB
    """... and at least 100 MiB more than it (VPA's minimum bump)."""
    first_memory_margin: float | None = 0.5
    """Memory headroom of the first recommendation, at ``min_observed_s``, shrinking linearly to
    ``memory_margin`` at ``margin_settle_s`` of history: a short history has seen fewer of the
    pod's peaks (model and adapter loads come later). None: ``memory_margin`` from the start."""
    margin_settle_s: float = 6 * 3600.0
    """History after which the memory headroom is ``memory_margin`` (with ``first_memory_margin``)."""
    min_observed_s: float = 3600.0
    """No recommendation before an hour of history: a pod keeps what it asked for until then. With a
    constant 10 % margin one hour gave 2.5 x the OOMs of two; with the first recommendation's
    wider margin (``first_memory_margin``) an hour costs none more than two, and two hours save
    2.6-3.5 points of GPU-hours less (docs/usage.md, learning time)."""
    sample_interval_s: float = 60.0
    """The expected time between samples, to turn a sample count into time for the confidence."""
    duty: HistogramOptions = field(default_factory=lambda: HistogramOptions(max_value=100.0, first_bucket=0.5))
    """Duty cycle in percent: 50 buckets from 0.5 % wide up to 100 %, half-life one day."""
    memory: PeakOptions = field(default_factory=PeakOptions)
    """Memory peaks per hour, remembered for a day."""

    def __post_init__(self) -> None:
        if not 0 < self.duty_percentile <= 1:
            raise ValueError(f"duty_percentile must be in (0, 1], got {self.duty_percentile}")
        if min(self.duty_margin, self.memory_margin, self.min_observed_s) < 0 or self.oom_bump_ratio < 1:
            raise ValueError("margins and min_observed_s must not be negative, and oom_bump_ratio at least 1")
        if self.first_memory_margin is not None and self.first_memory_margin < 0:
            raise ValueError(f"first_memory_margin must not be negative, got {self.first_memory_margin}")
        if self.sample_interval_s <= 0:
            raise ValueError(f"sample_interval_s must be positive, got {self.sample_interval_s}")


@dataclass(frozen=True)
class Recommendation:
    """A size for one workload's container, and how much history stands behind it."""

    duty_percent: float
    """Compute, in percent of one GPU (1000 gpu-milli = 100 %)."""
    memory_bytes: int
    observed_s: float
    """The history's span: first sample to last."""
    confidence_days: float
    ooms: int
    """Memory-limit hits recorded for this container (each raised the memory at once)."""


class ContainerHistory:
    """One workload container's history (mutable: updated per sample, see the histogram's reason)."""

    def __init__(self, settings: RecommenderSettings) -> None:
        self.duty = DecayingHistogram(settings.duty)
        self.memory = WindowedPeak(settings.memory)
        self.oom_floor = WindowedPeak(settings.memory)
        """The memory OOMs asked for, kept apart when ``margin_over_oom`` is off."""
        self.first_s = math.inf
        self.last_s = -math.inf
        self.samples = 0
        self.ooms = 0
        self.memory_last_s = -math.inf
        """The last memory sample's time, memory-only ones included (:meth:`observe_memory`)."""

    def observe(self, time_s: float, duty_percent: float, memory_bytes: int) -> None:
        self.duty.add(duty_percent, time_s)
        self.memory.add(float(memory_bytes), time_s)
        self.first_s = min(self.first_s, time_s)
        self.last_s = max(self.last_s, time_s)
        self.memory_last_s = max(self.memory_last_s, time_s)
        self.samples += 1

    @property
    def memory_observed_s(self) -> float:
        """How long memory has been watched: from the first sample to the last memory sample. It
        grows while the workload's pods are MPS clients, whose compute is not read, so the memory
        margin settles on memory seen, not on compute seen."""
        if self.samples == 0:
            return 0.0
        return max(self.last_s, self.memory_last_s) - self.first_s

    def observe_memory(self, time_s: float, memory_bytes: int) -> None:
        """A sample whose compute is not the pod's own to read (an MPS client: NVML gives its SM
        samples to the MPS server, benchmarks/nvml_usage_check.md): its memory peak only. It does
        not count as observed time, which measures the compute seen; it extends the memory's
        (:attr:`memory_observed_s`)."""
        self.memory.add(float(memory_bytes), time_s)
        self.memory_last_s = max(self.memory_last_s, time_s)


class Recommender:
    """Histories by workload container, and recommendations from them (module docstring)."""

    def __init__(self, settings: RecommenderSettings = RecommenderSettings()) -> None:
        self.settings = settings
        self.histories: dict[WorkloadKey, ContainerHistory] = {}

    def _history(self, key: WorkloadKey) -> ContainerHistory:
        history = self.histories.get(key)
        if history is None:
            history = self.histories[key] = ContainerHistory(self.settings)
        return history

    def observe(self, key: WorkloadKey, time_s: float, duty_percent: float, memory_bytes: int) -> None:
        """One sample of one of the workload's pods."""
        self._history(key).observe(time_s, duty_percent, memory_bytes)

    def observe_memory(self, key: WorkloadKey, time_s: float, memory_bytes: int) -> None:
        """One memory-only sample of one of the workload's pods (``ContainerHistory.observe_memory``)."""
        self._history(key).observe_memory(time_s, memory_bytes)

    def record_oom(self, key: WorkloadKey, time_s: float, allowed_bytes: int) -> None:
        """The container hit its memory limit of ``allowed_bytes``: raise its memory at once."""
        history = self._history(key)
        bumped = max(allowed_bytes * self.settings.oom_bump_ratio, allowed_bytes + self.settings.oom_min_bump_bytes)
        (history.memory if self.settings.margin_over_oom else history.oom_floor).add(bumped, time_s)
        history.ooms += 1

    def recommend(self, key: WorkloadKey) -> Recommendation | None:
        """The container's recommendation, or None before ``min_observed_s`` of history (or none at all)."""
        history = self.histories.get(key)
        if history is None or history.samples == 0:
            return None
        observed = history.last_s - history.first_s
        if observed < self.settings.min_observed_s:
            return None
        s = self.settings
        duty = min(100.0, history.duty.percentile(s.duty_percentile) * (1 + s.duty_margin))
        margin = self.memory_margin(history.memory_observed_s)
        memory = math.ceil(max(history.memory.peak() * (1 + margin), history.oom_floor.peak()))
        confidence = min(observed, history.samples * s.sample_interval_s) / DAY_S
        return Recommendation(duty, memory, observed, confidence, history.ooms)

    def duty_profile(self, key: WorkloadKey) -> DutyProfile | None:
        """The container's decayed share of time at each whole percent of duty cycle, 0..100, once it
        has a recommendation (None before): what a GPU's predicted duty *sum* is made from
        (``sharing.packing.duty_sum``). Apart from :meth:`recommend` because only placement needs it."""
        history = self.histories.get(key)
        if history is None or self.recommend(key) is None:
            return None
        weights = history.duty.unit_weights()
        return profile(weights) if len(weights) <= PERCENTS and sum(weights) > 0 else None

    def memory_margin(self, observed_s: float) -> float:
        """The memory headroom after ``observed_s`` of history (``first_memory_margin``'s schedule)."""
        s = self.settings
        if s.first_memory_margin is None:
            return s.memory_margin
        span = s.margin_settle_s - s.min_observed_s
        done = 1.0 if span <= 0 else min(1.0, max(0.0, (observed_s - s.min_observed_s) / span))
        return s.first_memory_margin + (s.memory_margin - s.first_memory_margin) * done

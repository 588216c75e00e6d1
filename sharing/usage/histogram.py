"""A decaying histogram with exponential buckets: how the Kubernetes VPA keeps a signal's history.

Buckets grow geometrically: bucket ``i`` starts at ``first_bucket * (ratio**i - 1) / (ratio - 1)``,
so small values (most of a GPU's duty cycle is 0-10 %) are told apart finely and large ones
coarsely, in a few dozen buckets whatever the history's length. A sample's weight is multiplied
by ``2 ** ((t - reference) / half_life)``: a sample one half-life older counts half as much, so
the histogram follows a workload that changes while keeping a long memory of rare peaks. The
weights grow with time instead of old ones shrinking (one multiplication per sample); when they
would grow past ``2**MAX_DECAY_EXPONENT`` the reference moves forward and every weight is scaled
down once, which changes no percentile.

A percentile is the end of the bucket where the running weight reaches that share of the total:
an upper estimate, never below the value it stands for by more than the bucket's width.

Mutable on purpose: a node or a recommender updates one histogram per container per sample, at
10,000 containers; copying a frozen value per sample would cost more than the update.
:class:`HistogramOptions` (the shape) is a frozen value, and two histograms of one shape merge
(a workload's containers into one), as VPA aggregates containers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_DECAY_EXPONENT = 100
"""Renormalise when a new sample's decay factor would pass 2**100 (floats hold up to 2**1023)."""
EPSILON = 1e-4
"""Weight under which a histogram counts as empty (VPA's epsilon, the same role)."""


@dataclass(frozen=True)
class HistogramOptions:
    """A histogram's shape: values ``0 .. max_value`` in exponential buckets, and the half-life."""

    max_value: float
    first_bucket: float
    ratio: float = 1.05
    """Each bucket 5 % wider than the one before (VPA's default)."""
    half_life_s: float = 24 * 3600.0
    """A day, as VPA's default: a sample one day old counts half."""

    def __post_init__(self) -> None:
        if not (self.max_value > 0 and self.first_bucket > 0 and self.ratio > 1 and self.half_life_s > 0):
            raise ValueError(f"histogram options must be positive with ratio above 1, got {self}")

    @property
    def buckets(self) -> int:
        """How many buckets cover ``0 .. max_value``."""
        return self.bucket(self.max_value) + 1

    def bucket(self, value: float) -> int:
        """The bucket holding ``value`` (clamped to ``0 .. max_value``)."""
        value = min(max(value, 0.0), self.max_value)
        return int(math.floor(math.log(1 + value * (self.ratio - 1) / self.first_bucket, self.ratio)))

    def bucket_start(self, index: int) -> float:
        return self.first_bucket * (self.ratio**index - 1) / (self.ratio - 1)


class DecayingHistogram:
    """A signal's decaying history (module docstring)."""

    def __init__(self, options: HistogramOptions) -> None:
        self.options = options
        self.weights = [0.0] * options.buckets
        self.reference_s = 0.0
        self.started = False

    @property
    def total_weight(self) -> float:
        return sum(self.weights)

    def is_empty(self) -> bool:
        return self.total_weight < EPSILON

    def add(self, value: float, time_s: float, weight: float = 1.0) -> None:
        """Count ``value`` seen at ``time_s`` with ``weight`` (before decay)."""
        if not self.started:
            self.reference_s, self.started = time_s, True
        exponent = (time_s - self.reference_s) / self.options.half_life_s
        if exponent > MAX_DECAY_EXPONENT:
            self._shift_reference(time_s)
            exponent = 0.0
        self.weights[self.options.bucket(value)] += weight * 2.0**exponent

    def _shift_reference(self, time_s: float) -> None:
        scale = 2.0 ** (-(time_s - self.reference_s) / self.options.half_life_s)
        self.weights = [w * scale for w in self.weights]
        self.reference_s = time_s

    def percentile(self, q: float) -> float:
        """The end of the bucket where the running weight reaches ``q`` (0..1) of the total; 0 when empty."""
        total = self.total_weight
        if total < EPSILON:
            return 0.0
        running = 0.0
        last = max(i for i, w in enumerate(self.weights) if w > 0)
        for index, weight in enumerate(self.weights):
            running += weight
            if running >= q * total or index == last:
                return min(self.options.bucket_start(index + 1), self.options.max_value)
        return self.options.max_value  # pragma: no cover - the loop returns at the last bucket

    def unit_weights(self) -> list[float]:
        """The weight at each whole value ``0 .. ceil(max_value)``, each bucket counted at its end
        rounded up: an upper estimate, as :meth:`percentile` is (the duty profile a predicted sum
        of several pods' duty cycles is made from, ``sharing.packing.duty_sum``)."""
        out = [0.0] * (math.ceil(self.options.max_value) + 1)
        for index, weight in enumerate(self.weights):
            if weight > 0:
                end = min(self.options.bucket_start(index + 1), self.options.max_value)
                out[math.ceil(end - 1e-9)] += weight
        return out

    def merge(self, other: DecayingHistogram) -> None:
        """Add ``other``'s samples (same options), their decay kept relative to their own times."""
        if other.options != self.options:
            raise ValueError("histograms of different options cannot merge")
        if not other.started:
            return
        if not self.started:
            self.reference_s, self.started = other.reference_s, True
        shift = 2.0 ** ((other.reference_s - self.reference_s) / self.options.half_life_s)
        self.weights = [a + b * shift for a, b in zip(self.weights, other.weights)]

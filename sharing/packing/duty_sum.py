"""The predicted duty-cycle *sum* of a GPU's pods: their duty distributions convolved.

A pod's duty profile (:data:`DutyProfile`) is the share of its observed time at each whole
percent of duty cycle, 0 to 100 (index = percent), as its recommender's decaying histogram holds
it (``sharing.usage.histogram``, rounded up to the percent). The profile of a GPU's pods together
is the convolution of theirs: the distribution of the sum of their duty cycles if they burst
independently. Admitting a pod while the ``q``-quantile of that sum stays at most 100 % lets pods
that burst rarely share a GPU, where summing each pod's own percentile (the p99 of a pod that
idles at 0 % and bursts to 95 % is 95 %) would give each a GPU of its own. It is over-commit
against predicted use: the pods' own caps may sum past 100 %, so a GPU takes it only where its
policy allows compute over-commit (``sharing.packing.shared_gpus.FitRule``).

Independence is the assumption to watch: pods behind one load balancer burst together. The
measure of it is the replay's ``saturated_gpu_minutes_pct``, the minutes whose real duty cycles
sum above 100 % (docs/usage.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

DutyProfile = tuple[float, ...]
"""Probability of each whole percent of duty cycle, index 0..100; sums to 1."""
FloatArray = npt.NDArray[np.float64]
PERCENTS = 101


def profile(weights: Sequence[float]) -> DutyProfile:
    """A profile from non-negative weights per whole percent (at most 101 of them), normalised."""
    if len(weights) > PERCENTS or min(weights, default=0.0) < 0 or sum(weights) <= 0:
        raise ValueError(f"a duty profile needs 1..{PERCENTS} non-negative weights with a positive sum")
    total = float(sum(weights))
    return tuple(float(w) / total for w in weights) + (0.0,) * (PERCENTS - len(weights))


def summed(profiles: Sequence[DutyProfile]) -> FloatArray:
    """The distribution of the sum of independent duty cycles (index = percent, may pass 100)."""
    out: FloatArray = np.array([1.0])
    for one in profiles:
        out = np.convolve(out, np.asarray(one, dtype=np.float64))
    return out


def quantile(distribution: FloatArray, q: float) -> int:
    """The smallest percent whose cumulative probability reaches ``q`` (0 < q <= 1)."""
    if not 0 < q <= 1:
        raise ValueError(f"a quantile must be in (0, 1], got {q}")
    cumulative = np.cumsum(distribution)
    return int(np.searchsorted(cumulative, q * cumulative[-1] - 1e-12))

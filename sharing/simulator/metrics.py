"""Allocation ratio per arrived-demand level, as the published analysis computes it.

After every attempt (placed or failed) the run logs arrived GPU milli ``A_i``
(failed pods included) and allocated GPU milli ``U_i``. With ``T`` GPUs:
``arrive_i = round(A_i / T / 10)`` (half to even) and ``alloc_i =
round(U_i / T / 10, 2)``; level L's value is the mean of ``alloc_i`` over the
attempts with ``arrive_i = L``, falling back to ``L-1..L+1`` and else empty
(``PROTOCOL.md`` §5).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_LEVEL = 130


def alloc_by_level(
    arrived: npt.NDArray[np.int64], used: npt.NDArray[np.int64], total_gpus: int, max_level: int = MAX_LEVEL
) -> dict[int, float | None]:
    """Allocation percent at each arrived-demand level 0..max_level (None where no attempt lands)."""
    return mean_by_level(arrival_levels(arrived, total_gpus), np.round(used / total_gpus / 10.0, 2), max_level)


def arrival_levels(arrived: npt.NDArray[np.int64], total_gpus: int) -> npt.NDArray[np.int64]:
    """Each attempt's arrived-demand level: ``round(A_i / T / 10)``, half to even."""
    levels: npt.NDArray[np.int64] = np.round(arrived / total_gpus / 10.0).astype(np.int64)
    return levels


def mean_by_level(
    arrive: npt.NDArray[np.int64], alloc: npt.NDArray[np.float64], max_level: int = MAX_LEVEL
) -> dict[int, float | None]:
    """Mean of ``alloc`` (one value per attempt) at each level 0..max_level of the attempts' ``arrive``
    levels, with the protocol's fallback to the levels beside it (None where no attempt lands)."""
    sums = np.bincount(np.clip(arrive, 0, max_level + 2), weights=alloc, minlength=max_level + 3)
    counts = np.bincount(np.clip(arrive, 0, max_level + 2), minlength=max_level + 3)
    # Attempts beyond max_level+1 must not leak into the clipped last bucket.
    over = arrive > max_level + 1
    if over.any():
        sums[max_level + 2] -= alloc[over].sum()
        counts[max_level + 2] -= int(over.sum())
    out: dict[int, float | None] = {}
    for level in range(max_level + 1):
        if counts[level]:
            out[level] = round(float(sums[level] / counts[level]), 2)
            continue
        lo, hi = max(level - 1, 0), level + 1
        n = counts[lo : hi + 1].sum()
        out[level] = round(float(sums[lo : hi + 1].sum() / n), 2) if n else None
    return out


def mean_levels(runs: Sequence[dict[int, float | None]]) -> dict[int, float | None]:
    """Per-level mean over runs, ignoring runs that leave a level empty."""
    out: dict[int, float | None] = {}
    for level in runs[0]:
        vals = [v for r in runs if (v := r.get(level)) is not None]
        out[level] = round(float(np.mean(vals)), 2) if vals else None
    return out

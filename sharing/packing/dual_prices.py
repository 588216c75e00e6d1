"""What a slice of one GPU is worth, from the LP relaxation of packing the typical pods.

Packing the workload's fractional pods onto GPUs is a bin-packing (cutting-stock)
problem: with ``n_s`` pods of size ``s`` milli, the fewest GPUs that hold them
all is, relaxed to fractions, the linear program

    minimise  sum_p x_p   subject to  sum_p a_sp x_p >= n_s,  x >= 0,

over every *pattern* ``p`` (a multiset of sizes that fits in 1000 milli; ``a_sp``
copies of size ``s``). Its dual gives each size a price ``y_s`` (the share of a
GPU that one pod of that size really costs once the whole workload is packed
as well as possible): for the openb traces about 1/2 for 470, 1/3 for 320, 2/3
for 650 and a whole GPU for 810, whose 190-milli remainder almost nothing can
use. The dual is

    maximise  sum_s n_s y_s   subject to  sum_s a_sp y_s <= 1 for every pattern p,  y >= 0,

solved here by row generation (Gilmore and Gomory's column generation seen from
the dual side): solve with the patterns found so far, find the pattern that
the current prices overvalue most with an unbounded knapsack, add it, repeat
until no pattern is worth more than one GPU.

With the prices, ``value[h]`` is the most a free gap of ``h`` milli can still
earn (the knapsack over prices), and placing a pod of size ``s`` in a gap ``h``
*regrets* ``value[h] - price(s) - value[h - s] >= 0``: the part of the gap's
worth the placement throws away. Putting a 320 next to a 650 (gap 350 -> 30)
regrets nothing, next to a 470 (gap 530 -> 210) regrets 1/6 of a GPU.

The solver is a small dense simplex (Bland's rule, so it cannot cycle): the LP
has one variable per distinct request size (a few dozen) and a few dozen
pattern rows, and is solved once per run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from sharing.packing.specs import GPU_MILLI
from sharing.packing.typical import TypicalPods

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_TOLERANCE = 1e-9
_MAX_ROUNDS = 500
"""Pattern rows to add at most; the openb workloads need 10-40."""


def maximise(objective: FloatArray, rows: FloatArray, bounds: FloatArray) -> FloatArray:
    """``argmax c.y`` subject to ``rows @ y <= bounds``, ``y >= 0``; ``bounds`` must be >= 0.

    The origin is feasible (``bounds >= 0``), so the slack basis starts the
    simplex without a first phase. ValueError if the LP is unbounded.
    """
    m, n = rows.shape
    if objective.shape != (n,) or bounds.shape != (m,):
        raise ValueError("objective, rows and bounds disagree in shape")
    if (bounds < 0).any():
        raise ValueError("bounds must be non-negative")
    tableau = np.zeros((m + 1, n + m + 1))
    tableau[:m, :n] = rows
    tableau[:m, n : n + m] = np.eye(m)
    tableau[:m, -1] = bounds
    tableau[m, :n] = -objective
    basis = list(range(n, n + m))
    for _ in range(50 * (n + m) + 100):
        entering = np.flatnonzero(tableau[m, :-1] < -_TOLERANCE)
        if entering.size == 0:
            break
        col = int(entering[0])  # Bland: lowest index improves
        column = tableau[:m, col]
        positive = column > _TOLERANCE
        if not positive.any():
            raise ValueError("the linear program is unbounded")
        ratios = np.full(m, np.inf)
        ratios[positive] = tableau[:m, -1][positive] / column[positive]
        best = ratios.min()
        ties = np.flatnonzero(ratios <= best + _TOLERANCE)
        row = int(min(ties, key=lambda r: basis[r]))  # Bland: lowest basic index leaves
        tableau[row] /= tableau[row, col]
        for r in range(m + 1):
            if r != row and tableau[r, col] != 0.0:
                tableau[r] -= tableau[r, col] * tableau[row]
        basis[row] = col
    else:  # pragma: no cover - Bland's rule terminates well within the bound
        raise RuntimeError("simplex did not converge")
    solution = np.zeros(n + m)
    for r, var in enumerate(basis):
        solution[var] = tableau[r, -1]
    result: FloatArray = np.maximum(solution[:n], 0.0)
    return result


def knapsack_values(sizes: IntArray, prices: FloatArray, capacity: int) -> tuple[FloatArray, list[tuple[int, ...]]]:
    """``value[h]``: the most that any multiset of ``sizes`` fitting in ``h`` earns at ``prices``
    (unbounded copies), for ``h = 0..capacity``; with the best multiset for each ``h``."""
    value = np.zeros(capacity + 1)
    best: list[tuple[int, ...]] = [()] * (capacity + 1)
    for h in range(1, capacity + 1):
        value[h], best[h] = value[h - 1], best[h - 1]
        fits = np.flatnonzero(sizes <= h)
        if fits.size == 0:
            continue
        gains = value[h - sizes[fits]] + prices[fits]
        k = int(np.argmax(gains))
        if gains[k] > value[h] + _TOLERANCE:
            value[h] = gains[k]
            best[h] = best[h - int(sizes[fits[k]])] + (int(fits[k]),)
    return value, best


@dataclass(frozen=True)
class DualPrices:
    """Prices of fractional request sizes (share of one GPU) and the worth of each free gap."""

    price: Mapping[int, float]
    """Milli per GPU -> price, for the sizes the LP was built from."""
    value: FloatArray
    """``value[h]`` for ``h = 0..1000``: what a gap of ``h`` free milli can still earn."""
    patterns: int
    """Pattern rows the LP ended with (for reports)."""

    @classmethod
    def from_demand(cls, demand: Mapping[int, float]) -> DualPrices:
        """Prices for fractional sizes (``0 < milli < 1000``) requested with the given weights.

        Solved once per distinct demand (the controller re-plans with the same mix
        again and again); the returned object is shared, so its mapping and array are read-only."""
        kept = tuple(sorted((int(s), float(w)) for s, w in demand.items() if 0 < s < GPU_MILLI and w > 0))
        if _every_solution is None:
            return _solve(kept)
        known = _every_solution.get(kept)
        if known is None:
            known = _every_solution[kept] = _solve(kept)
        return known

    @classmethod
    def from_typical(cls, typical: TypicalPods) -> DualPrices:
        """Prices for the typical pods' one-GPU fractional requests, weighted by their probability."""
        demand: dict[int, float] = defaultdict(float)
        for milli, count, p in zip(typical.gpu_milli, typical.gpu_count, typical.probability):
            if count == 1 and 0 < milli < GPU_MILLI:
                demand[milli] += p
        return cls.from_demand(demand)

    def price_of(self, milli: int) -> float:
        """A size's price; a size the LP did not see costs what its own slice could earn."""
        known = self.price.get(milli)
        return known if known is not None else float(self.value[min(max(milli, 0), GPU_MILLI)])

    def regret(self, free: IntArray, milli: int) -> FloatArray:
        """GPU share lost by putting ``milli`` on devices with ``free`` milli (any shape); ``inf`` where it does not fit."""
        fits = free >= milli
        gap = np.clip(free, 0, GPU_MILLI)
        left = np.clip(free - milli, 0, GPU_MILLI)
        lost = self.value[gap] - self.price_of(milli) - self.value[left]
        result: FloatArray = np.where(fits, np.maximum(lost, 0.0), np.inf)
        return result


_every_solution: dict[tuple[tuple[int, float], ...], DualPrices] | None = None
"""While :func:`remembering_every_solution` is open, every demand solved so far and its prices."""


@contextmanager
def remembering_every_solution() -> Iterator[None]:
    """Keep every solution until the block ends, not only the last 64.

    For runs that go through one long sequence of demands more than once: the
    replay's product model rebuilds its typical pods before every pod, so each
    of its draws asks for thousands of demands, the same ones in the same order
    until the draws part ways. An LRU cache smaller than that sequence keeps
    none of them for the next draw; this keeps them all (about 10 KB each) and
    lets them go when the block ends. The prices are the same either way."""
    global _every_solution
    outer = _every_solution
    if outer is None:
        _every_solution = {}
    try:
        yield
    finally:
        _every_solution = outer


@lru_cache(maxsize=64)
def _solve(demand: tuple[tuple[int, float], ...]) -> DualPrices:
    if not demand:
        return DualPrices(price=MappingProxyType({}), value=_read_only(np.zeros(GPU_MILLI + 1)), patterns=0)
    sizes = np.array([s for s, _ in demand], dtype=np.int64)
    weights = np.array([w for _, w in demand])
    weights = weights / weights.sum()
    # Start with the one-size patterns (as many copies as fit), then add the
    # pattern the prices overvalue most until none is worth more than a GPU.
    rows = [np.where(np.arange(sizes.size) == i, float(GPU_MILLI // s), 0.0) for i, s in enumerate(sizes)]
    for _ in range(_MAX_ROUNDS):
        prices = maximise(weights, np.array(rows), np.ones(len(rows)))
        value, best = knapsack_values(sizes, prices, GPU_MILLI)
        if value[GPU_MILLI] <= 1.0 + 1e-7:
            break
        pattern = np.zeros(sizes.size)
        for index in best[GPU_MILLI]:
            pattern[index] += 1.0
        rows.append(pattern)
    else:  # pragma: no cover - the pattern set is finite and small
        raise RuntimeError("pattern generation did not converge")
    return DualPrices(
        price=MappingProxyType({int(s): float(p) for s, p in zip(sizes, prices)}),
        value=_read_only(value),
        patterns=len(rows),
    )


def _read_only(array: FloatArray) -> FloatArray:
    array.flags.writeable = False
    return array

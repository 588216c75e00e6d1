"""LP dual prices of request sizes and the regret of a placement (sharing.packing.dual_prices)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.packing.dual_prices import DualPrices, knapsack_values, maximise, remembering_every_solution
from sharing.packing.typical import TypicalPods


def test_simplex_finds_the_textbook_optimum() -> None:
    # max 3x + 2y  s.t.  x + y <= 4,  x + 3y <= 6  ->  x = 4, y = 0 (value 12)
    y = maximise(np.array([3.0, 2.0]), np.array([[1.0, 1.0], [1.0, 3.0]]), np.array([4.0, 6.0]))
    assert y.tolist() == pytest.approx([4.0, 0.0])
    # max x + y  s.t.  2x + y <= 4,  x + 2y <= 4  ->  x = y = 4/3
    y = maximise(np.array([1.0, 1.0]), np.array([[2.0, 1.0], [1.0, 2.0]]), np.array([4.0, 4.0]))
    assert y.tolist() == pytest.approx([4 / 3, 4 / 3])


def test_simplex_refuses_unbounded_and_infeasible_starts() -> None:
    with pytest.raises(ValueError, match="unbounded"):
        maximise(np.array([1.0, 1.0]), np.array([[1.0, -1.0]]), np.array([1.0]))
    with pytest.raises(ValueError, match="non-negative"):
        maximise(np.array([1.0]), np.array([[1.0]]), np.array([-1.0]))
    with pytest.raises(ValueError, match="shape"):
        maximise(np.array([1.0]), np.array([[1.0, 2.0]]), np.array([1.0]))


def test_knapsack_takes_the_best_multiset_that_fits() -> None:
    value, best = knapsack_values(np.array([300, 500], dtype=np.int64), np.array([0.4, 0.5]), 1000)
    assert value[299] == 0.0
    assert value[600] == pytest.approx(0.8)  # 300 + 300 beats 500
    # 3 x 300 earns 1.2, more than 2 x 500 (1.0) or 500 + 300 (0.9).
    assert value[1000] == pytest.approx(1.2)
    assert sorted(best[1000]) == [0, 0, 0]
    assert value[800] == pytest.approx(0.9) and sorted(best[800]) == [0, 1]


@pytest.mark.parametrize("size", [1, 160, 250, 320, 333, 334, 470, 500, 501, 810, 999])
def test_a_single_size_costs_one_over_the_copies_that_fit(size: int) -> None:
    prices = DualPrices.from_demand({size: 1.0})
    assert prices.price[size] == pytest.approx(1.0 / (1000 // size))
    assert prices.value[1000] == pytest.approx(1.0)


def test_openb_like_mix_prices_pairs_and_triples() -> None:
    # 470s pair up, 320s go three to a GPU or next to a 650, an 810 holds a GPU alone.
    prices = DualPrices.from_demand({470: 0.3, 320: 0.2, 650: 0.2, 810: 0.3})
    assert prices.price == pytest.approx({320: 1 / 3, 470: 1 / 2, 650: 2 / 3, 810: 1.0})
    assert prices.value[190] == 0.0  # nothing priced fits beside an 810
    # 320 next to a 650 (gap 350 -> 30) wastes nothing; next to a 470 (530 -> 210) a sixth of a GPU.
    regret = prices.regret(np.array([350, 530, 1000, 300]), 320)
    assert regret.tolist() == pytest.approx([0.0, 1 / 6, 0.0, float("inf")])


def test_sizes_the_lp_never_saw_cost_what_their_slice_earns() -> None:
    prices = DualPrices.from_demand({500: 1.0})
    assert prices.price_of(600) == pytest.approx(0.5)  # a 600 slice could hold one 500
    assert prices.price_of(400) == 0.0
    assert (prices.regret(np.arange(600, 1001), 600) >= 0).all()


def test_no_fractional_demand_means_no_regret() -> None:
    prices = DualPrices.from_demand({1000: 1.0, 0: 2.0})
    assert prices.price == {} and prices.patterns == 0
    assert prices.regret(np.array([1000, 700]), 300).tolist() == [0.0, 0.0]


def test_typical_pods_feed_only_their_one_gpu_fractional_requests() -> None:
    typical = TypicalPods(
        cpu_milli=(1000, 2000, 1000, 4000), gpu_milli=(500, 500, 1000, 250), gpu_count=(1, 1, 1, 2),
        gpu_spec=("", "", "", ""), probability=(0.25, 0.25, 0.25, 0.25), covered_pods=4, total_pods=4,
    )
    prices = DualPrices.from_typical(typical)
    assert prices.price == pytest.approx({500: 0.5})


def _all_patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    patterns = []
    for counts in itertools.product(*[range(1000 // s + 1) for s in sizes]):
        if 0 < sum(c * s for c, s in zip(counts, sizes)) <= 1000:
            patterns.append(counts)
    return patterns


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(min_value=150, max_value=999), st.integers(min_value=1, max_value=50), min_size=1, max_size=4))
def test_row_generation_matches_the_lp_over_every_pattern(demand: dict[int, int]) -> None:
    prices = DualPrices.from_demand({s: float(n) for s, n in demand.items()})
    sizes = sorted(demand)
    weights = np.array([demand[s] for s in sizes], dtype=float)
    weights /= weights.sum()
    y = np.array([prices.price[s] for s in sizes])
    # Dual feasible against every pattern, not only the generated ones.
    rows = np.array(_all_patterns(sizes), dtype=float)
    assert (rows @ y <= 1.0 + 1e-7).all() and (y >= 0).all()
    # And optimal: the same objective as the simplex given every pattern at once.
    full = maximise(weights, rows, np.ones(len(rows)))
    assert float(weights @ y) == pytest.approx(float(weights @ full), abs=1e-7)
    # Regret is never negative and a gap left alone keeps its value.
    gaps = np.arange(0, 1001)
    for s in sizes:
        r = prices.regret(gaps, s)
        assert (r[gaps >= s] >= -1e-12).all() and np.isinf(r[gaps < s]).all()


def test_one_solve_per_mix_and_the_shared_result_is_read_only() -> None:
    first = DualPrices.from_demand({470: 2.0, 320: 1.0})
    assert DualPrices.from_demand({320: 1.0, 470: 2.0}) is first
    with pytest.raises(TypeError):
        first.price[470] = 0.0  # type: ignore[index]
    with pytest.raises(ValueError):
        first.value[500] = 0.0


def test_remembering_every_solution_keeps_more_mixes_than_the_lru_and_forgets_them_after() -> None:
    # 100 mixes, more than the 64 the LRU cache holds: a second pass over them
    # reuses every solution inside the block and none outside it.
    mixes = [{470: 1.0 + i, 320: 1.0} for i in range(100)]
    with remembering_every_solution():
        first = [DualPrices.from_demand(m) for m in mixes]
        again = [DualPrices.from_demand(m) for m in mixes]
        with remembering_every_solution():  # nested: the outer block's solutions stay
            assert DualPrices.from_demand(mixes[0]) is first[0]
        assert all(a is b for a, b in zip(first, again))
    outside = DualPrices.from_demand(mixes[0])
    assert outside is not first[0]
    assert outside.price == first[0].price and np.array_equal(outside.value, first[0].value)

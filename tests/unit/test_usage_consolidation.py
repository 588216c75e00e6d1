"""Consolidation moves (sharing.usage.consolidation): drain the least-used GPU whole, or not at all."""

from __future__ import annotations

from sharing.packing.shared_gpus import FitRule, SharedGpus
from sharing.usage.consolidation import Move, consolidation_moves
from sharing.usage.recommender import WorkloadKey
from sharing.usage.sizing import Size

GB = 10**9
A, B, C = (WorkloadKey("ns", "Deployment", name, "main") for name in "abc")
BUDGET = {A: 1, B: 1, C: 1}


def pool_of(gpus: dict[int, list[tuple[str, int, int]]], overcommit: float = 1.0) -> SharedGpus:
    """A pool of 100 GB GPUs holding (pod, milli, memory GB) shares."""
    pool = SharedGpus(FitRule(100 * GB, overcommit))
    for gpu, shares in gpus.items():
        for pod, milli, memory in shares:
            pool.place(pod, Size(milli, memory * GB), gpu)
    return pool


def owners(pool: SharedGpus) -> dict[str, WorkloadKey]:
    return {pod: {"a": A, "b": B, "c": C}[pod[0]] for pod in pool.seats}


def test_the_gpu_with_fewest_shares_is_emptied_into_the_tightest_room() -> None:
    pool = pool_of({0: [("a", 100, 30)], 1: [("b", 100, 40)], 2: [("c", 100, 20)]})
    # c (least memory) goes first, into GPU 1 (40 GB left after it is less than GPU 0's 50).
    assert consolidation_moves(pool, owners(pool), BUDGET) == (Move("c", C, 1),)
    assert len(consolidation_moves(pool, owners(pool), BUDGET, max_drains=2)) == 2
    assert pool.seats["c"][0] == 2  # the pool itself is left as it is


def test_memory_is_never_overcommitted_by_a_drain() -> None:
    pool = pool_of({0: [("a", 100, 60)], 1: [("b", 100, 60)]})
    assert consolidation_moves(pool, owners(pool), BUDGET) == ()


def test_half_a_drain_is_no_drain() -> None:
    pool = pool_of({0: [("a1", 100, 30), ("b1", 100, 30)], 1: [("c", 100, 50)], 2: [("b2", 100, 45), ("a2", 100, 45)]})
    # GPU 1 (one share) first: c's 50 GB fits neither 60 nor 90 GB used. GPU 0: a1 fits beside c,
    # then b1 finds no room. GPU 2: a2 fits beside c, then b2 finds none. Nothing moves.
    assert consolidation_moves(pool, owners(pool), BUDGET) == ()


def test_a_spent_budget_keeps_a_gpu_as_it_is() -> None:
    pool = pool_of({0: [("a", 100, 10)], 1: [("b", 100, 10)]})
    assert consolidation_moves(pool, owners(pool), {A: 0, B: 1}) == (Move("b", B, 0),)
    assert consolidation_moves(pool, owners(pool), {A: 0, B: 0}) == ()


def test_compute_bounds_a_drain_unless_overcommit_allows() -> None:
    shares = {0: [("a", 700, 10)], 1: [("b", 600, 10)]}
    pool = pool_of(shares)
    assert consolidation_moves(pool, owners(pool), BUDGET) == ()
    loose = pool_of(shares, overcommit=1.5)
    assert consolidation_moves(loose, owners(loose), BUDGET) == (Move("a", A, 1),)

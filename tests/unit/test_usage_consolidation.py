"""Consolidation moves (sharing.usage.consolidation): drain the least-used GPU whole, or not at all."""

from __future__ import annotations

from sharing.usage.consolidation import Move, Share, consolidation_moves
from sharing.usage.recommender import WorkloadKey
from sharing.usage.sizing import Size

GB = 10**9
A, B, C = (WorkloadKey("ns", "Deployment", name, "main") for name in "abc")
BUDGET = {A: 1, B: 1, C: 1}


def test_the_gpu_with_fewest_shares_is_emptied_into_the_tightest_room() -> None:
    gpus = {0: [Share("a", A, Size(100, 30 * GB))], 1: [Share("b", B, Size(100, 40 * GB))],
            2: [Share("c", C, Size(100, 20 * GB))]}
    # c (least memory) goes first, into GPU 1 (40 GB left after it is less than GPU 0's 50).
    assert consolidation_moves(gpus, 100 * GB, BUDGET) == (Move("c", C, 1),)
    assert len(consolidation_moves(gpus, 100 * GB, BUDGET, max_drains=2)) == 2


def test_memory_is_never_overcommitted_by_a_drain() -> None:
    gpus = {0: [Share("a", A, Size(100, 60 * GB))], 1: [Share("b", B, Size(100, 60 * GB))]}
    assert consolidation_moves(gpus, 100 * GB, BUDGET) == ()


def test_half_a_drain_is_no_drain() -> None:
    gpus = {0: [Share("a1", A, Size(100, 30 * GB)), Share("b1", B, Size(100, 30 * GB))],
            1: [Share("c", C, Size(100, 50 * GB))], 2: [Share("b2", B, Size(100, 45 * GB)),
                                                      Share("a2", A, Size(100, 45 * GB))]}
    # GPU 1 (one share) first: c's 50 GB fits neither 60 nor 90 GB used. GPU 0: a1 fits beside c,
    # then b1 finds no room. GPU 2: a2 fits beside c, then b2 finds none. Nothing moves.
    assert consolidation_moves(gpus, 100 * GB, {A: 1, B: 1, C: 1}) == ()


def test_a_spent_budget_keeps_a_gpu_as_it_is() -> None:
    gpus = {0: [Share("a", A, Size(100, 10 * GB))], 1: [Share("b", B, Size(100, 10 * GB))]}
    assert consolidation_moves(gpus, 100 * GB, {A: 0, B: 1}) == (Move("b", B, 0),)
    assert consolidation_moves(gpus, 100 * GB, {A: 0, B: 0}) == ()


def test_compute_bounds_a_drain_unless_overcommit_allows() -> None:
    gpus = {0: [Share("a", A, Size(700, 10 * GB))], 1: [Share("b", B, Size(600, 10 * GB))]}
    assert consolidation_moves(gpus, 100 * GB, BUDGET) == ()
    assert consolidation_moves(gpus, 100 * GB, BUDGET, compute_overcommit=1.5) == (Move("a", A, 1),)

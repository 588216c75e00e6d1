"""Sizing from a recommendation, the fit rule and the Recreate updater (sharing.usage.sizing, sharing.usage.updater)."""

from __future__ import annotations

import pytest

from sharing.usage.recommender import Recommendation, WorkloadKey
from sharing.usage.sizing import GpuLoad, Size, fits, size_for, whole_gpu
from sharing.usage.updater import Candidate, UpdaterSettings, choose_moves, is_far

GB = 10**9
A = WorkloadKey("ns", "Deployment", "a", "main")
B = WorkloadKey("ns", "Deployment", "b", "main")


def recommendation(duty: float, memory: int) -> Recommendation:
    return Recommendation(duty, memory, observed_s=7200.0, confidence_days=0.08, ooms=0)


def test_a_recommendation_becomes_a_request_in_the_apis_units() -> None:
    assert size_for(recommendation(12.34, 20 * GB), 80 * GB) == Size(124, 20 * GB)
    assert size_for(recommendation(0.0, 0), 80 * GB) == Size(1, 0)  # at least one milli
    assert size_for(recommendation(100.0, 90 * GB), 80 * GB) == Size(1000, 80 * GB)  # at most the GPU
    with pytest.raises(ValueError, match="milli in 1..1000"):
        Size(0, GB)


def test_memory_is_never_overcommitted_and_compute_only_by_policy() -> None:
    load = GpuLoad().plus(Size(300, 50 * GB))
    assert fits(load, Size(300, 30 * GB), 80 * GB)
    assert not fits(load, Size(300, 30 * GB + 1), 80 * GB)
    assert not fits(load, Size(800, GB), 80 * GB)
    assert fits(load, Size(800, GB), 80 * GB, compute_overcommit=1.2)
    assert not fits(load, Size(300, 31 * GB), 80 * GB, compute_overcommit=10.0)  # memory stays hard
    assert load.plus(Size(1, 1)).minus(Size(1, 1)) == load
    assert not fits(GpuLoad().plus(whole_gpu(80 * GB)), Size(1, 0), 80 * GB)
    with pytest.raises(ValueError, match="at least 1.0"):
        fits(load, Size(1, 1), 80 * GB, compute_overcommit=0.5)


@pytest.mark.parametrize(
    ("current", "target", "far"),
    [
        (Size(100, 20 * GB), Size(100, 20 * GB), False),
        (Size(100, 19 * GB), Size(100, 20 * GB), True),  # below: an OOM waits
        (Size(100, 24 * GB), Size(100, 20 * GB), False),  # within the slack
        (Size(100, 26 * GB), Size(100, 20 * GB), True),  # memory wasted
        (Size(300, 20 * GB), Size(100, 20 * GB), True),  # compute three times the need
        (Size(50, 20 * GB), Size(100, 20 * GB), False),  # half: within a factor of two
    ],
    ids=["same", "memory-below", "memory-within-slack", "memory-above-slack", "compute-far", "compute-near"],
)
def test_far_from_the_recommendation(current: Size, target: Size, far: bool) -> None:
    assert is_far(current, target, UpdaterSettings(memory_slack=0.25, memory_risk_slack=0.0, compute_slack=1.0)) is far


def test_a_limit_a_little_below_the_recommendation_waits_for_its_oom() -> None:
    settings = UpdaterSettings(memory_risk_slack=0.1)
    assert not is_far(Size(100, 19 * GB), Size(100, 20 * GB), settings)  # within 10 %: the margin still holds
    assert is_far(Size(100, 18 * GB), Size(100, 20 * GB), settings)


def test_moves_are_bounded_per_workload_and_risk_goes_first() -> None:
    settings = UpdaterSettings(max_moves_per_interval=1, memory_risk_slack=0.0)
    wasteful = Candidate("a-1", A, Size(1000, 80 * GB), Size(100, 20 * GB))
    risky = Candidate("a-2", A, Size(100, 10 * GB), Size(100, 20 * GB))
    other = Candidate("b-1", B, Size(1000, 80 * GB), Size(100, 20 * GB))
    fine = Candidate("b-2", B, Size(100, 20 * GB), Size(100, 20 * GB))
    assert [c.pod for c in choose_moves([wasteful, risky, other, fine], {}, settings)] == ["a-2", "b-1"]
    assert [c.pod for c in choose_moves([wasteful, other], {B: 1}, settings)] == ["a-1"]
    assert choose_moves([wasteful], {}, UpdaterSettings(max_moves_per_interval=0)) == ()


def test_an_oom_killed_pod_moves_at_once_outside_the_budget() -> None:
    settings = UpdaterSettings(max_moves_per_interval=1, memory_risk_slack=0.5)
    killed = Candidate("a-1", A, Size(100, 20 * GB), Size(100, 22 * GB), oom=True)  # within the risk slack
    wasteful = Candidate("a-2", A, Size(1000, 80 * GB), Size(100, 20 * GB))
    assert [c.pod for c in choose_moves([wasteful, killed], {A: 1}, settings)] == ["a-1"]  # budget spent, still
    assert not is_far(killed.current, killed.target, settings)  # without the OOM it would wait
    settled = Candidate("a-1", A, Size(100, 22 * GB), Size(100, 22 * GB), oom=True)  # already at its new size
    assert choose_moves([settled], {}, settings) == ()

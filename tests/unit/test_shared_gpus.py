"""The packing engine's shared-GPU pool and predicted duty sum (sharing.packing.shared_gpus, duty_sum)."""

from __future__ import annotations

import pytest

from sharing.packing.duty_sum import profile, quantile, summed
from sharing.packing.shared_gpus import FitRule, SharedGpus, Size

GB = 10**9
IDLE_THEN_BURST = profile([0.99] + [0.0] * 89 + [0.01])  # 0 % 99 % of the time, 90 % the rest


def test_a_sum_of_rare_bursts_stays_low_at_its_quantile() -> None:
    two = summed([IDLE_THEN_BURST, IDLE_THEN_BURST])
    assert two.sum() == pytest.approx(1.0)
    assert quantile(two, 0.99) == 90  # one bursts in about 2 % of minutes
    assert quantile(two, 0.99995) == 180  # both at once: 0.01 % of minutes
    with pytest.raises(ValueError, match="quantile"):
        quantile(two, 0.0)
    with pytest.raises(ValueError, match="non-negative"):
        profile([-1.0, 2.0])


def test_memory_is_never_overcommitted_whatever_the_compute_rule() -> None:
    pool = SharedGpus(FitRule(100 * GB, compute_overcommit=5.0, duty_quantile=0.99))
    pool.seat("a", Size(100, 60 * GB), IDLE_THEN_BURST)
    assert not pool.admits(0, Size(100, 41 * GB), IDLE_THEN_BURST)
    assert pool.seat("b", Size(100, 41 * GB), IDLE_THEN_BURST) == 1  # a new GPU


def test_the_predicted_sum_admits_what_summed_caps_refuse() -> None:
    caps = SharedGpus(FitRule(100 * GB))
    summing = SharedGpus(FitRule(100 * GB, compute_overcommit=3.0, duty_quantile=0.99))
    strict = SharedGpus(FitRule(100 * GB, compute_overcommit=3.0, duty_quantile=0.9998))
    for pool in (caps, summing, strict):
        for pod in "abc":
            pool.seat(pod, Size(950, 30 * GB), IDLE_THEN_BURST)
    assert caps.seats["b"][0] == 1  # caps alone: 1900 milli is past 1000
    assert summing.seats["b"][0] == summing.seats["c"][0] == 0  # the sum of three: p99 90 %
    assert strict.seats["b"][0] == 0 and strict.seats["c"][0] == 1  # three: two burst at once 0.03 %, past 0.02 %


def test_a_pod_without_a_profile_counts_at_its_cap() -> None:
    pool = SharedGpus(FitRule(100 * GB, compute_overcommit=2.0, duty_quantile=0.99))
    pool.seat("a", Size(600, 10 * GB))
    assert not pool.admits(0, Size(500, 10 * GB))  # 60 % always + 50 % always
    assert pool.admits(0, Size(400, 10 * GB))


def test_best_fit_takes_the_tightest_room_and_a_move_is_make_before_break() -> None:
    pool = SharedGpus(FitRule(100 * GB))
    pool.place("a", Size(100, 30 * GB), 0)
    pool.place("b", Size(100, 60 * GB), 1)
    assert pool.best_fit(Size(100, 30 * GB)) == 1  # 10 GB left beats 40
    assert pool.best_fit(Size(100, 30 * GB), avoid=1) == 0
    pool.seat("a", Size(100, 40 * GB), avoid=0)  # a moves while its old share still holds GPU 0
    assert pool.seats["a"] == (1, Size(100, 40 * GB)) and 0 not in pool.loads  # the emptied GPU left
    copy = pool.fork()
    copy.leave("a")
    assert "a" in pool.seats and pool.loads[1].memory_bytes == 100 * GB


def test_fit_rules_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="compute_overcommit"):
        FitRule(GB, compute_overcommit=0.5)
    with pytest.raises(ValueError, match="duty_quantile"):
        FitRule(GB, duty_quantile=1.5)

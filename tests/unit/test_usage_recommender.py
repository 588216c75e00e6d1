"""The right-sizer's pure core: the decaying histogram, the windowed peak and the recommender (sharing.usage)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sharing.usage.histogram import DecayingHistogram, HistogramOptions
from sharing.usage.peaks import PeakOptions, WindowedPeak
from sharing.usage.recommender import MIB, Recommender, RecommenderSettings, WorkloadKey

DAY = 24 * 3600.0
GIB = 1024 * MIB
KEY = WorkloadKey("ns", "Deployment", "sd", "server")
DUTY = HistogramOptions(max_value=100.0, first_bucket=0.5, half_life_s=DAY)


def test_buckets_grow_geometrically_and_cover_the_range() -> None:
    assert DUTY.bucket_start(0) == 0.0
    widths = [DUTY.bucket_start(i + 1) - DUTY.bucket_start(i) for i in range(3)]
    assert widths[0] == pytest.approx(0.5) and widths[1] == pytest.approx(0.525) and widths[2] > widths[1]
    assert DUTY.bucket(100.0) == DUTY.buckets - 1 and DUTY.bucket(1e9) == DUTY.bucket(100.0)
    with pytest.raises(ValueError, match="ratio above 1"):
        HistogramOptions(max_value=100.0, first_bucket=0.5, ratio=1.0)


def test_a_percentile_is_an_upper_estimate_within_a_bucket() -> None:
    histogram = DecayingHistogram(DUTY)
    for value in range(1, 101):
        histogram.add(float(value), 0.0)
    p90 = histogram.percentile(0.9)
    assert 90.0 <= p90 <= 90.0 * DUTY.ratio + DUTY.first_bucket
    assert histogram.percentile(1.0) == 100.0
    assert DecayingHistogram(DUTY).percentile(0.9) == 0.0


def test_a_sample_one_half_life_older_counts_half() -> None:
    histogram = DecayingHistogram(DUTY)
    histogram.add(80.0, 0.0)  # old and busy
    histogram.add(5.0, DAY)  # new and idle: twice the weight
    histogram.add(5.0, DAY)
    assert histogram.percentile(0.79) == pytest.approx(DUTY.bucket_start(DUTY.bucket(5.0) + 1))
    assert histogram.percentile(0.81) > 79.0  # the old peak still holds a fifth of the weight


def test_renormalising_changes_no_percentile() -> None:
    options = HistogramOptions(max_value=100.0, first_bucket=0.5, half_life_s=1.0)
    histogram = DecayingHistogram(options)
    histogram.add(10.0, 0.0)
    histogram.add(50.0, 150.0)  # 2**150 would overflow the weights' range without the shift
    histogram.add(50.0, 150.0)
    assert histogram.reference_s == 150.0
    assert histogram.percentile(0.5) > 49.0 and histogram.total_weight == pytest.approx(2.0)


def test_histograms_of_one_shape_merge() -> None:
    a, b = DecayingHistogram(DUTY), DecayingHistogram(DUTY)
    a.add(10.0, 0.0)
    b.add(90.0, DAY)
    a.merge(b)
    assert a.total_weight == pytest.approx(3.0)  # b's sample, one half-life newer, counts double
    with pytest.raises(ValueError, match="different options"):
        a.merge(DecayingHistogram(HistogramOptions(max_value=1.0, first_bucket=0.1)))


def test_the_peak_forgets_what_left_the_window() -> None:
    peak = WindowedPeak(PeakOptions(interval_s=60.0, window_s=180.0))
    peak.add(9.0, 0.0)
    peak.add(3.0, 61.0)
    assert peak.peak() == 9.0
    peak.add(2.0, 200.0)  # interval 3: interval 0 is three intervals old, out of the window
    assert peak.peak() == 3.0
    with pytest.raises(ValueError, match="fit the window"):
        PeakOptions(interval_s=10.0, window_s=5.0)


def feed(recommender: Recommender, hours: float, duty: float, memory: int, start_s: float = 0.0) -> None:
    for minute in range(int(hours * 60) + 1):
        recommender.observe(KEY, start_s + minute * 60.0, duty, memory)


def test_no_recommendation_before_the_minimum_history() -> None:
    recommender = Recommender(RecommenderSettings(min_observed_s=3600.0))
    assert recommender.recommend(KEY) is None
    feed(recommender, 0.5, 10.0, GIB)
    assert recommender.recommend(KEY) is None
    feed(recommender, 1.0, 10.0, GIB)
    assert recommender.recommend(KEY) is not None


def test_compute_from_the_percentile_and_memory_from_the_peak_with_margins() -> None:
    recommender = Recommender(RecommenderSettings(duty_margin=0.15, memory_margin=0.2, first_memory_margin=None))
    feed(recommender, 2.0, 20.0, 10 * GIB)
    recommender.observe(KEY, 7300.0, 20.0, 12 * GIB)  # one peak
    rec = recommender.recommend(KEY)
    assert rec is not None
    assert 20.0 * 1.15 <= rec.duty_percent <= 21.5 * 1.15  # the percentile's bucket end, with the margin
    assert rec.memory_bytes == round(12 * GIB * 1.2)  # the peak, not the typical 10 GiB
    assert rec.confidence_days == pytest.approx(7300.0 / DAY)


def test_compute_is_at_most_a_whole_gpu() -> None:
    recommender = Recommender()
    feed(recommender, 2.0, 100.0, GIB)
    rec = recommender.recommend(KEY)
    assert rec is not None and rec.duty_percent == 100.0


def test_an_oom_raises_memory_at_once() -> None:
    recommender = Recommender(RecommenderSettings(memory_margin=0.0, first_memory_margin=None, oom_bump_ratio=1.2))
    feed(recommender, 2.0, 5.0, 10 * GIB)
    recommender.record_oom(KEY, 7300.0, allowed_bytes=10 * GIB)
    rec = recommender.recommend(KEY)
    assert rec is not None and rec.ooms == 1
    assert rec.memory_bytes == round(12 * GIB)  # 1.2 x the limit it hit


def test_a_small_limit_is_raised_by_at_least_the_minimum_bump() -> None:
    recommender = Recommender(RecommenderSettings(memory_margin=0.0, first_memory_margin=None,
                                                  oom_bump_ratio=1.2, oom_min_bump_bytes=100 * MIB))
    feed(recommender, 2.0, 5.0, 50 * MIB)
    recommender.record_oom(KEY, 7300.0, allowed_bytes=100 * MIB)
    rec = recommender.recommend(KEY)
    assert rec is not None and rec.memory_bytes == 200 * MIB  # 100 MiB more beats 1.2 x 100 MiB


def test_a_workloads_pods_share_one_history() -> None:
    recommender = Recommender(RecommenderSettings(min_observed_s=3600.0))
    other = WorkloadKey("ns", "Deployment", "sd", "sidecar")
    recommender.observe(KEY, 0.0, 5.0, GIB)
    recommender.observe(KEY, 3600.0, 5.0, 2 * GIB)  # another pod of the workload
    recommender.observe(other, 0.0, 5.0, GIB)
    assert recommender.recommend(KEY) is not None and recommender.recommend(other) is None


@pytest.mark.parametrize(
    "bad",
    [{"duty_percentile": 0.0}, {"duty_percentile": 1.5}, {"memory_margin": -0.1}, {"oom_bump_ratio": 0.9},
     {"sample_interval_s": 0.0}, {"first_memory_margin": -0.5}],
    ids=lambda d: next(iter(d)),
)
def test_settings_out_of_range_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(RecommenderSettings(), **bad)


def test_the_first_memory_margin_shrinks_to_the_settled_one() -> None:
    settings = RecommenderSettings(min_observed_s=3600.0, first_memory_margin=0.5, memory_margin=0.05,
                                   margin_settle_s=7 * 3600.0)
    recommender = Recommender(settings)
    assert recommender.memory_margin(3600.0) == pytest.approx(0.5)
    assert recommender.memory_margin(4 * 3600.0) == pytest.approx(0.275)  # half way
    assert recommender.memory_margin(9 * 3600.0) == pytest.approx(0.05)
    feed(recommender, 1.0, 5.0, 10 * GIB)
    first = recommender.recommend(KEY)
    assert first is not None and first.memory_bytes == round(10 * GIB * 1.5)
    constant = Recommender(dataclasses.replace(settings, first_memory_margin=None))
    assert constant.memory_margin(3600.0) == 0.05


def test_the_duty_profile_is_the_histograms_share_of_time_per_percent() -> None:
    recommender = Recommender(RecommenderSettings(min_observed_s=600.0))
    for minute in range(20):
        recommender.observe(KEY, minute * 60.0, 0.0 if minute % 4 else 50.0, GIB)
    profile = recommender.duty_profile(KEY)
    assert profile is not None and len(profile) == 101 and sum(profile) == pytest.approx(1.0)
    assert profile[1] == pytest.approx(0.75, rel=0.01)  # 0 % samples, counted at their bucket's end (0.5 %, up)
    assert sum(profile[50:53]) == pytest.approx(0.25, rel=0.01)  # the bursts, at most a bucket above 50 %
    assert Recommender().duty_profile(KEY) is None  # no history, no profile


def test_an_ooms_bump_is_a_floor_unless_the_margin_goes_over_it() -> None:
    settings = RecommenderSettings(memory_margin=0.1, first_memory_margin=None, oom_bump_ratio=1.1)
    floor, over = Recommender(dataclasses.replace(settings, margin_over_oom=False)), Recommender(settings)
    for recommender in (floor, over):
        feed(recommender, 2.0, 5.0, 10 * GIB)
        recommender.record_oom(KEY, 7300.0, allowed_bytes=11 * GIB)
    at_floor, above = floor.recommend(KEY), over.recommend(KEY)
    assert at_floor is not None and at_floor.memory_bytes == pytest.approx(11 * GIB * 1.1, abs=1)  # the bump alone
    assert above is not None and above.memory_bytes == pytest.approx(11 * GIB * 1.21, abs=1)  # VPA's: margin on top

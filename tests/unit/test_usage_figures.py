"""The usage replay's measuring stick and its baselines (sharing.simulator.usage_figures, usage_baselines)."""

from __future__ import annotations

import pytest

from mig.errors import UnknownModelError
from sharing.simulator.usage import baselines, gpu_memory_bytes
from sharing.simulator.usage_baselines import (
    Item,
    StaticRule,
    first_fit_decreasing,
    oracle_seatings,
    percentile,
    static_seatings,
)
from sharing.simulator.usage_figures import Seat, measure
from sharing.usage.trace import PodUsage, SignalCounts, UsageTrace

GB = 10**9


def trace_of(*pods: PodUsage, step_s: float = 60.0) -> UsageTrace:
    return UsageTrace(0.0, step_s, max(p.end_step for p in pods), pods, SignalCounts(), SignalCounts())


def pod(name: str, duty: list[float], memory_gb: list[float], first: int = 0) -> PodUsage:
    return PodUsage(name, first, tuple(duty), tuple(int(m * GB) for m in memory_gb))


def test_two_pods_on_one_gpu_halve_the_gpu_hours() -> None:
    trace = trace_of(pod("a", [10, 10], [1, 1]), pod("b", [20, 20], [1, 1]))
    figures = measure(trace, 10 * GB, [{"a": Seat(0), "b": Seat(0)}] * 2)
    assert (figures.pods, figures.gpu_hours_baseline, figures.gpu_hours) == (2, round(4 / 60, 2), round(2 / 60, 2))
    assert figures.gpu_hours_saved_pct == 50.0
    assert figures.saturated_gpu_minutes_pct == 0.0 and figures.evictions_per_pod_day == 0.0


def test_saturation_overflow_and_limits_are_counted_per_step() -> None:
    trace = trace_of(pod("a", [60, 10], [6, 6]), pod("b", [50, 10], [5, 5]))
    no_limits = measure(trace, 10 * GB, [{"a": Seat(0), "b": Seat(0)}] * 2)
    assert no_limits.saturated_gpu_minutes_pct == 50.0  # step 0 sums 110 %
    assert no_limits.gpu_memory_overflow_minutes == 2.0  # 11 GB on 10, both steps
    limited = measure(trace, 10 * GB, [{"a": Seat(0, 5 * GB), "b": Seat(0, 5 * GB)}] * 2)
    assert limited.gpu_memory_overflow_minutes == 0.0  # a hard limit holds: a's extra GB is an OOM
    assert limited.pod_minutes_over_limit_pct == 50.0  # a over its limit at both of its 2 steps, of 4


def test_moves_are_counted_and_the_first_is_told_apart() -> None:
    trace = trace_of(pod("a", [1] * 4, [1] * 4), step_s=86400.0 / 4)  # one pod-day
    figures = measure(trace, 10 * GB, [{"a": Seat(0)}, {"a": Seat(1)}, {"a": Seat(2)}, {"a": Seat(2)}])
    assert (figures.evictions_per_pod_day, figures.evictions_after_first_per_pod_day) == (2.0, 1.0)


def test_a_live_pod_seated_nowhere_is_an_error() -> None:
    trace = trace_of(pod("a", [1], [1]))
    with pytest.raises(ValueError, match="pod a is alive at step 0"):
        measure(trace, GB, [{}])


def test_from_step_leaves_the_warmup_out() -> None:
    trace = trace_of(pod("a", [1, 1], [1, 1]), pod("b", [1, 1], [1, 1]))
    figures = measure(trace, 10 * GB, [{"a": Seat(0), "b": Seat(1)}, {"a": Seat(0), "b": Seat(0)}], from_step=1)
    assert figures.gpu_hours_saved_pct == 50.0
    assert figures.evictions_per_pod_day > 0  # b's move into step 1 is seen from its step-0 seat


def test_first_fit_decreasing_respects_memory_and_duty() -> None:
    items = [Item("small", 2, 10.0), Item("big", 8, 10.0), Item("busy", 1, 95.0)]
    assert first_fit_decreasing(items, 10) == {"big": 0, "small": 0, "busy": 1}


def test_the_oracle_repacks_every_step_by_use() -> None:
    trace = trace_of(pod("a", [10, 10], [4, 8]), pod("b", [10, 10], [4, 8]))
    assert [dict(s) for s in oracle_seatings(trace, 10 * GB)] == [
        {"a": Seat(0), "b": Seat(0)}, {"a": Seat(0), "b": Seat(1)}]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 95) == 95


def test_static_sizes_after_warmup_and_keeps_its_limit() -> None:
    trace = trace_of(pod("a", [10, 10, 10, 10], [2, 3, 3, 5]), pod("b", [10, 10, 10, 10], [2, 2, 2, 2]))
    rule = StaticRule(warmup_s=120.0, duty_percentile=95.0, memory_margin=1.5)
    seatings = [dict(s) for s in static_seatings(trace, 10 * GB, rule)]
    assert seatings[0]["a"] != seatings[0]["b"]  # a whole GPU each while observed
    assert seatings[2]["a"] == Seat(seatings[2]["b"].gpu, int(4.5 * GB))  # 1.5 x its 3 GB peak, beside b
    figures = measure(trace, 10 * GB, seatings)
    assert figures.pod_minutes_over_limit_pct == 12.5  # a's 5 GB at step 3 is over its 4.5 GB


def test_unknown_gpu_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="H200-141GB"):
        gpu_memory_bytes("H300")
    assert gpu_memory_bytes("H200-141GB")[0] == "NVIDIA-H200"


def test_baselines_report_oracle_and_static_from_one_trace() -> None:
    trace = trace_of(*(pod(f"p{i}", [5] * 400, [10] * 400) for i in range(4)))
    out = baselines(trace, "H100-80GB", StaticRule(warmup_s=60.0 * 100))
    assert out["oracle_gpu_hours_saved_pct"] == 75.0  # four 10 GB pods at 5 % fit one GPU
    assert out["static_after_warmup"]["gpu_hours_saved_pct"] == 75.0
    assert 0 < out["static"]["gpu_hours_saved_pct"] < 75.0

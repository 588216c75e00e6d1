"""A usage trace replayed through recommender, sizing and updater (sharing.simulator.usage_replay, usage)."""

from __future__ import annotations

import dataclasses

from sharing.simulator.usage import run_usage
from sharing.simulator.usage_figures import measure
from sharing.simulator.usage_replay import RightSizing, own_workloads, right_sizing_seatings
from sharing.usage.recommender import RecommenderSettings, WorkloadKey
from sharing.usage.trace import PodUsage, SignalCounts, UsageTrace
from sharing.usage.updater import UpdaterSettings

GIB = 2**30
GPU = 80 * GIB
QUICK = RightSizing(recommender=RecommenderSettings(min_observed_s=600.0, memory_margin=0.1, first_memory_margin=None,
                                                              oom_bump_ratio=1.2, margin_over_oom=True),
                    updater=UpdaterSettings(interval_s=600.0))


def quiet_pods(count: int, steps: int, memory: list[int] | None = None, first: int = 0) -> list[PodUsage]:
    series = tuple(memory or [10 * GIB] * steps)
    return [PodUsage(f"p{i}", first, (5.0,) * steps, series) for i in range(count)]


def trace_of(pods: list[PodUsage]) -> UsageTrace:
    return UsageTrace(0.0, 60.0, max(p.end_step for p in pods), tuple(pods), SignalCounts(), SignalCounts())


def test_off_keeps_every_pod_on_its_whole_gpu() -> None:
    trace = trace_of(quiet_pods(4, 60))
    figures = measure(trace, GPU, right_sizing_seatings(trace, GPU, dataclasses.replace(QUICK, mode="off")))
    assert figures.gpu_hours_saved_pct == 0.0 and figures.evictions_per_pod_day == 0.0


def test_recreate_packs_quiet_pods_once_they_have_a_recommendation() -> None:
    trace = trace_of(quiet_pods(4, 120))
    seatings = [dict(s) for s in right_sizing_seatings(trace, GPU, QUICK)]
    assert len({s.gpu for s in seatings[5].values()}) == 4  # before ten minutes of history: whole GPUs
    assert len({s.gpu for s in seatings[-1].values()}) == 1  # four 11 GiB shares on one GPU
    assert all(s.limit_bytes == 11 * GIB for s in seatings[-1].values())  # 1.1 x 10 GiB, whole GiB
    figures = measure(trace, GPU, seatings)
    assert figures.evictions_after_first_per_pod_day == 0.0
    assert figures.gpu_memory_overflow_minutes == 0.0


def test_an_oom_raises_the_limit_and_moves_the_pod() -> None:
    memory = [10 * GIB] * 30 + [15 * GIB] * 30  # grows past its 11 GiB limit at step 30
    trace = trace_of(quiet_pods(1, 60, memory))
    seatings = [dict(s) for s in right_sizing_seatings(trace, GPU, QUICK)]
    assert seatings[29]["p0"].limit_bytes == 11 * GIB
    assert seatings[31]["p0"].limit_bytes is not None and seatings[31]["p0"].limit_bytes >= 15 * GIB
    figures = measure(trace, GPU, seatings)
    assert figures.pod_minutes_over_limit_pct == round(100 / 60, 3)  # one OOM minute, then resized


def test_initial_sizes_a_new_pod_of_a_known_workload_from_its_recommendation() -> None:
    pods = [*quiet_pods(1, 60), PodUsage("late", 30, (5.0,) * 30, (10 * GIB,) * 30)]
    trace = trace_of(pods)
    one = WorkloadKey("trace", "Deployment", "sd", "main")
    seatings = list(right_sizing_seatings(trace, GPU, dataclasses.replace(QUICK, mode="initial"),
                                          {"p0": one, "late": one}))
    assert seatings[30]["late"].limit_bytes == 11 * GIB  # sized at creation
    assert seatings[30]["p0"].limit_bytes == GPU  # initial never moves a running pod


def test_the_run_reports_its_figures_beside_oracle_and_static() -> None:
    trace = trace_of(quiet_pods(4, 120))
    out = run_usage(trace, "H100-80GB", QUICK)
    assert out["mode"] == "recreate" and out["pods"] == 4
    assert out["gpu_hours_saved_pct"] > 50.0
    assert out["oracle_gpu_hours_saved_pct"] == 75.0
    assert "static" in out and own_workloads(trace)["p0"].name == "p0"


def _published_phases(policy: RightSizing) -> list[list[tuple[float, str]]]:
    """The steps at which each pod's samples reached the recommender, recorded through the recommender."""
    import sharing.simulator.usage_replay as replay

    seen: list[list[tuple[float, str]]] = []

    class Recording(replay.Recommender):
        def observe(self, key: WorkloadKey, time_s: float, duty_percent: float, memory_bytes: int) -> None:
            seen[-1].append((time_s, key.name))
            super().observe(key, time_s, duty_percent, memory_bytes)

    original = replay.Recommender
    replay.Recommender = Recording  # type: ignore[misc]
    try:
        seen.append([])
        trace = trace_of(quiet_pods(3, 40))
        list(right_sizing_seatings(trace, GPU, dataclasses.replace(policy, mode="off")))
    finally:
        replay.Recommender = original  # type: ignore[misc]
    return seen


def test_without_a_seed_every_sample_is_seen_and_published_on_one_grid() -> None:
    policy = dataclasses.replace(QUICK, backend="device-plugin", publish_every_s=300.0)
    (samples,) = _published_phases(policy)
    # every pod, every step up to the grid's last publication (step 35 of 40, every 5 steps)
    assert len(samples) == 3 * 36
    assert {t for t, _ in samples} == {60.0 * step for step in range(36)}


def test_a_seed_draws_missed_samples_and_is_reproducible() -> None:
    policy = dataclasses.replace(QUICK, backend="device-plugin", publish_every_s=300.0, observation_seed=3,
                                 missed_samples=0.3)
    (first,) = _published_phases(policy)
    (again,) = _published_phases(policy)
    assert first == again  # the same seed, the same draws
    assert 0.5 * 120 < len(first) < 0.9 * 120  # about 30 % of 120 samples missed
    (other,) = _published_phases(dataclasses.replace(policy, observation_seed=4))
    assert other != first


def test_missed_samples_need_a_seed_and_a_probability_below_one() -> None:
    import pytest

    with pytest.raises(ValueError, match="needs an observation_seed"):
        RightSizing(missed_samples=0.1)
    with pytest.raises(ValueError, match="below 1"):
        RightSizing(observation_seed=1, missed_samples=1.0)

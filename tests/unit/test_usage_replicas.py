"""A usage trace on GPUs shared into replicas (sharing.simulator.usage_replicas): placement and limits."""

from __future__ import annotations

import pytest

from sharing.simulator.usage_figures import Seat, measure
from sharing.simulator.usage_replicas import ReplicaReplay
from sharing.usage.trace import PodUsage, SignalCounts, UsageTrace

GB = 10**9


def trace_of(*pods: PodUsage) -> UsageTrace:
    return UsageTrace(0.0, 60.0, max(p.end_step for p in pods), pods, SignalCounts(), SignalCounts())


def pod(name: str, steps: int, first: int = 0, duty: float = 10.0, memory_gb: float = 1.0) -> PodUsage:
    return PodUsage(name, first, (duty,) * steps, (int(memory_gb * GB),) * steps)


def test_pods_spread_over_a_nodes_gpus_and_open_a_node_when_it_is_full() -> None:
    trace = trace_of(*(pod(f"p{i}", 2) for i in range(5)))
    replay = ReplicaReplay(trace, 10 * GB, replicas=2, gpus_per_node=2)
    first = next(replay.seatings())
    # p0, p1 on GPUs 0 and 1 (the fewest pods first), p2, p3 the second replicas, p4 a new node.
    assert [first[f"p{i}"].gpu for i in range(5)] == [0, 1, 0, 1, 2]
    assert first["p0"].limit_bytes is None  # time-slicing: no memory limit
    figures = measure(trace, 10 * GB, ReplicaReplay(trace, 10 * GB, replicas=2, gpus_per_node=2).seatings())
    assert figures.gpu_hours_saved_pct == 40.0  # 3 GPUs for 5 pods
    assert figures.evictions_per_pod_day == 0.0  # nothing moves


def test_a_leaving_pod_frees_its_replica_for_the_next() -> None:
    trace = trace_of(pod("a", 1), pod("b", 3), pod("c", 2, first=1))
    seatings = list(ReplicaReplay(trace, 10 * GB, replicas=2, gpus_per_node=1).seatings())
    assert seatings[1] == {"b": Seat(0), "c": Seat(0)}  # c takes the replica a left


def test_mps_gives_each_pod_its_share_of_memory_and_time_slicing_overflows() -> None:
    trace = trace_of(pod("a", 2, memory_gb=6), pod("b", 2, memory_gb=5))
    mps = measure(trace, 10 * GB, ReplicaReplay(trace, 10 * GB, 2, "mps", gpus_per_node=1).seatings())
    assert (mps.pod_minutes_over_limit_pct, mps.gpu_memory_overflow_minutes) == (50.0, 0.0)  # a over 5 GB
    sliced = measure(trace, 10 * GB, ReplicaReplay(trace, 10 * GB, 2, gpus_per_node=1).seatings())
    assert (sliced.pod_minutes_over_limit_pct, sliced.gpu_memory_overflow_minutes) == (0.0, 2.0)  # 11 GB on 10
    hot = trace_of(pod("a", 2, duty=60), pod("b", 2, duty=50))
    saturated = measure(hot, 10 * GB, ReplicaReplay(hot, 10 * GB, 2, gpus_per_node=1).seatings())
    assert saturated.saturated_gpu_minutes_pct == 100.0  # 110 % asked of one GPU at both steps


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 0}, "replicas must be at least 1, got 0"),
    ({"replicas": 2, "gpus_per_node": 0}, "gpus_per_node must be at least 1"),
    ({"replicas": 2, "sharing": "mig"}, "sharing must be one of time-slicing, mps, got 'mig'"),
])
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicaReplay(trace_of(pod("a", 1)), GB, **kwargs)  # type: ignore[arg-type]

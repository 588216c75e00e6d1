"""The live usage replay's pure parts (gpupack.replay.usage_live, usage_stack): names, the pods chosen,
the agents' mapping, where a Deployment's trace pod sits, the scaled settings and the verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupack.cli import load_usage_trace
from gpupack.replay.usage_live import (
    PENDING_GPU, backfill_pending, compare, deployment, deployment_name, first_pods, mapping_csv, seat_of,
    simulator_policy,
)
from gpupack.replay.usage_stack import required_nodes, scaled_periods
from gpupack.testing.usage_traces import GIB, write_usage_trace
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION, MEMORY_RESOURCE, MILLI_RESOURCE, SHARED_RESOURCE
from sharing.api.modes import AllocationMode
from sharing.simulator.usage_figures import Seat
from sharing.usage.playback import TracePlayer, parse_pod_mapping

NODES = ["gpu-000", "gpu-001", "gpu-002"]
GPU = 80 * GIB


def test_deployment_names_are_kubernetes_names() -> None:
    assert deployment_name("23b8eba99c14e73d454503a55ae96989") == "u-23b8eba99c14e73d454503a55ae96989"
    assert deployment_name("P_A.1") == "u-p-a-1"
    assert len(deployment_name("x" * 80)) == 40


def test_the_first_pods_by_first_sample_and_the_grid_cut_after_the_last(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {
        "b": [(1.0, GIB)] * 3, "a": [(1.0, GIB)] * 3, "late": [(1.0, GIB)] * 5}, first={"late": 4}))
    two = first_pods(trace, 2)
    assert [p.pod for p in two.pods] == ["a", "b"] and two.steps == 3
    assert first_pods(trace, None).steps == 9
    with pytest.raises(ValueError, match="at least 1"):
        first_pods(trace, 0)
    clash = load_usage_trace(write_usage_trace(tmp_path / "c", {"p.a": [(1.0, GIB)] * 2, "p_a": [(1.0, GIB)] * 2}))
    with pytest.raises(ValueError, match="would both be Deployment u-p-a"):
        first_pods(clash, None)


def test_the_agents_bind_every_pod_of_a_deployment_to_its_trace_pod(tmp_path: Path) -> None:
    trace = load_usage_trace(write_usage_trace(tmp_path / "t", {"a": [(1.0, GIB)] * 2, "b": [(1.0, GIB)] * 2}))
    mapping = parse_pod_mapping(mapping_csv(trace).splitlines(), "mapping")
    player = TracePlayer(trace, time_scale=60.0, start_s=0.0, pods=mapping)
    assert player.choose("gpupack-demo/u-b-5d8f7c9b4-x7k2p", []) == "b"
    assert player.choose("gpupack-demo/u-b-7c4d9f8b6-q9w8e", ["b"]) == "b"  # the replacement plays on


def test_a_deployment_asks_for_one_whole_gpu_and_rolls_out_make_before_break() -> None:
    body = deployment("a", 81559, "run")
    container = body["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {MILLI_RESOURCE: "1000", MEMORY_RESOURCE: "81559Mi"}
    assert body["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert body["spec"]["replicas"] == 1


def _pod(name: str, created: str, node: str | None, memory: int | None = None,
         deleting: bool = False, mode: AllocationMode = "mps") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created, "annotations": {}}
    if memory is not None:
        record = Allocation(mode=mode, gated=False, capacity_existed=True, policy="p", reason="r", containers=(
            ContainerAllocation("main", "containers", 100, memory, SHARED_RESOURCE),))
        meta["annotations"][ALLOCATION_ANNOTATION] = record.to_annotation()
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T18:00:09Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def test_a_trace_pod_sits_where_its_oldest_serving_pod_is() -> None:
    old = _pod("u-a-1-x", "2026-12-04T18:00:00Z", "gpu-000")
    new = _pod("u-a-2-y", "2026-12-04T18:00:05Z", "gpu-002", 20 * GIB)
    assert seat_of([new, old], NODES, GPU) == Seat(0, GPU)  # no record: a whole GPU
    assert seat_of([new, _pod("u-a-1-x", "2026-12-04T18:00:00Z", "gpu-000", deleting=True)], NODES, GPU) == Seat(
        2, 20 * GIB)
    assert seat_of([_pod("u-a-3-z", "2026-12-04T18:00:07Z", None)], NODES, GPU) is None  # pending
    # Admitted whole, sized to 47 GiB: it holds the GPU (no MPS limit), as the simulator seats it.
    whole = _pod("u-a-4-w", "2026-12-04T18:00:00Z", "gpu-001", 47 * GIB, mode="whole")
    assert seat_of([whole], NODES, GPU) == Seat(1, GPU)


def test_the_scaled_settings_and_the_nodes_a_replay_needs() -> None:
    periods = scaled_periods(60.0)
    assert (periods.publish_s, periods.recommend_s, periods.evictions_per_hour, periods.sample_s) == (5.0, 1.0, 60, 0.25)
    assert scaled_periods(90.0).evictions_per_hour == 60  # the policy's most
    assert required_nodes([(0, 10), (0, 5), (5, 12), (11, 20)]) == 2 + 2
    policy = simulator_policy("recreate")
    assert (policy.backend, policy.publish_every_s, policy.mode) == ("device-plugin", 300.0, "recreate")
    with pytest.raises(ValueError, match="mode"):
        simulator_policy("sometimes")


def test_the_verdict_is_on_gpu_hours_saved_within_two_points() -> None:
    figures = {"pods": 3, "gpu_hours_baseline": 9.0, "gpu_hours": 6.0, "gpu_hours_saved_pct": 33.3,
               "saturated_gpu_minutes_pct": 0.0, "gpu_memory_overflow_minutes": 0.0,
               "pod_minutes_over_limit_pct": 0.0, "evictions_per_pod_day": 4.0,
               "evictions_after_first_per_pod_day": 0.0}
    assert compare({**figures, "gpu_hours_saved_pct": 31.4}, figures)["agrees"] is True
    result = compare({**figures, "gpu_hours_saved_pct": 31.2, "evictions_per_pod_day": 2.0}, figures)
    assert result["agrees"] is False
    assert result["difference"]["gpu_hours_saved_pct"] == -2.1 and result["difference"]["evictions_per_pod_day"] == -2.0
    # against the mean of the simulator's draws with observation noise, when given
    drawn = compare({**figures, "gpu_hours_saved_pct": 31.2}, figures, {"gpu_hours_saved_pct": 32.0})
    assert drawn["agrees"] is True and drawn["agreement_gap"] == -0.8
    assert drawn["agreement_against"] == "simulator_draws.mean" and drawn["difference"]["gpu_hours_saved_pct"] == -2.1
    assert compare({**figures, "gpu_hours_saved_pct": 35.5}, figures, {"gpu_hours_saved_pct": 33.0})["agrees"] is False


def test_a_pending_pod_sits_where_its_first_pod_is_bound_and_its_binding_is_no_move() -> None:
    pending = Seat(PENDING_GPU + 3, None)
    filled = backfill_pending([{"a": pending, "b": Seat(0, GPU)}, {"a": Seat(2, GPU), "b": Seat(0, GPU)},
                               {"a": Seat(1, 20 * GIB), "b": Seat(0, GPU)}])
    assert [s["a"] for s in filled] == [Seat(2, GPU), Seat(2, GPU), Seat(1, 20 * GIB)]
    assert backfill_pending([{"never": pending}]) == [{"never": pending}]


def test_the_agents_sample_rate_is_read_per_trace_step() -> None:
    from gpupack.replay.usage_live import Observed

    observed = Observed()
    assert observed.samples_per_step() is None  # no pod read yet
    observed.sampled = {"a": (50, 100), "b": (100, 100)}
    assert observed.samples_per_step() == 0.75  # 150 samples over 200 steps: a quarter unobserved at least

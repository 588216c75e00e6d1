"""MIG variant: request-to-profile mapping, layout strategies and the event-driven replay."""

from __future__ import annotations

from collections import Counter

import pytest

from mig.catalog import get_model
from mig.geometry import fits
from sharing.packing.mig_layouts import (
    GpupackStrategy,
    GreedyStrategy,
    make_strategy,
    profile_for,
    static_layout,
    usable_layouts,
)
from sharing.packing.specs import PodSpec
from sharing.simulator.mig_replay import replay_mig

A100 = get_model("A100-80GB")


@pytest.mark.parametrize(
    ("milli", "profile"),
    [(50, "1g.10gb"), (120, "1g.10gb"), (140, "1g.20gb"), (160, "2g.20gb"), (320, "3g.40gb"), (470, "4g.40gb"), (810, "7g.80gb"), (1000, "7g.80gb")],
)
def test_requests_map_to_the_smallest_covering_profile(milli: int, profile: str) -> None:
    assert profile_for(A100, milli).name == profile


def test_static_layouts_fit_the_gpu() -> None:
    for which in ("balanced", "1g", "whole"):
        assert fits(A100, static_layout(A100, which)) is not None
    assert static_layout(A100, "1g") == ("1g.10gb",) * 7
    with pytest.raises(ValueError, match="choose balanced, 1g or whole"):
        static_layout(A100, "half")
    with pytest.raises(ValueError, match="choose one of static-balanced"):
        make_strategy("nos")


def test_usable_layouts_exclude_media_extensions_and_all_fit() -> None:
    layouts = usable_layouts(A100)
    assert layouts and all("+me" not in "".join(l) for l in layouts)
    assert all(fits(A100, l) is not None for l in layouts)


def test_greedy_supplies_missing_profiles_in_gpu_order() -> None:
    idle = [(0, ("7g.80gb",)), (1, ("7g.80gb",)), (2, ("7g.80gb",))]
    plan = GreedyStrategy().plan(A100, idle, {"3g.40gb": 2, "4g.40gb": 1}, {})
    assert [r.gpu for r in plan] == [0, 1]  # 3g+4g on GPU 0 covers two, then the last 3g
    supplied = Counter(p for r in plan for p in r.layout)
    assert supplied["3g.40gb"] >= 2 and supplied["4g.40gb"] >= 1


def test_gpupack_uses_fewest_reshapes_and_keeps_useful_spares() -> None:
    idle = [(0, ("7g.80gb",)), (1, ("7g.80gb",))]
    recent = {"1g.10gb": 5.0, "4g.40gb": 1.0}
    plan = GpupackStrategy().plan(A100, idle, {"4g.40gb": 1}, recent)
    assert len(plan) == 1
    layout = Counter(plan[0].layout)
    assert layout["4g.40gb"] == 1 and layout["1g.10gb"] == 3  # spares match the recent 1g demand


def pod(name: str, milli: int, count: int = 1) -> PodSpec:
    return PodSpec(name=name, cpu_milli=1000, memory_mib=1024, gpu_count=count, gpu_milli=milli)


def test_static_layout_never_places_what_it_cannot_hold() -> None:
    pods = [pod("a", 1000), pod("b", 100)]
    r = replay_mig(pods, [0, 0], [100, 100], A100, make_strategy("static-1g"), gpus=2, gpus_per_node=2)
    assert (r.placed, r.never_placed, r.reshapes) == (1, 1, 0)


def test_dynamic_strategies_reshape_idle_gpus_and_pods_wait_for_it() -> None:
    # Two 3g pods arrive on one GPU in the balanced layout (which has one 3g).
    pods = [pod("a", 300), pod("b", 300), pod("c", 1000)]
    for name in ("greedy", "gpupack"):
        r = replay_mig(
            pods, [0, 0, 10], [1000, 1000, 20], A100, make_strategy(name), gpus=2, gpus_per_node=2, reshape_delay_s=60
        )
        assert r.placed == 3 and r.never_placed == 0
        assert r.reshapes >= 1
        # a: no wait; b: waits for a reshape of the idle GPU (60 s) or a departure; c: 7g after reshape
        assert r.mean_wait_s > 0
    whole = replay_mig(pods, [0, 0, 10], [1000, 1000, 20], A100, make_strategy("static-whole"), gpus=2, gpus_per_node=2)
    assert whole.reshapes == 0 and whole.placed == 3


def test_allocation_is_the_time_average_of_running_compute() -> None:
    r = replay_mig([pod("a", 1000)], [0], [100], A100, make_strategy("static-whole"), gpus=2, gpus_per_node=2)
    assert r.allocation_percent == pytest.approx(50.0)  # one of two GPUs busy the whole span


def test_missing_times_are_rejected() -> None:
    with pytest.raises(ValueError, match="needs both"):
        replay_mig([pod("a", 500)], [None], [None], A100, make_strategy("greedy"))


def test_gpupack_starts_small_pods_on_larger_instances_only_while_there_is_slack() -> None:
    # 140 milli asks 1g.20gb, absent from the balanced layout; a free 2g.20gb covers it.
    pods = [pod("a", 140)]
    gp = replay_mig(pods, [0], [100], A100, make_strategy("gpupack"), gpus=8, gpus_per_node=8, reshape_delay_s=60)
    assert (gp.mean_wait_s, gp.reshapes) == (0.0, 0)
    greedy = replay_mig(pods, [0], [100], A100, make_strategy("greedy"), gpus=8, gpus_per_node=8, reshape_delay_s=60)
    assert (greedy.mean_wait_s, greedy.reshapes) == (60.0, 1)
    # No slack (one GPU, busy): the 1g.20gb pod waits for its own profile even though a 2g is free.
    busy = [pod("x", 100), pod("b", 140)]
    tight = replay_mig(busy, [0, 1], [1000, 50], A100, make_strategy("gpupack"), gpus=1, gpus_per_node=1, reshape_delay_s=60)
    assert tight.placed == 2 and tight.mean_wait_s > 0
